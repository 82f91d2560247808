// The NeoX rotation of the pair ab = (dims i, i + n_rot / 2) at position pos, for every kernel
// that ropes (rope.wgsl, and head_math.wgsl's users). Its numbers come as a `Rope`; with
// FREQ_FACTORS the includer binds the frequency factors as `ff` (WGSL passes no storage
// buffer to a function).

struct Rope {
    n_rot: u32,
    base: f32,
    freq_scale: f32,
}

fn rotated(ab: vec2<f32>, i: u32, pos: f32, rope: Rope) -> vec2<f32> {
    var theta = pos * rope.freq_scale * pow(rope.base, -2.0 * f32(i) / f32(rope.n_rot));
#if FREQ_FACTORS
    theta /= ff[i];
#endif
    let cs = cos_sin(theta);
    return vec2<f32>(ab.x * cs.x - ab.y * cs.y, ab.x * cs.y + ab.y * cs.x);
}

// (cos x, sin x) for a rope's angles (positions times frequencies): within 1e-7 for |x| up
// to 2^14, 2e-6 up to 2^17 (a 128K context), checked against f64 in an f32 emulation. The
// built-ins need only be close within [-pi, pi] (Vulkan: 2^-11 absolute): SwiftShader's, which
// Chromium runs when there is no GPU, were off by 3e-4 at a rope's angles, which moved a
// DiffusionGemma step's logits by 1e-2 after a 150-token prompt. So: x less the nearest
// multiple k of pi / 2 in three parts (the first two of 8 and 10 bits: their products with k
// exact up to 2^14), then minimax polynomials on [-pi / 4, pi / 4] (Cephes' sinf and cosf)
// and the quadrant k mod 4.
fn cos_sin(x: f32) -> vec2<f32> {
    let k = round(x * 0.63661977236758134);
    let r = ((x - k * 1.5703125) - k * 4.837512969970703125e-4) - k * 7.54978995489188216e-8;
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    switch (i32(k) & 3) {
        case 0: { return vec2<f32>(c, s); }
        case 1: { return vec2<f32>(-s, c); }
        case 2: { return vec2<f32>(-c, -s); }
        default: { return vec2<f32>(s, -c); }
    }
}
