// The end of a prefill attention split over its keys (attention_coop.wgsl's PARTS): output
// (row, c) = sum over parts z of w_z o_z(row, c) / sum of w_z, where part z's output o_z is
// normalised by its own sum l_z and w_z = l_z exp(m_z - m) weighs it by its share of the
// row's whole sum (m_z its largest score, m the largest over the parts; a part that saw no key
// weighs nothing). One thread per output.

struct Params {
    rows: u32,
    head_dim: u32,
    parts: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + li;
    if (i >= p.rows * p.head_dim) {
        return;
    }
    let row = i / p.head_dim;
    let stats = p.parts * p.rows * p.head_dim;
    var top = -3.0e38;
    for (var z = 0u; z < p.parts; z++) {
        if (part[stats + 2u * (z * p.rows + row) + 1u] > 0.0) {
            top = max(top, part[stats + 2u * (z * p.rows + row)]);
        }
    }
    var num = 0.0;
    var den = 0.0;
    for (var z = 0u; z < p.parts; z++) {
        let at = stats + 2u * (z * p.rows + row);
        let l = part[at + 1u];
        if (l > 0.0) {
            let w = l * exp(part[at] - top);
            num += w * part[z * p.rows * p.head_dim + i];
            den += w;
        }
    }
    out[i] = select(0.0, num / den, den > 0.0);
}
