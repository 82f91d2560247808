// The parameters and bindings both prefill product kernels share (each binds its input x,
// binding 1, in the width it loads).

struct Params {
    k: u32,
    n: u32,
    row_bytes: u32,
    out_offset: u32,
    m: u32,
    x_stride: u32,
    y_stride: u32,
    softcap: f32,
    // Split over k (wg.z is the part): each workgroup sums k_part values of k from
    // wg.z * k_part, into y from wg.z * part_stride (a multiple of 64; the whole row and 0
    // when the product is not split).
    k_part: u32,
    part_stride: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;

fn wword(i: u32) -> u32 {
    return w[i];
}

@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
