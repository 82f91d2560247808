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
    let c = cos(theta);
    let s = sin(theta);
    return vec2<f32>(ab.x * c - ab.y * s, ab.x * s + ab.y * c);
}
