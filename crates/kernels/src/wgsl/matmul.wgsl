// Y[m, out_offset + r] = sum_k W[r, k] * X[m, k] for many tokens: each workgroup computes a
// 64-token x 64-row tile, 4 x 4 outputs per thread. Per step of 32 values of k, 64 threads
// dequantize one unit of a weight row each and all threads load the tokens' inputs; both
// tiles sit in workgroup memory k-major, so the inner loop reads two vec4s per 16 FMAs and
// each weight byte is read once per 64 tokens. GEGLU_OUT: rows are gate/up pairs and the
// output is their gated activation (one column per pair). Split over k (see matmul_io.wgsl),
// each part's sums go to its own slice of y, which matmul_parts.wgsl adds up.
// EXPERTS: a mixture-of-experts layer's products, grouped by expert (matmul_io.wgsl).

const TM: u32 = 64u;
const TN: u32 = 64u;

// [k][16 groups of 4]: xs[kk * 16 + g] holds tokens 4g..4g+3 at k = kk; ws likewise rows.
var<workgroup> xs: array<vec4<f32>, 512>;
var<workgroup> ws: array<vec4<f32>, 512>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = wg.x * TN;
    let m0 = wg.y * TM;
    let tt = tile_tokens(wg.z);
#if EXPERTS
    if (li == 0u) {
        tile_count = tt.count;
    }
    if (m0 >= workgroupUniformLoad(&tile_count)) {
        return;
    }
#endif
    let part = k_part_of(wg.z);
    let tx = li % 16u;
    let ty = li / 16u;
    var acc: array<vec4<f32>, 4>;
    // Scalar staging for the transposed stores: a thread owns one (row or token, k) column.
    var wcol: array<vec4<f32>, 8>;
    let units = min((p.k + 31u) / 32u, (part + 1u) * (p.k_part / 32u));
    for (var u = part * (p.k_part / 32u); u < units; u++) {
        if (li < TN) {
            wcol = weight_unit(tt, n0 + li, u);
        }
        // Everyone is done reading the previous step's tiles.
        workgroupBarrier();
        if (li < TN) {
            let g = li / 4u;
            let lane = li % 4u;
            for (var i = 0u; i < 8u; i++) {
                for (var c = 0u; c < 4u; c++) {
                    let kk = 4u * i + c;
                    ws[kk * 16u + g][lane] = wcol[i][c];
                }
            }
        }
        // Inputs: 64 tokens x 32 values, 8 per thread.
        for (var t = 0u; t < 8u; t++) {
            let e = t * 256u + li;
            let tok = e / 32u;
            let kk = e % 32u;
            let v = unit_input(tt, m0 + tok, u, kk);
            xs[kk * 16u + tok / 4u][tok % 4u] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            let a = xs[kk * 16u + ty];
            let b = ws[kk * 16u + tx];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
    }
    let yb = part * p.part_stride + p.out_offset;
    for (var i = 0u; i < 4u; i++) {
        store_outputs(tt, m0 + ty * 4u + i, n0 + tx * 4u, yb, acc[i]);
    }
}
