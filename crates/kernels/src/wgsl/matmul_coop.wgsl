// Y[m, out_offset + r] = sum_k W[r, k] * X[m, k] for many tokens on cooperative matrices
// (tensor cores): f16 inputs, f32 accumulators. A workgroup of eight 32-lane subgroups takes
// a 64-token x 128-row tile; subgroup s owns the 32 x 32 block at tokens 32 (s / 4), rows
// 32 (s % 4) as 2 x 2 accumulators of 16 x 16. Per step of 64 values of k, each thread
// dequantizes one 32-value unit of one weight row and converts 16 inputs, all into workgroup
// memory as f16; the next step's global loads are issued before this step's products, so
// their latency hides behind the tensor work.
// TOKENS_128: a 128-token x 128-row tile, subgroup s owning the 32 tokens x 64 rows at
// tokens 32 (s / 2), rows 64 (s % 2) as 2 x 4 accumulators: six fragment loads for eight
// products rather than four for four, and each weight converted once per 128 tokens. Faster
// where its tiles are enough to fill the device (matmul.rs's CoopTile).
// GEGLU_OUT: rows are gate/up pairs and the output is their gated activation (one column per
// pair).
// Split over k (see matmul_io.wgsl), each part's sums go to its own slice of y, which
// matmul_parts.wgsl adds up.
// EXPERTS: a mixture-of-experts layer's products, grouped by expert (matmul_io.wgsl).
// SMALL_TILES (with EXPERTS, for experts routed few tokens each): 16-token x 128-row tiles,
// subgroup s owning rows 16 s as one accumulator, so that a tile's step does a quarter of
// the input loads and products for the same weights.
// TOKENS_32 (with EXPERTS, for experts routed a few more): 32-token x 128-row tiles,
// subgroup s owning tokens 0-31 of rows 16 s as two accumulators: half the input loads and
// products of a 64-token tile's step.
// STEP_128 (with EXPERTS and SMALL_TILES or TOKENS_32, never split over k): steps of 128
// values of k (two units a thread), the 32-slot tile's subgroups staging their accumulators
// four at a time to stay within 48 KiB of workgroup memory. The barriers are most of these
// tiles' time and appear to wait for the loads in flight (benches/RESULTS.md, thirty-fifth
// and thirty-seventh sessions): the more a step loads, the more of their latency hides.

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;

#if SMALL_TILES
const TM: u32 = 16u;
// Row blocks per tile, their rows, the row fragments of each, and the accumulators of each
// subgroup.
const SN: u32 = 8u;
const BR: u32 = 16u;
const FB: u32 = 1u;
const ACCS: u32 = 1u;
#else
#if TOKENS_32
const TM: u32 = 32u;
const SN: u32 = 8u;
const BR: u32 = 16u;
const FB: u32 = 1u;
const ACCS: u32 = 2u;
#else
#if TOKENS_128
const TM: u32 = 128u;
const SN: u32 = 2u;
const BR: u32 = 64u;
const FB: u32 = 4u;
const ACCS: u32 = 8u;
#else
const TM: u32 = 64u;
const SN: u32 = 4u;
const BR: u32 = 32u;
const FB: u32 = 2u;
const ACCS: u32 = 4u;
#endif
#endif
#endif
const TN: u32 = 128u;
#if STEP_128
const KS: u32 = 128u;
#else
const KS: u32 = 64u;
#endif
// Subgroups whose accumulators the stage holds at a time.
#if STEP_128
#if TOKENS_32
const STAGED: u32 = 4u;
#else
const STAGED: u32 = 8u;
#endif
#else
const STAGED: u32 = 8u;
#endif
// Eight subgroups: each thread converts UPT 32-value units of the tile's weights a step,
// two lanes a row.
const THREADS: u32 = 256u;
const UPT: u32 = KS / 64u;
// Lanes loading each token's inputs, and the inputs each converts per step.
const LPT: u32 = THREADS / TM;
const XV: u32 = KS / LPT;
// Row pitch of the tiles in workgroup memory: 8 halves of padding spread the rows of a
// fragment load over the banks, and keep every fragment 16-byte aligned.
const PITCH: u32 = KS + 8u;

var<workgroup> xs: array<vec4<f16>, TM * PITCH / 4u>; // token-major: the A operand, row-major
var<workgroup> ws: array<vec4<f16>, TN * PITCH / 4u>; // row-major W: the B operand, column-major
var<workgroup> stage: array<f32, STAGED * 256u>; // a 16 x 16 accumulator per staged subgroup

// The weights this thread converts at step `s`: units 2 (UPT s + i) + h of row `row` of
// the tile's weights from row `w_row` (i < UPT: the two lanes of a row alternate), fetched
// (dtypes.wgsl's fetch_unit) a step before they are decoded (for the dtypes with a raw
// form; the others decode as they fetch); zero past the end.
fn w_unit(s: u32, h: u32, i: u32) -> u32 {
    return 2u * (UPT * s + i) + h;
}

fn w_valid(row: u32, u: u32) -> bool {
    return row < p.n && u * 32u < p.k;
}

