// attention.wgsl's attention on cooperative matrices (tensor cores), for many query rows and
// head dimensions of whole 64s up to 512 (Gemma's 256 and 512): f16 queries, keys, values
// and weights, f32 scores and outputs.
//
// One workgroup of eight 32-lane subgroups per (KV head, block of BQ rows), a row being one
// (token, query head) pair of the heads that share the KV head, token-major: each key and
// value is read once for all BQ rows rather than once per row (attention.wgsl shares them
// among at most eight). The keys are the union of the rows' ranges, in tiles of 64.
//
// The softmax is exact, in two passes over the keys rather than online: pass 1 finds each
// row's largest score and its sum of exp(score - largest); pass 2 computes the scores again,
// turns them into final weights and adds the weights times the values into the outputs.
// The outputs so never need rescaling, which cooperative matrices cannot do per row, and stay
// in them from the first tile to the last; the price is each score computed twice.
//
// A tile's scores: Q [BQ x D] times K^T [D x 64] over D in chunks of 64 values, each chunk
// of queries and keys converted to f16 in workgroup memory (as matmul_coop.wgsl's steps), the
// next chunk's loads issued before this one's products. Subgroup s holds the score
// accumulators of rows 16 (f / 4), keys 16 (f % 4) for f = s and (BQ 64) s + 8. Then the
// scores go through workgroup memory, where TPR threads a row read them (pass 1: maximum and
// sum; pass 2: the weights, written back as f16). In pass 2 the values follow 16 keys at a time,
// all D dimensions. Subgroup s owns the output blocks of rows 16 (s / SPR), columns
// 16 (s % SPR + SPR j) for j < NJ: eight accumulators for D = 256 (BQ 64) and 512 (BQ 32,
// HEAD_DIM_512), each the same accumulator from the first tile to the last.
//
// PARTS: workgroup z takes part z of the block's tiles of keys (the GPU's multiprocessors
// outnumber a short canvas's blocks), and `out` is scratch: each part's output over its own
// keys (normalised by its own sum) at rows z R.., R = m n_head, then per part and row the
// largest score and the sum, for attention_parts.wgsl to combine.

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Query heads per KV head, and chunks of 64 dimensions a head.
override G: u32 = 1u;
override DCH: u32 = 4u;

#if HEAD_DIM_512
const BQ: u32 = 32u;
// Row pitch (in f16) of 16 keys' values, all dimensions.
const VP: u32 = 520u;
#else
const BQ: u32 = 64u;
const VP: u32 = 264u;
#endif
const BK: u32 = 64u;
// f16 row pitch (8 halves of padding spread a fragment's rows over the banks and keep it
// 16-byte aligned), f32 row pitch of the scores.
const PITCH: u32 = 72u;
const SP: u32 = 68u;
// Threads a row of the softmax, and its keys each takes.
const TPR: u32 = 256u / BQ;
const KPT: u32 = BK / TPR;
// Subgroups a block of 16 rows, output blocks a subgroup.
const SPR: u32 = 8u / (BQ / 16u);
override NJ: u32 = DCH * 4u / SPR;
// vec4s of a chunk each thread loads: of the queries, of the keys.
const QV: u32 = BQ * 16u / 256u;
const KV: u32 = BK * 16u / 256u;
const MASKED: f32 = -3.0e38;

var<workgroup> qs: array<vec4<f16>, BQ * PITCH / 4u>;
// A chunk of the tile's keys; in pass 2 also 16 keys' values.
var<workgroup> ks: array<vec4<f16>, max(BK * PITCH, 16u * VP) / 4u>;
var<workgroup> ps: array<vec4<f16>, BQ * PITCH / 4u>;
// The tile's scores; at the end, each subgroup's outputs on their way out.
var<workgroup> ss: array<f32, BQ * SP>;
var<workgroup> row_keys: array<vec2<u32>, BQ>;
// The block's keys (.xy). Sixteen bytes, as every variable here: the driver may place
// workgroup variables in any order, and a fragment's rows must start on 16 bytes.
var<workgroup> span: vec4<u32>;

// Row v of the block's kernel: its token and query head.
fn row_token(v: u32) -> u32 {
    return v / G;
}

fn row_head(kvh: u32, v: u32) -> u32 {
    return kvh * G + v % G;
}

