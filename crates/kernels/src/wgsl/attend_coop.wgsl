// attend_tiled.wgsl's attention on cooperative matrices (tensor cores): f16 queries, keys,
// values and weights, f32 scores, sums and outputs. One workgroup of eight 32-lane subgroups
// per (block of 128 queries, head) (BLOCK_64: four, 64 queries); subgroup s owns query rows
// 16 s .. 16 s + 15 from the first key to the last, so that only the key and value tiles
// are shared: one workgroup barrier a tile of 32 keys, double-buffered, the next tile
// fetched into registers while this one is used. Per tile, each subgroup on its own:
//   1. scores its 16 rows against the tile's 32 keys (its query fragments held since the
//      start) into its own part of `sc` (f32);
//   2. two lanes a row read the row's scores (subgroup barrier), mask and softcap them, and
//      write the weights exp(score - m) as f16 to its part of `pw`;
//   3. multiplies the weights by the tile's values into its output fragments (subgroup
//      barrier before), which stay in cooperative matrices from the first tile to the last.
// The outputs cannot be rescaled per row inside a cooperative matrix, so a row's reference m
// moves only when a tile's largest score passes it by more than TAU: weights stay at most
// e^TAU (well inside f16), and a subgroup with such a row passes its outputs through `sc`
// once to rescale them — a few times a row at most, where the online softmax would rescale
// every tile. Head dimensions up to DP (64, or 80 with HEAD_DIM_80), padded with zeros.
//
// The subgroup barriers must order workgroup memory: naga's SPIR-V backend is patched so
// that they do (vendor/naga/PATCHED.md).
//
// KV_VEC4: keys and values read four at a time (contiguous heads on whole vec4s). QKV_F16:
// queries, keys and values are half floats already (half the bytes to read).

#if HEAD_DIM_80
const DP: u32 = 80u;
// Unpadded score rows keep the kernel within 48 KiB of workgroup memory.
const SP: u32 = 32u;
#else
const DP: u32 = 64u;
const SP: u32 = 36u;
#endif
// BLOCK_64: four subgroups (64 query rows) a workgroup.
#if BLOCK_64
const WG: u32 = 128u;
#else
const WG: u32 = 256u;
#endif
// Subgroups a workgroup, each 16 query rows.
const NSG: u32 = WG / 32u;
const BQ: u32 = 16u * NSG;
const BK: u32 = 32u;
// Pitches (in elements) of the f16 query/key/value rows and of the f16 weight rows: padded
// so that a fragment's rows fall on different banks while every fragment stays 16-byte
// aligned.
const QP: u32 = DP + 8u;
const PP: u32 = BK + 8u;
// vec4s of one buffer of keys (or values) in `kv`; of a tile's real elements; loads a thread.
const TS: u32 = BK * QP / 4u;
const TILE4: u32 = BK * DP / 4u;
const LOADS: u32 = (TILE4 + WG - 1u) / WG;
// How far a tile's largest score may pass a row's reference before the row is rescaled
// (natural log: weights up to e^8, about 2981).
const TAU: f32 = 8.0;

// Two buffers of a tile's keys then values (buffer b: keys at 2 b TS, values at (2 b + 1) TS);
// before the first tile, the block's queries (BQ rows of QP: the same size).
var<workgroup> kv: array<vec4<f16>, 4u * TS>;
// Each subgroup's 16 rows of scores (then, when rescaling or at the end, of outputs), SP
// floats a row held four to an element: a lane reads its half of a row as four 16-byte loads,
// which fall on different banks across the subgroup (single floats at this pitch would fall
// on 8 of the 32 banks).
const S4: u32 = SP / 4u;
var<workgroup> sc: array<vec4<f32>, NSG * 16u * S4>;
// Each subgroup's 16 rows of weights.
var<workgroup> pw: array<vec4<f16>, NSG * 16u * PP / 4u>;