fn fetch_w(w_row: u32, row: u32, s: u32, h: u32) -> array<RawUnit, UPT> {
    var r: array<RawUnit, UPT>;
    for (var i = 0u; i < UPT; i++) {
        let u = w_unit(s, h, i);
        if (w_valid(row, u)) {
            r[i] = fetch_unit((w_row + row) * p.row_bytes, u);
        }
    }
    return r;
}

fn decode_w(raw: array<RawUnit, UPT>, row: u32, s: u32, h: u32) -> array<vec4<f16>, 8u * UPT> {
    var r: array<vec4<f16>, 8u * UPT>;
    for (var i = 0u; i < UPT; i++) {
        let u = w_unit(s, h, i);
        if (w_valid(row, u)) {
            let v = decode_unit(raw[i], u);
            for (var j = 0u; j < 8u; j++) {
                r[8u * i + j] = vec4<f16>(v[j]);
            }
        }
    }
    return r;
}

// The XV inputs this thread converts at step `s` from input row `row` (none: `valid`
// false): vec4 q, q + LPT, ... of the step, so that the threads of a token read consecutive
// bytes at a time. Kept as loaded (clamped and converted to f16 when stored) so that
// nothing waits on the loads until then.
fn load_x(valid: bool, row: u32, s: u32, q: u32) -> array<vec4<f32>, XV / 4u> {
    var r: array<vec4<f32>, XV / 4u>;
    if (valid) {
        let b = (row * p.x_stride + s * KS) / 4u + q;
        for (var i = 0u; i < XV / 4u; i++) {
            // Past the row's end (float rows end at a multiple of 4): zero, so the weights
            // read there add nothing.
            if (s * KS + 4u * (q + LPT * i) < p.k) {
                r[i] = x[b + LPT * i];
            }
        }
    }
    return r;
}

// A staged accumulator's 16 tokens from `tok_f` x 16 rows from `row_f` (at `st`) to y.
fn store_staged(tt: Tokens, st: u32, tok_f: u32, row_f: u32, yb: u32, lane: u32) {
#if GEGLU_OUT
    // Rows 2c and 2c + 1 (adjacent in the stage) are gate and up of activation c.
    for (var e = 2u * lane; e < 256u; e += 64u) {
        let tok = tok_f + e / 16u;
        let row = row_f + e % 16u;
        if (tok < tt.count && row < p.n) {
            y[y_row(tt, tok) * p.y_stride + yb + row / 2u] = gelu_tanh(stage[st + e]) * stage[st + e + 1u];
        }
    }
#else
    for (var e = lane; e < 256u; e += 32u) {
        let tok = tok_f + e / 16u;
        let row = row_f + e % 16u;
        if (tok < tt.count && row < p.n) {
            y[y_row(tt, tok) * p.y_stride + yb + row] = output_value(stage[st + e]);
        }
    }
#endif
}

#if GELU_TIMES
// Where a staged accumulator's outputs go (NO_OUTPUT: nowhere) and the factors they take:
// loaded a fragment ahead of their stores, so that the loads wait behind the stores and
// barriers of the fragment before.
struct Factors {
    at: array<u32, 8>,
    v: array<f32, 8>,
}

fn gate_factors(tt: Tokens, tok_f: u32, row_f: u32, yb: u32, lane: u32) -> Factors {
    var fx = Factors();
    for (var i = 0u; i < 8u; i++) {
        let e = lane + 32u * i;
        let tok = tok_f + e / 16u;
        let row = row_f + e % 16u;
        fx.at[i] = NO_OUTPUT;
        if (tok < tt.count && row < p.n) {
            fx.at[i] = y_row(tt, tok) * p.y_stride + yb + row;
            fx.v[i] = by[fx.at[i]];
        }
    }
    return fx;
}

// A staged accumulator (at `st`) as gates times their factors.
fn store_gated(st: u32, lane: u32, fx: Factors) {
    for (var i = 0u; i < 8u; i++) {
        if (fx.at[i] != NO_OUTPUT) {
            y[fx.at[i]] = gelu_tanh(output_value(stage[st + lane + 32u * i])) * fx.v[i];
        }
    }
}
#endif

