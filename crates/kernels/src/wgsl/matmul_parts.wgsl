// The end of a product split over k (matmul.wgsl, matmul_coop.wgsl): y[t, out_offset + c] =
// softcap(sum over parts z of part[z * part_stride + t * n + c]), one thread per output;
// CLAMPED: then clamped to [out_min, out_max] (a clamped product's output clamp).

struct Params {
    m: u32,
    n: u32,
    parts: u32,
    part_stride: u32,
    y_stride: u32,
    out_offset: u32,
    softcap: f32,
    out_min: f32,
    out_max: f32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + li;
    if (i >= p.m * p.n) {
        return;
    }
    var s = 0.0;
    for (var z = 0u; z < p.parts; z++) {
        s += part[z * p.part_stride + i];
    }
#if CLAMPED
    let v = clamp(softcapped(s, p.softcap), p.out_min, p.out_max);
#else
    let v = softcapped(s, p.softcap);
#endif
    y[(i / p.n) * p.y_stride + p.out_offset + i % p.n] = v;
}
