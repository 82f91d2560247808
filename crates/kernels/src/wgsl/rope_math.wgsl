// The NeoX rotation of the pair ab = (dims i, i + n_rot / 2) at position pos, for every kernel
// that ropes (rope.wgsl, and head_math.wgsl's users). The kernel's Params name n_rot, base and
// freq_scale; FREQ_FACTORS binds `ff`.
fn rotated(ab: vec2<f32>, i: u32, pos: f32) -> vec2<f32> {
    var theta = pos * p.freq_scale * pow(p.base, -2.0 * f32(i) / f32(p.n_rot));
#if FREQ_FACTORS
    theta /= ff[i];
#endif
    let c = cos(theta);
    let s = sin(theta);
    return vec2<f32>(ab.x * c - ab.y * s, ab.x * s + ab.y * c);
}
