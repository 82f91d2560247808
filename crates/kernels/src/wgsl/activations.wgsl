// Output transforms shared by the kernels. tanh's argument is clamped: some drivers compute it
// as a ratio of exponentials that overflows for large inputs (and tanh(9) is 1 in f32).

// Gemma's tanh-approximate GELU.
fn gelu_tanh(v: f32) -> f32 {
    let inner = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    return 0.5 * v * (1.0 + tanh(clamp(inner, -9.0, 9.0)));
}

// The logit softcap c * tanh(v / c); none when c <= 0. A value that is not finite stays as
// it is (clamp would turn NaN into a number on some drivers), so a model computing NaN still
// shows it to the sampler.
fn softcapped(v: f32, c: f32) -> f32 {
    if (c > 0.0 && abs(v) <= 3.4e38) {
        return c * tanh(clamp(v / c, -9.0, 9.0));
    }
    return v;
}