// Whether a query at `qp` sees every key of [a, b] given it sees the ends: masks whose
// visible keys are an interval (the others check each key).
fn interval_visible(qp: u32, a: u32, b: u32) -> bool {
#if FULL|CAUSAL|LOCAL
    return visible(qp, a) && visible(qp, b);
#else
    return false;
#endif
}

// Whether tiles that a row sees whole skip the per-key mask (`WGEMMA_ATTEND_WHOLE_TILES=1`:
// not yet timed on a GPU, so off by default).
override WHOLE_TILES: bool = false;
// Whether the next tile's keys and values are loaded into registers while this tile is used
// (off, `WGEMMA_ATTEND_NO_PREFETCH=1`: loaded right before they are stored, which frees those
// registers), and whether a lane reads its scores twice, for the tile's maximum and then for
// the weights, rather than holding all 16 (`WGEMMA_ATTEND_TWO_PASS=1`). Both trade latency for
// registers, to find whether registers bound how many workgroups run at once.
override PREFETCH_TILES: bool = true;
override TWO_PASS_SCORES: bool = false;
// Whether the next tile's scores are made before this tile's weights (`WGEMMA_ATTEND_K_AHEAD=1`),
// their products overlapping the softmax: the keys are stored a tile ahead of the values, in
// the same buffers.
override K_AHEAD: bool = false;

// Which tensor `at` reads.
const OF_Q: u32 = 0u;
const OF_K: u32 = 1u;
const OF_V: u32 = 2u;

// Element c of row `row` (zero past the head) of q, k or v.
fn at(which: u32, row: u32, head: u32, c: u32) -> f32 {
    if (c >= p.d) {
        return 0.0;
    }
    switch which {
        case OF_Q: { return f32(q[p.q_at + row * p.q0 + head * p.q1 + c * p.q2]); }
#if !KV_VEC4
        case OF_K: { return f32(k[p.k_at + row * p.k0 + head * p.k1 + c * p.k2]); }
        default: { return f32(v[p.v_at + row * p.v0 + head * p.v1 + c * p.v2]); }
#else
        default: { return 0.0; }
#endif
    }
}

// Elements 4 c4 .. 4 c4 + 3 of row `row` of q, k or v.
fn row4(which: u32, row: u32, head: u32, c4: u32) -> vec4<f32> {
    let c = 4u * c4;
    return vec4<f32>(
        at(which, row, head, c),
        at(which, row, head, c + 1u),
        at(which, row, head, c + 2u),
        at(which, row, head, c + 3u),
    );
}

// The same of k or v, in their own element type.
fn kv4(which: u32, row: u32, head: u32, c4: u32) -> vec4<Elem> {
#if KV_VEC4
    if (4u * c4 >= p.d) {
        return vec4<Elem>();
    }
    if (which == OF_K) {
        return k[(p.k_at + row * p.k0 + head * p.k1) / 4u + c4];
    }
    return v[(p.v_at + row * p.v0 + head * p.v1) / 4u + c4];
#else
    return vec4<Elem>(row4(which, row, head, c4));
#endif
}

// A thread's share of a tile's keys and values (zero past the `n` keys of the tile), kept as
// loaded (converted to f16 when stored) so that nothing waits on the loads until then.
struct TileLoad {
    k: array<vec4<Elem>, LOADS>,
    v: array<vec4<Elem>, LOADS>,
}

// A thread's share of rows kb .. kb + n - 1 of the keys or values.
fn fetch_rows(which: u32, kb: u32, n: u32, kvh: u32, li: u32) -> array<vec4<Elem>, LOADS> {
    var t: array<vec4<Elem>, LOADS>;
    for (var i = 0u; i < LOADS; i++) {
        let e = li + WG * i;
        let j = e / (DP / 4u);
        if (e < TILE4 && j < n) {
            t[i] = kv4(which, kb + j, kvh, e % (DP / 4u));
        }
    }
    return t;
}