@compute @workgroup_size(THREADS)
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
    let sg = li / 32u;
    let a0 = (sg / SN) * 32u * PITCH;
    let b0 = (sg % SN) * BR * PITCH;
    // Loading duties: weight row wr, half wh of the step (the two halves of a row in adjacent
    // lanes, whose loads share their bytes); token xt, part xq of the step.
    let wr = li / 2u;
    let wh = li % 2u;
    let xt = li / LPT;
    let xq = li % LPT;
    let x_valid = m0 + xt < tt.count;
    var xr = 0u;
    if (x_valid) {
        xr = x_row(tt, m0 + xt);
    }
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
#if TOKENS_128
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
#endif
    let first = part * (p.k_part / KS);
    let steps = min((p.k + KS - 1u) / KS, first + p.k_part / KS);
    var wraw = fetch_w(tt.w_row, n0 + wr, first, wh);
    var xv = load_x(x_valid, xr, first, xq);
    for (var s = first; s < steps; s++) {
        let wv = decode_w(wraw, n0 + wr, s, wh);
        // Everyone is done with the previous step's tiles.
        workgroupBarrier();
        for (var i = 0u; i < UPT; i++) {
            let wo = (wr * PITCH + 32u * (2u * i + wh)) / 4u;
            for (var j = 0u; j < 8u; j++) {
                ws[wo + j] = wv[8u * i + j];
            }
        }
        let xo = xt * (PITCH / 4u) + xq;
        for (var i = 0u; i < XV / 4u; i++) {
            xs[xo + LPT * i] = vec4<f16>(input_vec(xv[i]));
        }
        workgroupBarrier();
        if (s + 1u < steps) {
            wraw = fetch_w(tt.w_row, n0 + wr, s + 1u, wh);
            xv = load_x(x_valid, xr, s + 1u, xq);
        }
        for (var kk = 0u; kk < KS; kk += 16u) {
#if SMALL_TILES
            let a = coopLoadT<coop_mat16x16<f16, A>>(&xs[kk / 4u], PITCH / 4u);
            let b = coopLoad<coop_mat16x16<f16, B>>(&ws[(b0 + kk) / 4u], PITCH / 4u);
            c00 = coopMultiplyAdd(a, b, c00);
#else
            let a_0 = coopLoadT<coop_mat16x16<f16, A>>(&xs[(a0 + kk) / 4u], PITCH / 4u);
            let a_1 = coopLoadT<coop_mat16x16<f16, A>>(&xs[(a0 + 16u * PITCH + kk) / 4u], PITCH / 4u);
            let b_0 = coopLoad<coop_mat16x16<f16, B>>(&ws[(b0 + kk) / 4u], PITCH / 4u);
            c00 = coopMultiplyAdd(a_0, b_0, c00);
            c10 = coopMultiplyAdd(a_1, b_0, c10);
#if !TOKENS_32
            let b_1 = coopLoad<coop_mat16x16<f16, B>>(&ws[(b0 + 16u * PITCH + kk) / 4u], PITCH / 4u);
            c01 = coopMultiplyAdd(a_0, b_1, c01);
            c11 = coopMultiplyAdd(a_1, b_1, c11);
#endif
#if TOKENS_128
            let b_2 = coopLoad<coop_mat16x16<f16, B>>(&ws[(b0 + 32u * PITCH + kk) / 4u], PITCH / 4u);
            let b_3 = coopLoad<coop_mat16x16<f16, B>>(&ws[(b0 + 48u * PITCH + kk) / 4u], PITCH / 4u);
            c02 = coopMultiplyAdd(a_0, b_2, c02);
            c03 = coopMultiplyAdd(a_0, b_3, c03);
            c12 = coopMultiplyAdd(a_1, b_2, c12);
            c13 = coopMultiplyAdd(a_1, b_3, c13);
#endif
#endif
        }
    }
    // Each accumulator goes through the subgroup's stage to bounds-checked, capped stores:
    // accumulator f holds tokens 16 (f / FB), rows 16 (f % FB) of the subgroup's block.
    // STAGED subgroups at a time, round r being subgroups STAGED r onwards.
    let lane = li % 32u;
    let yb = part * p.part_stride + p.out_offset;
    let tok0 = m0 + (sg / SN) * 32u;
    let row0 = n0 + (sg % SN) * BR;
    let st = (sg % STAGED) * 256u;
#if GELU_TIMES
    var fx = gate_factors(tt, tok0, row0, yb, lane);
#endif
    for (var f = 0u; f < ACCS; f++) {
        for (var r = 0u; r < 8u / STAGED; r++) {
            if (sg / STAGED == r) {
                switch f {
                    case 0u: { coopStoreT(c00, &stage[st], 16u); }
#if !TOKENS_32
                    case 1u: { coopStoreT(c01, &stage[st], 16u); }
#endif
#if TOKENS_128
                    case 2u: { coopStoreT(c02, &stage[st], 16u); }
                    case 3u: { coopStoreT(c03, &stage[st], 16u); }
                    case 4u: { coopStoreT(c10, &stage[st], 16u); }
                    case 5u: { coopStoreT(c11, &stage[st], 16u); }
                    case 6u: { coopStoreT(c12, &stage[st], 16u); }
                    default: { coopStoreT(c13, &stage[st], 16u); }
#else
#if TOKENS_32
                    default: { coopStoreT(c10, &stage[st], 16u); }
#else
                    case 2u: { coopStoreT(c10, &stage[st], 16u); }
                    default: { coopStoreT(c11, &stage[st], 16u); }
#endif
#endif
                }
            }
            workgroupBarrier();
            if (sg / STAGED == r) {
#if GELU_TIMES
                // Plain tiles only: every subgroup staged at once (one round a fragment).
                let now = fx;
                if (f + 1u < ACCS) {
                    let g = f + 1u;
                    fx = gate_factors(tt, tok0 + 16u * (g / FB), row0 + 16u * (g % FB), yb, lane);
                }
                store_gated(st, lane, now);
#else
                store_staged(tt, st, tok0 + 16u * (f / FB), row0 + 16u * (f % FB), yb, lane);
#endif
            }
            workgroupBarrier();
        }
    }
}
