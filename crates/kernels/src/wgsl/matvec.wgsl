// y[m, out_offset + r] = sum_k W[r, k] * x[m, k] for the rows r of one weight tile: each
// group of TPR threads owns a row and strides over its 32-element units; tokens are grid.z.

struct Params {
    k: u32,
    n: u32,
    row_bytes: u32,
    out_offset: u32,
    m: u32,
    x_stride: u32,
    y_stride: u32,
    softcap: f32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;

fn wword(i: u32) -> u32 {
    return w[i];
}
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override TPR: u32 = 32u;

var<workgroup> partial: array<f32, 256>;

fn finish(v: f32) -> f32 {
    if (p.softcap > 0.0) {
        return p.softcap * tanh(clamp(v / p.softcap, -9.0, 9.0));
    }
    return v;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let group = wg.x + wg.y * nwg.x;
    let row = group * (256u / TPR) + li / TPR;
    let lane = li % TPR;
    let m = wg.z;
    var acc = 0.0;
    if (row < p.n) {
        let rb = row * p.row_bytes;
        let xb = m * (p.x_stride / 4u);
        for (var u = lane; u < p.k / 32u; u += TPR) {
            let q = load_unit(rb, u);
            let xo = xb + u * 8u;
            var s = 0.0;
            for (var i = 0u; i < 8u; i++) {
                s += dot(q[i], x[xo + i]);
            }
            acc += s;
        }
    }
    partial[li] = acc;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            partial[li] += partial[li + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < p.n) {
        y[m * p.y_stride + p.out_offset + row] = finish(partial[li]);
    }
}