// The keys of the tile at `kk` (`nk` of them) and the values of the tile at `vk` (`nv`): the
// same tile, or with K_AHEAD the keys a tile later.
fn fetch_tile(kk: u32, nk: u32, vk: u32, nv: u32, kvh: u32, li: u32) -> TileLoad {
    return TileLoad(fetch_rows(OF_K, kk, nk, kvh, li), fetch_rows(OF_V, vk, nv, kvh, li));
}

// Rows fetched by `fetch_rows` into `kv` from `base` (vec4s); rows past the tile's keys are
// stored as the zeros fetched: the values of keys past the end must be zero, as their
// weights are, since zero times whatever was there could be NaN.
fn store_rows(t: array<vec4<Elem>, LOADS>, base: u32, li: u32) {
    for (var i = 0u; i < LOADS; i++) {
        let e = li + WG * i;
        if (e < TILE4) {
            kv[base + (e / (DP / 4u)) * (QP / 4u) + e % (DP / 4u)] = vec4<f16>(t[i]);
        }
    }
}

// The first tile's keys and values into buffer 0 (K_AHEAD: the second tile's keys into
// buffer 1), once every subgroup has its query fragments.
fn stage_first_tiles(range: vec2<u32>, kvh: u32, li: u32) {
    let n0 = min(BK, range.y - range.x);
    let t = fetch_tile(range.x, n0, range.x, n0, kvh, li);
    workgroupBarrier();
    store_rows(t.k, 0u, li);
    store_rows(t.v, TS, li);
    if (K_AHEAD && range.x + BK < range.y) {
        let k1 = fetch_rows(OF_K, range.x + BK, min(BK, range.y - range.x - BK), kvh, li);
        store_rows(k1, 2u * TS, li);
    }
}

// Output fragment `c` of subgroup `sg` into the subgroup's part of `sc` (once every lane is
// done with what was there); where this lane's eight values of its row start (two elements).
fn spill(c: coop_mat16x16<f32, C>, sg: u32, lane: u32) -> u32 {
    let base = sg * 16u * S4;
    subgroupBarrier();
    coopStoreT(c, &sc[base], S4);
    subgroupBarrier();
    return base + (lane / 2u) * S4 + (lane % 2u) * 2u;
}

// Output fragment `c` of subgroup `sg` with each row scaled by its lane pair's `scale`.
fn rescaled(c: coop_mat16x16<f32, C>, sg: u32, lane: u32, scale: f32) -> coop_mat16x16<f32, C> {
    let at = spill(c, sg, lane);
    sc[at] *= scale;
    sc[at + 1u] *= scale;
    subgroupBarrier();
    return coopLoadT<coop_mat16x16<f32, C>>(&sc[sg * 16u * S4], S4);
}

// Columns col0.. of the rows of output fragment `c` of subgroup `sg`, times `scale`, to `o`.
fn emit(c: coop_mat16x16<f32, C>, sg: u32, lane: u32, col0: u32, scale: f32, ob: u32, live: bool) {
    let at = spill(c, sg, lane);
    for (var i = 0u; i < 8u; i++) {
        let col = col0 + (lane % 2u) * 8u + i;
        if (live && col < p.d) {
            o[ob + col * p.o2] = sc[at + i / 4u][i % 4u] * scale;
        }
    }
}

// A lane's half of its row in one tile: where its scores start in `sc` (vec4s), the tile's
// first key and key count, the half's first key of the tile, whether the row sees the whole
// tile, whether the row is a query, its position and the keys it can see at most.
struct TileRow {
    at: u32,
    kb: u32,
    n: u32,
    first: u32,
    whole: bool,
    live: bool,
    qp: u32,
    mine: vec2<u32>,
}

