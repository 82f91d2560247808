// The second half of a split-k product (matmul_io.wgsl, SPLIT_K): each thread adds the parts
// of one output, y[token * y_stride + out_offset + c] = the sum over splits of
// partials[(split * m + token) * n + c], through the product's output (softcap, or with
// GEGLU_OUT the gated activation of rows 2c and 2c + 1).

struct Params {
    n: u32,
    m: u32,
    splits: u32,
    y_stride: u32,
    out_offset: u32,
    softcap: f32,
}

@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

fn part_sum(tok: u32, row: u32) -> f32 {
    var v = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        v += partials[(s * p.m + tok) * p.n + row];
    }
    return v;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
#if GEGLU_OUT
    let cols = p.n / 2u;
#else
    let cols = p.n;
#endif
    let i = (wg.x + wg.y * nwg.x) * 256u + li;
    if (i >= p.m * cols) {
        return;
    }
    let tok = i / cols;
    let c = i % cols;
#if GEGLU_OUT
    let v = gelu_tanh(part_sum(tok, 2u * c)) * part_sum(tok, 2u * c + 1u);
#else
    let v = softcapped(part_sum(tok, c), p.softcap);
#endif
    y[tok * p.y_stride + p.out_offset + c] = v;
}
