// Rotary embedding with position axes, in place on x[t, heads, head_dim] (any layout): the
// head splits into `axes` equal sections, section a rotated by the token's position on axis a
// (positions[t * axes + a]; one axis is plain 1-D rope, two are the vision tower's column and row).
// In each section the first n_rot dimensions rotate in pairs (i, i + n_rot / 2), or (2i, 2i+1)
// with INTERLEAVED, by pos * freq_scale * base^(-2i / n_rot) (divided by ff[i] with
// FREQ_FACTORS). One thread per pair.

struct Params {
    pairs: u32,
    heads: u32,
    head_dim: u32,
    axes: u32,
    n_rot: u32,
    x0: u32,
    x1: u32,
    x2: u32,
    x_at: u32,
    base: f32,
    freq_scale: f32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;
#if FREQ_FACTORS
@group(0) @binding(3) var<storage, read> ff: array<f32>;
#endif

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 256u;
    if (id >= p.pairs) {
        return;
    }
    let half = p.n_rot / 2u;
    let i = id % half;
    let a = (id / half) % p.axes;
    let h = (id / (half * p.axes)) % p.heads;
    let t = id / (half * p.axes * p.heads);
    var theta = f32(positions[t * p.axes + a]) * p.freq_scale * pow(p.base, -2.0 * f32(i) / f32(p.n_rot));
#if FREQ_FACTORS
    theta /= ff[i];
#endif
    let section = a * (p.head_dim / p.axes);
#if INTERLEAVED
    let d0 = section + 2u * i;
    let d1 = d0 + 1u;
#else
    let d0 = section + i;
    let d1 = d0 + half;
#endif
    let row = p.x_at + t * p.x0 + h * p.x1;
    let o0 = row + d0 * p.x2;
    let o1 = row + d1 * p.x2;
    let cs = cos_sin(theta);
    let c = cs.x;
    let s = cs.y;
    let x0v = x[o0];
    let x1v = x[o1];
    x[o0] = x0v * c - x1v * s;
    x[o1] = x0v * s + x1v * c;
}