// Scores 4 g .. 4 g + 3 of the lane's half row: scaled, softcapped, MASKED where unseen.
fn scores4(r: TileRow, g: u32) -> vec4<f32> {
    var x = sc[r.at + g] * p.scale;
    if (p.softcap > 0.0) {
        x = p.softcap * tanh(clamp(x / p.softcap, vec4<f32>(-9.0), vec4<f32>(9.0)));
    }
    if (!r.whole) {
        for (var t = 0u; t < 4u; t++) {
            let j = r.first + 4u * g + t;
            let kp = r.kb + j;
            if (!(r.live && j < r.n && kp >= r.mine.x && kp < r.mine.y && visible(r.qp, kp))) {
                x[t] = MASKED;
            }
        }
    }
    return x;
}

// The maximum of `x` over the two lanes of a row.
fn pair_max(x: f32) -> f32 {
    return max(x, subgroupShuffleXor(x, 1u));
}

// The block's queries (zero past the last and past the head) as f16 rows of QP into `kv`.
fn stage_queries(first: u32, h: u32, li: u32) {
    for (var e = li; e < BQ * DP / 4u; e += WG) {
        let qr = e / (DP / 4u);
        var x = vec4<f32>(0.0);
        if (first + qr < p.tq) {
            x = row4(OF_Q, first + qr, h, e % (DP / 4u));
        }
        kv[qr * (QP / 4u) + e % (DP / 4u)] = vec4<f16>(x);
    }
}

// Output fragment `o` plus the weights (a0: keys 0..15 of the tile, a1: 16..31) times the 16
// value columns from vec4 `v4` of `kv`.
fn weighted_values(
    a0: coop_mat16x16<f16, A>,
    a1: coop_mat16x16<f16, A>,
    v4: u32,
    o: coop_mat16x16<f32, C>,
) -> coop_mat16x16<f32, C> {
    let c = coopMultiplyAdd(a0, coopLoadT<coop_mat16x16<f16, B>>(&kv[v4], QP / 4u), o);
    return coopMultiplyAdd(a1, coopLoadT<coop_mat16x16<f16, B>>(&kv[v4 + 4u * QP], QP / 4u), c);
}

// The scores of a subgroup's 16 query rows (its query fragments; the fifth for heads of 80)
// against the 16 keys from vec4 `k4` of `kv`.
fn qk16(
    qa0: coop_mat16x16<f16, A>,
    qa1: coop_mat16x16<f16, A>,
    qa2: coop_mat16x16<f16, A>,
    qa3: coop_mat16x16<f16, A>,
    qa4: coop_mat16x16<f16, A>,
    k4: u32,
) -> coop_mat16x16<f32, C> {
    var c = coop_mat16x16<f32, C>();
    c = coopMultiplyAdd(qa0, coopLoad<coop_mat16x16<f16, B>>(&kv[k4], QP / 4u), c);
    c = coopMultiplyAdd(qa1, coopLoad<coop_mat16x16<f16, B>>(&kv[k4 + 4u], QP / 4u), c);
    c = coopMultiplyAdd(qa2, coopLoad<coop_mat16x16<f16, B>>(&kv[k4 + 8u], QP / 4u), c);
    c = coopMultiplyAdd(qa3, coopLoad<coop_mat16x16<f16, B>>(&kv[k4 + 12u], QP / 4u), c);
#if HEAD_DIM_80
    c = coopMultiplyAdd(qa4, coopLoad<coop_mat16x16<f16, B>>(&kv[k4 + 16u], QP / 4u), c);
#endif
    return c;
}

// A row's softmax so far: its reference (MASKED until it has seen a key) and this lane's part
// of its sum.
struct RowState {
    m: f32,
    sum: f32,
}

