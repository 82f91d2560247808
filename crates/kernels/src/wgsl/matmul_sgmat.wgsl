// Y[m, out_offset + r] = sum_k W[r, k] * X[m, k] for many tokens on a browser's subgroup
// matrices (Dawn's `chromium_experimental_subgroup_matrix`, written in its dialect and passed
// through to it): the tiles of matmul.wgsl (64 tokens x 64 rows a workgroup, steps of 32
// values of k, the same epilogue), their products as f16 S x S fragments into f32
// accumulators instead of each thread's f32 FMAs, and each step's loads issued before the
// step before it multiplies (as matmul_coop.wgsl does), so that their latency hides behind
// those products rather than stalling the barrier. The adapter names S (8 on lavapipe, 16 on
// NVIDIA's; Apple's Metal offers no f16 products into f32) and its subgroups' size, SG
// lanes; the tile's (64 / S)^2 output fragments are shared out among the workgroup's
// 256 / SG subgroups, ACC each. After the last step the accumulators go through workgroup
// memory to matmul.wgsl's stores.
// Flags: SGMAT16 (S = 16, else 8); SG16 / SG32 (else 8 lanes); and matmul.wgsl's.

const TM: u32 = 64u;
const TN: u32 = 64u;
const KS: u32 = 32u;
// Row pitch of the f16 tiles: 8 halves of padding spread a fragment's rows over the banks.
const PITCH: u32 = KS + 8u;
#if SGMAT16
const S: u32 = 16u;
#else
const S: u32 = 8u;
#endif
#if SG32
const SG: u32 = 32u;
#else
#if SG16
const SG: u32 = 16u;
#else
const SG: u32 = 8u;
#endif
#endif
// Output fragments along the rows, and the accumulators of each subgroup: ACC fragments side
// by side in one row of fragments (the ACC of subgroup sg start at fragment sg * ACC), so a
// step loads each left fragment once for all of them.
const FR: u32 = TN / S;
const ACC: u32 = (TM / S) * FR * SG / 256u;
const_assert ACC >= 1u && ACC <= FR;

// Token-major inputs (the left operand, row-major) and row-major weights (the right operand
// W^T, column-major), both f16; then the outputs, token-major.
var<workgroup> xs: array<f16, TM * PITCH>;
var<workgroup> ws: array<f16, TN * PITCH>;
var<workgroup> stage: array<f32, TM * TN>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
) {
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
    var acc: array<subgroup_matrix_result<f32, S, S>, ACC>;
    // The subgroup's row of fragments (tokens) and its first fragment in that row (rows).
    let ft = (sg * ACC) / FR;
    let fr = (sg * ACC) % FR;
    // This thread's loading duties: weight row li of the tile (the first TN threads), and
    // 8 of the step's 64 x 32 inputs, element e = 256 t + li at token e / 32, value e % 32.
    let first = part * (p.k_part / 32u);
    let units = min((p.k + 31u) / 32u, first + p.k_part / 32u);
    var wraw = RawUnit();
    if (li < TN) {
        wraw = weight_raw(tt, n0 + li, first);
    }
    var xin: array<f32, 8>;
    for (var t = 0u; t < 8u; t++) {
        xin[t] = raw_input(tt, m0 + (t * 256u + li) / 32u, first, li % 32u);
    }
    for (var u = first; u < units; u++) {
        let wv = decode_unit(wraw, u);
        // Everyone is done reading the previous step's tiles.
        workgroupBarrier();
        // Past the row's end (float rows may end inside a unit) the unit holds the next row's
        // weights: zero, so that no f32 weight beyond f16's range turns into an infinity there
        // (times a zero input: NaN).
        if (li < TN) {
            for (var i = 0u; i < 8u; i++) {
                for (var c = 0u; c < 4u; c++) {
                    let inside = u * 32u + 4u * i + c < p.k;
                    ws[li * PITCH + 4u * i + c] = f16(select(0.0, wv[i][c], inside));
                }
            }
        }
        for (var t = 0u; t < 8u; t++) {
            let tok = (t * 256u + li) / 32u;
            xs[tok * PITCH + li % 32u] = f16(staged_input(xin[t], tt, m0 + tok, u, li % 32u));
        }
        workgroupBarrier();
        // The next step's loads, in flight during this step's products.
        if (u + 1u < units) {
            if (li < TN) {
                wraw = weight_raw(tt, n0 + li, u + 1u);
            }
            for (var t = 0u; t < 8u; t++) {
                xin[t] = raw_input(tt, m0 + (t * 256u + li) / 32u, u + 1u, li % 32u);
            }
        }
        for (var kk = 0u; kk < KS; kk += S) {
            let l = subgroupMatrixLoad<subgroup_matrix_left<f16, S, S>, row_major>(&xs, ft * S * PITCH + kk, PITCH);
            for (var a = 0u; a < ACC; a++) {
                let r = subgroupMatrixLoad<subgroup_matrix_right<f16, S, S>, col_major>(&ws, (fr + a) * S * PITCH + kk, PITCH);
                acc[a] = subgroupMatrixMultiplyAccumulate(l, r, acc[a]);
            }
        }
    }
    for (var a = 0u; a < ACC; a++) {
        subgroupMatrixStore<row_major>(&stage, ft * S * TN + (fr + a) * S, acc[a], TN);
    }
    workgroupBarrier();
    let tx = li % 16u;
    let ty = li / 16u;
    let yb = part * p.part_stride + p.out_offset;
    for (var i = 0u; i < 4u; i++) {
        let o = (ty * 4u + i) * TN + tx * 4u;
        let v = vec4<f32>(stage[o], stage[o + 1u], stage[o + 2u], stage[o + 3u]);
        store_outputs(tt, m0 + ty * 4u + i, n0 + tx * 4u, yb, v);
    }
}