// This thread's share of chunk c of the queries of rows v0.. (zero past the last row).
fn fetch_q(v0: u32, kvh: u32, c: u32, li: u32) -> array<vec4<f32>, QV> {
    var r: array<vec4<f32>, QV>;
    for (var i = 0u; i < QV; i++) {
        let e = li + 256u * i;
        let v = v0 + e / 16u;
        if (v < p.m * G) {
            r[i] = q[(row_token(v) * p.q_stride + row_head(kvh, v) * p.head_dim + c * 64u) / 4u + e % 16u];
        }
    }
    return r;
}

// This thread's share of chunk c of the keys kb.. (zero past `hi`).
fn fetch_k(kb: u32, hi: u32, kvh: u32, c: u32, li: u32) -> array<vec4<f32>, KV> {
    var r: array<vec4<f32>, KV>;
    for (var i = 0u; i < KV; i++) {
        let e = li + 256u * i;
        let kp = kb + e / 16u;
        if (kp <= hi) {
            r[i] = kc[((kp * p.n_kv_head + kvh) * p.head_dim + c * 64u) / 4u + e % 16u];
        }
    }
    return r;
}

// This thread's share of the values of the 16 keys kb.. (zero past `hi`): vec4 li + 256 i of
// them, DCH (at most 8) a thread.
fn fetch_v(kb: u32, hi: u32, kvh: u32, li: u32) -> array<vec4<f32>, 8> {
    var r: array<vec4<f32>, 8>;
    for (var i = 0u; i < DCH; i++) {
        let e = li + 256u * i;
        let kp = kb + e / (16u * DCH);
        if (kp <= hi) {
            r[i] = vc[(kp * p.n_kv_head + kvh) * (p.head_dim / 4u) + e % (16u * DCH)];
        }
    }
    return r;
}

fn store_v(v: array<vec4<f32>, 8>, li: u32) {
    for (var i = 0u; i < DCH; i++) {
        let e = li + 256u * i;
        ks[(e / (16u * DCH)) * (VP / 4u) + e % (16u * DCH)] = vec4<f16>(v[i]);
    }
}

fn store_q(v: array<vec4<f32>, QV>, li: u32) {
    for (var i = 0u; i < QV; i++) {
        let e = li + 256u * i;
        qs[(e / 16u) * (PITCH / 4u) + e % 16u] = vec4<f16>(v[i]);
    }
}

fn store_k(v: array<vec4<f32>, KV>, li: u32) {
    for (var i = 0u; i < KV; i++) {
        let e = li + 256u * i;
        ks[(e / 16u) * (PITCH / 4u) + e % 16u] = vec4<f16>(v[i]);
    }
}

// The maximum and the sum of `x` over the TPR lanes of a row.
fn row_max(x: f32) -> f32 {
    var y = x;
    for (var o = 1u; o < TPR; o <<= 1u) {
        y = max(y, subgroupShuffleXor(y, o));
    }
    return y;
}

fn row_sum(x: f32) -> f32 {
    var y = x;
    for (var o = 1u; o < TPR; o <<= 1u) {
        y += subgroupShuffleXor(y, o);
    }
    return y;
}

// The block's keys: the union of its live rows' ranges (first > last: none), into `span`.
fn block_span(v0: u32, li: u32) {
    if (li < BQ) {
        var keys = vec2<u32>(1u, 0u);
        if (v0 + li < p.m * G) {
            keys = key_range(row_token(v0 + li));
        }
        row_keys[li] = keys;
    }
    workgroupBarrier();
    if (li == 0u) {
        var s = vec2<u32>(0xFFFFFFFFu, 0u);
        for (var r = 0u; r < BQ; r++) {
            let k = row_keys[r];
            if (k.x <= k.y) {
                s = vec2<u32>(min(s.x, k.x), max(s.y, k.y));
            }
        }
        span = vec4<u32>(s, 0u, 0u);
    }
}

// This thread's scores of a tile (keys kb + part KPT ..), scaled and capped, MASKED where its
// row does not see the key.
fn tile_scores(r: u32, part: u32, kb: u32, mine: vec2<u32>) -> array<f32, KPT> {
    var s: array<f32, KPT>;
    for (var i = 0u; i < KPT; i++) {
        let kp = kb + part * KPT + i;
        s[i] = MASKED;
        if (kp >= mine.x && kp <= mine.y) {
            s[i] = softcapped(ss[r * SP + part * KPT + i] * p.scale, p.softcap);
        }
    }
    return s;
}

