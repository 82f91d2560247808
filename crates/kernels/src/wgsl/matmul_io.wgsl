// The parameters and bindings both prefill product kernels share (each binds its input x,
// binding 1, in the width it loads).
//
// SPLIT_K: workgroup z takes values [z * k_split, (z + 1) * k_split) of k and writes its raw
// sums to y[(z * m + token) * n + row] (a partials buffer); matmul_reduce.wgsl adds the parts
// and applies the output. Products with too few tiles to fill the GPU use it.

struct Params {
    k: u32,
    n: u32,
    row_bytes: u32,
    out_offset: u32,
    m: u32,
    x_stride: u32,
    y_stride: u32,
    softcap: f32,
    k_split: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;

fn wword(i: u32) -> u32 {
    return w[i];
}

@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
