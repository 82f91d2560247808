// The activation a general op applies, chosen by one flag (none: identity). `lo` and `hi`
// are CLAMP's bounds; SCALE multiplies by `lo`; AFFINE multiplies by `lo` and adds `hi`.

// erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7): WGSL has no erf.
fn erf_approx(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - poly * exp(-a * a));
}

fn activation(v: f32, lo: f32, hi: f32) -> f32 {
    var r = v;
#if GELU_TANH
    r = gelu_tanh(v);
#endif
#if GELU_ERF
    r = 0.5 * v * (1.0 + erf_approx(v * 0.7071067811865476));
#endif
#if QUICK_GELU
    r = v / (1.0 + exp(-1.702 * v));
#endif
#if SILU
    r = v / (1.0 + exp(-v));
#endif
#if RELU
    r = max(v, 0.0);
#endif
#if SIGMOID
    r = 1.0 / (1.0 + exp(-v));
#endif
#if CLAMP
    r = clamp(v, lo, hi);
#endif
#if SCALE
    r = v * lo;
#endif
#if AFFINE
    r = v * lo + hi;
#endif
    return r;
}
