// Y[m, out_offset + r] = sum_k W[r, k] * X[m, k] for many tokens: each workgroup computes a
// 32-token x 64-row tile, dequantizing one 32-element unit of 64 weight rows into workgroup
// memory per step, so each weight byte is read once per 32 tokens.

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
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const TM: u32 = 32u;
const TN: u32 = 64u;
const WS: u32 = 33u;

var<workgroup> xs: array<f32, 1024>;
var<workgroup> ws: array<f32, 2112>;

fn finish(v: f32) -> f32 {
    if (p.softcap > 0.0) {
        return p.softcap * tanh(clamp(v / p.softcap, -9.0, 9.0));
    }
    return v;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = wg.x * TN;
    let m0 = wg.y * TM;
    let tx = li % 16u;
    let ty = li / 16u;
    var acc: array<f32, 8>;
    for (var u = 0u; u < p.k / 32u; u++) {
        if (li < TN) {
            let row = n0 + li;
            if (row < p.n) {
                let q = load_unit(row * p.row_bytes, u);
                for (var i = 0u; i < 8u; i++) {
                    let b = li * WS + 4u * i;
                    ws[b] = q[i].x;
                    ws[b + 1u] = q[i].y;
                    ws[b + 2u] = q[i].z;
                    ws[b + 3u] = q[i].w;
                }
            } else {
                for (var i = 0u; i < 32u; i++) {
                    ws[li * WS + i] = 0.0;
                }
            }
        }
        for (var t = 0u; t < 4u; t++) {
            let e = li * 4u + t;
            let tok = m0 + e / 32u;
            var v = 0.0;
            if (tok < p.m) {
                v = x[tok * p.x_stride + u * 32u + e % 32u];
            }
            xs[e] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            let a0 = xs[(ty * 2u) * 32u + kk];
            let a1 = xs[(ty * 2u + 1u) * 32u + kk];
            for (var j = 0u; j < 4u; j++) {
                let b = ws[(tx + 16u * j) * WS + kk];
                acc[j] += a0 * b;
                acc[4u + j] += a1 * b;
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 2u; i++) {
        let tok = m0 + ty * 2u + i;
        for (var j = 0u; j < 4u; j++) {
            let row = n0 + tx + 16u * j;
            if (tok < p.m && row < p.n) {
                y[tok * p.y_stride + p.out_offset + row] = finish(acc[i * 4u + j]);
            }
        }
    }
}
