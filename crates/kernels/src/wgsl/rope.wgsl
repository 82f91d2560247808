// NeoX rotary embedding in place on rows of [tokens, heads, head_dim]: pairs (i, i + n_rot/2)
// for i < n_rot/2 rotate by pos * freq_scale * base^(-2i/n_rot) / ff[i]; the dims past n_rot
// stay. One workgroup per row.

struct Params {
    heads: u32,
    head_dim: u32,
    n_rot: u32,
    rows: u32,
    base: f32,
    freq_scale: f32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;
#if FREQ_FACTORS
@group(0) @binding(3) var<storage, read> ff: array<f32>;
#endif

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let pos = f32(positions[row / p.heads]);
    let hr = p.n_rot / 2u;
    let ro = row * p.head_dim;
    for (var i = li; i < hr; i += 64u) {
        let r = rotated(vec2<f32>(x[ro + i], x[ro + i + hr]), i, pos, Rope(p.n_rot, p.base, p.freq_scale));
        x[ro + i] = r.x;
        x[ro + i + hr] = r.y;
    }
}
