// out[m, :] = W[ids[m] - first_row, :] * scale for the tokens whose id falls in this weight
// tile: rows are dequantized on the GPU, each token's in workgroups of 64 threads, one per
// 32-value unit (grid.z: long rows take several workgroups). ADD: out[m, :] += that.

struct Params {
    k: u32,
    row_bytes: u32,
    first_row: u32,
    rows: u32,
    m: u32,
    scale: f32,
}

// Binding 0, the weights: bytes.wgsl.
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let m = wg.x + wg.y * nwg.x;
    if (m >= p.m) {
        return;
    }
    let id = ids[m];
    if (id < p.first_row || id - p.first_row >= p.rows) {
        return;
    }
    let rb = (id - p.first_row) * p.row_bytes;
    let ob = m * (p.k / 4u);
    // Float rows may end inside their last unit (a multiple of 4 values).
    for (var u = wg.z * 64u + li; u < (p.k + 31u) / 32u; u += 64u * nwg.z) {
        let q = load_unit(rb, u);
        for (var i = 0u; i < 8u; i++) {
            if (u * 8u + i < p.k / 4u) {
#if ADD
                out[ob + u * 8u + i] += q[i] * p.scale;
#else
                out[ob + u * 8u + i] = q[i] * p.scale;
#endif
            }
        }
    }
}