// The raw scores of the tile at key kb into `ss` (every thread arrives: barriers).
fn scores_to_ss(v0: u32, kvh: u32, kb: u32, hi: u32, li: u32) {
    let sg = li / 32u;
    let sk = (sg % 4u) * 16u * PITCH / 4u;
    var s0 = coop_mat16x16<f32, C>();
    var s1 = coop_mat16x16<f32, C>();
    var pq = fetch_q(v0, kvh, 0u, li);
    var pk = fetch_k(kb, hi, kvh, 0u, li);
    for (var c = 0u; c < DCH; c++) {
        // Everyone is done with the previous chunk (or tile).
        workgroupBarrier();
        store_q(pq, li);
        store_k(pk, li);
        workgroupBarrier();
        if (c + 1u < DCH) {
            pq = fetch_q(v0, kvh, c + 1u, li);
            pk = fetch_k(kb, hi, kvh, c + 1u, li);
        }
        for (var kk = 0u; kk < 16u; kk += 4u) {
            let b = coopLoad<coop_mat16x16<f16, B>>(&ks[sk + kk], PITCH / 4u);
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&qs[(sg / 4u) * 16u * PITCH / 4u + kk], PITCH / 4u);
            s0 = coopMultiplyAdd(a0, b, s0);
#if !HEAD_DIM_512
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&qs[(sg / 4u + 2u) * 16u * PITCH / 4u + kk], PITCH / 4u);
            s1 = coopMultiplyAdd(a1, b, s1);
#endif
        }
    }
    coopStoreT(s0, &ss[(sg / 4u) * 16u * SP + (sg % 4u) * 16u], SP);
#if !HEAD_DIM_512
    coopStoreT(s1, &ss[(sg / 4u + 2u) * 16u * SP + (sg % 4u) * 16u], SP);
#endif
    workgroupBarrier();
}

// Row r's largest score and sum of exp(score - largest) over the keys `keys`: .x, .y.
fn row_stats(v0: u32, kvh: u32, keys: vec2<u32>, mine: vec2<u32>, li: u32) -> vec2<f32> {
    let r = li / TPR;
    let part = li % TPR;
    var top = MASKED;
    var total = 0.0;
    for (var kb = keys.x; kb <= keys.y; kb += BK) {
        scores_to_ss(v0, kvh, kb, keys.y, li);
        let s = tile_scores(r, part, kb, mine);
        var tile_top = MASKED;
        for (var i = 0u; i < KPT; i++) {
            tile_top = max(tile_top, s[i]);
        }
        let new_top = max(top, row_max(tile_top));
        var sum = 0.0;
        for (var i = 0u; i < KPT; i++) {
            if (s[i] > MASKED) {
                sum += exp(s[i] - new_top);
            }
        }
        total = total * exp(top - new_top) + row_sum(sum);
        top = new_top;
    }
    return vec2<f32>(top, total);
}

// Part z of `parts` of the tiles of `keys` (none: first > last).
fn part_keys(keys: vec2<u32>, z: u32, parts: u32) -> vec2<u32> {
    if (keys.x > keys.y) {
        return keys;
    }
    let tiles = (keys.y - keys.x) / BK + 1u;
    let per = (tiles + parts - 1u) / parts;
    if (z * per >= tiles) {
        return vec2<u32>(1u, 0u);
    }
    let lo = keys.x + z * per * BK;
    return vec2<u32>(lo, min(keys.y, lo + per * BK - 1u));
}