// This lane's weights of its half row `r`, exp(score - m) as f16 into `pw` from `pb`; the
// factor the row's outputs must be scaled by (below 1 only where the reference moved).
fn make_weights(r: TileRow, st: ptr<function, RowState>, pb: u32) -> f32 {
    var s = array<vec4<f32>, 4>();
    var tile_max = MASKED;
    for (var g = 0u; g < 4u; g++) {
        let x = scores4(r, g);
        if (!TWO_PASS_SCORES) {
            s[g] = x;
        }
        tile_max = max(tile_max, max(max(x.x, x.y), max(x.z, x.w)));
    }
    tile_max = pair_max(tile_max);
    // A row that has seen no key takes the tile's maximum (its outputs are still zero); one
    // whose reference the tile passes by more than TAU is rescaled (after its weights are
    // made: rescaling passes the outputs through the scores' memory).
    let m = (*st).m;
    let grow = m > MASKED && tile_max > m + TAU;
    let corr = select(1.0, exp(m - tile_max), grow);
    if (grow || m == MASKED) {
        (*st).m = tile_max;
    }
    var sum = (*st).sum * corr;
    for (var g = 0u; g < 4u; g++) {
        var x = s[g];
        if (TWO_PASS_SCORES) {
            x = scores4(r, g);
        }
        let w = select(vec4<f32>(0.0), exp(x - (*st).m), x > vec4<f32>(MASKED));
        sum += w.x + w.y + w.z + w.w;
        pw[pb + g] = vec4<f16>(w);
    }
    (*st).sum = sum;
    return corr;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let item = wid.x + wid.y * nwg.x;
    let blocks = (p.tq + BQ - 1u) / BQ;
    if (item >= blocks * p.heads) {
        return;
    }
    // Head-major: the workgroups that run at once share a few heads' keys and values in L2.
    let h = item / blocks;
    let first = (item % blocks) * BQ;
    let kvh = h / (p.heads / p.kv_heads);
    let sg = li / 32u;
    let lane = li % 32u;
    // This lane's row (of the block) and half of the tile's keys.
    let r = sg * 16u + lane / 2u;
    let half = lane % 2u;
    let row = first + r;
    let live = row < p.tq;
    let qp = p.q_pos0 + min(row, p.tq - 1u);
    let mine = key_range(qp);

    stage_queries(first, h, li);
    workgroupBarrier();
    let qb = sg * 16u * QP / 4u;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&kv[qb], QP / 4u);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&kv[qb + 4u], QP / 4u);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&kv[qb + 8u], QP / 4u);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&kv[qb + 12u], QP / 4u);
#if HEAD_DIM_80
    let qa4 = coopLoadT<coop_mat16x16<f16, A>>(&kv[qb + 16u], QP / 4u);
#else
    // Unused: heads of 64 take four fragments.
    let qa4 = coop_mat16x16<f16, A>();
#endif

    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
#if HEAD_DIM_80
    var o4 = coop_mat16x16<f32, C>();