// Output row v's row in `out`: its own, or with PARTS that of part z in the scratch.
fn out_row(kvh: u32, v: u32, z: u32) -> u32 {
    return z * p.m * p.n_head + row_token(v) * p.n_head + row_head(kvh, v);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let kvh = wg.x;
    // The last block (the tokens with the most keys) first.
    let v0 = (nwg.y - 1u - wg.y) * BQ;
    block_span(v0, li);
#if PARTS
    let keys = part_keys(workgroupUniformLoad(&span).xy, wg.z, nwg.z);
#else
    let keys = workgroupUniformLoad(&span).xy;
#endif
    let sg = li / 32u;
    let lane = li % 32u;
    // The softmax: this thread's row and part of it.
    let r = li / TPR;
    let part = li % TPR;
    let mine = row_keys[r];
    let stats = row_stats(v0, kvh, keys, mine, li);
    let inv_total = select(0.0, 1.0 / stats.y, stats.y > 0.0);
#if PARTS
    if (part == 0u && v0 + r < p.m * G) {
        let at = nwg.z * p.m * p.n_head * p.head_dim + 2u * out_row(kvh, v0 + r, wg.z);
        out[at] = stats.x;
        out[at + 1u] = stats.y;
    }
#endif

    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    var o4 = coop_mat16x16<f32, C>();
    var o5 = coop_mat16x16<f32, C>();
    var o6 = coop_mat16x16<f32, C>();
    var o7 = coop_mat16x16<f32, C>();
    // This subgroup's output rows (in the weights), and its first column (in the values).
    let prow = (sg / SPR) * 16u * PITCH / 4u;
    let vcol = (sg % SPR) * 4u;
    for (var kb = keys.x; kb <= keys.y; kb += BK) {
        scores_to_ss(v0, kvh, kb, keys.y, li);
        let s = tile_scores(r, part, kb, mine);
        for (var i = 0u; i < KPT; i += 4u) {
            var w = vec4<f32>(0.0);
            for (var t = 0u; t < 4u; t++) {
                if (s[i + t] > MASKED) {
                    w[t] = exp(s[i + t] - stats.x) * inv_total;
                }
            }
            ps[r * (PITCH / 4u) + (part * KPT + i) / 4u] = vec4<f16>(w);
        }
        var pv = fetch_v(kb, keys.y, kvh, li);
        for (var kk = 0u; kk < 4u; kk++) {
            // Everyone is done with the previous keys (and the weights are complete).
            workgroupBarrier();
            store_v(pv, li);
            workgroupBarrier();
            if (kk < 3u) {
                pv = fetch_v(kb + 16u * (kk + 1u), keys.y, kvh, li);
            }
            let a = coopLoadT<coop_mat16x16<f16, A>>(&ps[prow + kk * 4u], PITCH / 4u);
            o0 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol], VP / 4u), o0);
            o1 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol + 4u * SPR], VP / 4u), o1);
            if (NJ > 2u) {
                o2 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol + 8u * SPR], VP / 4u), o2);
                o3 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol + 12u * SPR], VP / 4u), o3);
            }
            if (NJ > 4u) {
                o4 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol + 16u * SPR], VP / 4u), o4);
                o5 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol + 20u * SPR], VP / 4u), o5);
                o6 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol + 24u * SPR], VP / 4u), o6);
                o7 = coopMultiplyAdd(a, coopLoadT<coop_mat16x16<f16, B>>(&ks[vcol + 28u * SPR], VP / 4u), o7);
            }
        }
    }
    // Each output block through the subgroup's part of `ss` to its rows (the weights were
    // final: nothing left to divide).
    for (var j = 0u; j < NJ; j++) {
        workgroupBarrier();
        switch j {
            case 0u: { coopStoreT(o0, &ss[sg * 256u], 16u); }
            case 1u: { coopStoreT(o1, &ss[sg * 256u], 16u); }
            case 2u: { coopStoreT(o2, &ss[sg * 256u], 16u); }
            case 3u: { coopStoreT(o3, &ss[sg * 256u], 16u); }
            case 4u: { coopStoreT(o4, &ss[sg * 256u], 16u); }
            case 5u: { coopStoreT(o5, &ss[sg * 256u], 16u); }
            case 6u: { coopStoreT(o6, &ss[sg * 256u], 16u); }
            default: { coopStoreT(o7, &ss[sg * 256u], 16u); }
        }
        workgroupBarrier();
        let col0 = 16u * (sg % SPR + SPR * j);
        for (var e = lane; e < 256u; e += 32u) {
            let v = v0 + (sg / SPR) * 16u + e / 16u;
            if (v < p.m * G) {
                out[out_row(kvh, v, wg.z) * p.head_dim + col0 + e % 16u] = ss[sg * 256u + e];
            }
        }
    }
}