#endif
    var st = RowState(MASKED, 0.0);
    let last = p.q_pos0 + min(first + BQ, p.tq) - 1u;
    let range = block_keys(p.q_pos0 + first, last);
    let sbase = sg * 16u * S4;
    let pbase = sg * 16u * PP / 4u;
    stage_first_tiles(range, kvh, li);
    var pre: TileLoad;
    if (K_AHEAD) {
        // The first tile's scores, before the loop: its first iteration stores the keys of
        // the tile after next over these.
        workgroupBarrier();
        coopStoreT(qk16(qa0, qa1, qa2, qa3, qa4, 0u), &sc[sbase], S4);
        coopStoreT(qk16(qa0, qa1, qa2, qa3, qa4, 4u * QP), &sc[sbase + 4u], S4);
    }
    var b = 0u;
    for (var kb = range.x; kb < range.y; kb += BK) {
        let n = min(BK, range.y - kb);
        // Tile kb's keys and values are in buffer b (K_AHEAD: its values, and the next tile's
        // keys in the other buffer); everyone is done with what this iteration's end stores
        // over.
        workgroupBarrier();
        let more = kb + BK < range.y;
        // The keys stored at this tile's end: the next tile's (K_AHEAD: the one after).
        let kn = kb + select(BK, 2u * BK, K_AHEAD);
        let nk = select(0u, min(BK, range.y - min(kn, range.y)), kn < range.y);
        let nv = select(0u, min(BK, range.y - kb - BK), more);
        if (PREFETCH_TILES) {
            pre = fetch_tile(kn, nk, kb + BK, nv, kvh, li);
        }
        let kbase = 2u * b * TS;
        let vbase = kbase + TS;
        if (!K_AHEAD) {
            coopStoreT(qk16(qa0, qa1, qa2, qa3, qa4, kbase), &sc[sbase], S4);
            coopStoreT(qk16(qa0, qa1, qa2, qa3, qa4, kbase + 4u * QP), &sc[sbase + 4u], S4);
        }
        // K_AHEAD: the next tile's scores, made while this tile's weights are (stored once
        // every lane has read this tile's).
        var c0 = coop_mat16x16<f32, C>();
        var c1 = coop_mat16x16<f32, C>();
        if (K_AHEAD && more) {
            let next = 2u * (1u - b) * TS;
            c0 = qk16(qa0, qa1, qa2, qa3, qa4, next);
            c1 = qk16(qa0, qa1, qa2, qa3, qa4, next + 4u * QP);
        }
        subgroupBarrier();

        // This lane's 16 scores, four at a time; a tile whose keys the row sees every one of
        // skips the per-key mask.
        let whole = WHOLE_TILES && live && n == BK && kb >= mine.x && kb + BK <= mine.y
            && interval_visible(qp, kb, kb + BK - 1u);
        let row_of_tile = TileRow(sbase + (lane / 2u) * S4 + half * 4u, kb, n, half * 16u, whole,
            live, qp, mine);
        let corr = make_weights(row_of_tile, &st, pbase + (lane / 2u) * PP / 4u + half * 4u);
        if (subgroupAny(corr < 1.0)) {
            o0 = rescaled(o0, sg, lane, corr);
            o1 = rescaled(o1, sg, lane, corr);
            o2 = rescaled(o2, sg, lane, corr);
            o3 = rescaled(o3, sg, lane, corr);
#if HEAD_DIM_80
            o4 = rescaled(o4, sg, lane, corr);
#endif
        }
        // The weights are complete, and every lane is done with the scores.
        subgroupBarrier();
        if (K_AHEAD && more) {
            coopStoreT(c0, &sc[sbase], S4);
            coopStoreT(c1, &sc[sbase + 4u], S4);
        }
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&pw[pbase], PP / 4u);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&pw[pbase + 4u], PP / 4u);
        o0 = weighted_values(a0, a1, vbase, o0);
        o1 = weighted_values(a0, a1, vbase + 4u, o1);
        o2 = weighted_values(a0, a1, vbase + 8u, o2);
        o3 = weighted_values(a0, a1, vbase + 12u, o3);
#if HEAD_DIM_80
        o4 = weighted_values(a0, a1, vbase + 16u, o4);
#endif
        // What was loaded while this tile was used, into the buffers free since the top.
        if (!PREFETCH_TILES) {
            pre = fetch_tile(kn, nk, kb + BK, nv, kvh, li);
        }
        if (nk > 0u) {
            store_rows(pre.k, 2u * select(1u - b, b, K_AHEAD) * TS, li);
        }
        if (more) {
            store_rows(pre.v, (2u * (1u - b) + 1u) * TS, li);
        }
        b = 1u - b;
    }
    let total = st.sum + subgroupShuffleXor(st.sum, 1u);
    let inv = select(0.0, 1.0 / total, total > 0.0);
    let ob = p.o_at + row * p.o0 + h * p.o1;
    emit(o0, sg, lane, 0u, inv, ob, live);
    emit(o1, sg, lane, 16u, inv, ob, live);
    emit(o2, sg, lane, 32u, inv, ob, live);
    emit(o3, sg, lane, 48u, inv, ob, live);
#if HEAD_DIM_80
    emit(o4, sg, lane, 64u, inv, ob, live);
#endif
}
