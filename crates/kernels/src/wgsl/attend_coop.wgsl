// attend_tiled.wgsl's attention on cooperative matrices (tensor cores): f16 queries, keys,
// values and weights, f32 scores, sums and outputs. One workgroup of eight 32-lane subgroups
// per (block of 64 queries, head); keys come in tiles of BK, each tile's keys and values
// fetched into registers while the tile before is being used (as f32: converting them as
// they arrive would wait for the loads there). Per tile:
//   1. subgroup s scores query rows 16 (s / 2) against the tile's key blocks s % 2, s % 2 + 2,
//      ..., its four (or five) query fragments held since the start; scores go to `ss` (f32);
//   2. four threads per query row mask and softcap the row's scores, update the row's running
//      maximum (online softmax, reduced across the four by subgroup shuffles), rescale their
//      sums and output accumulators, and write the weights to `ps` as f16;
//   3. the subgroups multiply the weights by V into `ss`, and each thread adds its part of its
//      row to its accumulators.
// Cooperative matrices cannot be scaled per row, so the outputs live in registers and each
// tile's product passes through workgroup memory. Head dimensions up to DP (64, or 80 with
// HEAD_DIM_80, whose longer rows take tiles of 32 keys to stay within 48 KiB), padded with
// zeros.

#if HEAD_DIM_80
const DP: u32 = 80u;
const BK: u32 = 32u;
#else
const DP: u32 = 64u;
const BK: u32 = 64u;
#endif
const BQ: u32 = 64u;
// Pitches (in elements) of the f16 key/value/query rows, the f16 weight rows and the f32
// score/product rows: padded so that a fragment's rows fall on different banks while every
// fragment stays 16-byte aligned.
const QP: u32 = DP + 8u;
const PP: u32 = BK + 8u;
const SP: u32 = DP + 4u;
// Each thread's share of a row: BK / 4 scores, DP / 4 outputs; and of the tile's key and
// value vec4s.
const KT: u32 = BK / 4u;
const DT: u32 = DP / 4u;
const TILE4: u32 = BK * QP / 4u;
const LOADS: u32 = (TILE4 + 255u) / 256u;

var<workgroup> ks: array<vec4<f16>, TILE4>;
var<workgroup> vs: array<vec4<f16>, TILE4>;
// The query block (at the start), then each tile's weights.
var<workgroup> ps: array<vec4<f16>, BQ * QP / 4u>;
// Each tile's scores, then its weighted values.
var<workgroup> ss: array<f32, BQ * SP>;

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
        case OF_Q: { return q[p.q_at + row * p.q0 + head * p.q1 + c * p.q2]; }
        case OF_K: { return k[p.k_at + row * p.k0 + head * p.k1 + c * p.k2]; }
        default: { return v[p.v_at + row * p.v0 + head * p.v1 + c * p.v2]; }
    }
}

fn row4(which: u32, row: u32, head: u32, c4: u32) -> vec4<f32> {
    let c = 4u * c4;
    return vec4<f32>(
        at(which, row, head, c),
        at(which, row, head, c + 1u),
        at(which, row, head, c + 2u),
        at(which, row, head, c + 3u),
    );
}

// A thread's share of a tile's keys and values (zero past the `n` keys of the tile), kept as
// loaded (converted to f16 when stored) so that nothing waits on the loads until then.
struct TileLoad {
    k: array<vec4<f32>, LOADS>,
    v: array<vec4<f32>, LOADS>,
}

fn fetch_tile(kb: u32, n: u32, kvh: u32, li: u32) -> TileLoad {
    var t: TileLoad;
    for (var i = 0u; i < LOADS; i++) {
        let e = li + 256u * i;
        let j = e / (QP / 4u);
        if (e < TILE4 && j < n) {
            t.k[i] = row4(OF_K, kb + j, kvh, e % (QP / 4u));
            t.v[i] = row4(OF_V, kb + j, kvh, e % (QP / 4u));
        }
    }
    return t;
}

fn store_tile(t: TileLoad, li: u32) {
    for (var i = 0u; i < LOADS; i++) {
        let e = li + 256u * i;
        if (e < TILE4) {
            ks[e] = vec4<f16>(t.k[i]);
            vs[e] = vec4<f16>(t.v[i]);
        }
    }
}

// The maximum and the sum of `x` over the four lanes of a row.
fn row_max(x: f32) -> f32 {
    let y = max(x, subgroupShuffleXor(x, 1u));
    return max(y, subgroupShuffleXor(y, 2u));
}

fn row_sum(x: f32) -> f32 {
    let y = x + subgroupShuffleXor(x, 1u);
    return y + subgroupShuffleXor(y, 2u);
}

@compute @workgroup_size(256)
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
    let h = item % p.heads;
    let first = (item / p.heads) * BQ;
    let kvh = h / (p.heads / p.kv_heads);
    let sg = li / 32u;
    let rb = sg / 2u;
    // This thread's row and quarter of it (the softmax and the outputs).
    let r = li / 4u;
    let part = li % 4u;
    let row = first + r;
    let live = row < p.tq;
    let qp = p.q_pos0 + min(row, p.tq - 1u);
    let mine = key_range(qp);

    for (var e = li; e < BQ * QP / 4u; e += 256u) {
        let qr = e / (QP / 4u);
        var x = vec4<f16>(0.0);
        if (first + qr < p.tq) {
            x = vec4<f16>(row4(OF_Q, first + qr, h, e % (QP / 4u)));
        }
        ps[e] = x;
    }
    workgroupBarrier();
    let qb = rb * 16u * QP / 4u;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&ps[qb], QP / 4u);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&ps[qb + 4u], QP / 4u);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&ps[qb + 8u], QP / 4u);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&ps[qb + 12u], QP / 4u);
#if HEAD_DIM_80
    let qa4 = coopLoadT<coop_mat16x16<f16, A>>(&ps[qb + 16u], QP / 4u);
#endif

    var acc: array<f32, DT>;
    var run_max = MASKED;
    var run_sum = 0.0;
    let last = p.q_pos0 + min(first + BQ, p.tq) - 1u;
    let range = block_keys(p.q_pos0 + first, last);
    var pre = fetch_tile(range.x, min(BK, range.y - range.x), kvh, li);
    for (var kb = range.x; kb < range.y; kb += BK) {
        let n = min(BK, range.y - kb);
        // Everyone is done with the previous tile (and the query block).
        workgroupBarrier();
        store_tile(pre, li);
        workgroupBarrier();
        if (kb + BK < range.y) {
            pre = fetch_tile(kb + BK, min(BK, range.y - kb - BK), kvh, li);
        }
        for (var cb = sg % 2u; cb < BK / 16u; cb += 2u) {
            let kb4 = cb * 16u * QP / 4u;
            var c = coop_mat16x16<f32, C>();
            c = coopMultiplyAdd(qa0, coopLoad<coop_mat16x16<f16, B>>(&ks[kb4], QP / 4u), c);
            c = coopMultiplyAdd(qa1, coopLoad<coop_mat16x16<f16, B>>(&ks[kb4 + 4u], QP / 4u), c);
            c = coopMultiplyAdd(qa2, coopLoad<coop_mat16x16<f16, B>>(&ks[kb4 + 8u], QP / 4u), c);
            c = coopMultiplyAdd(qa3, coopLoad<coop_mat16x16<f16, B>>(&ks[kb4 + 12u], QP / 4u), c);
#if HEAD_DIM_80
            c = coopMultiplyAdd(qa4, coopLoad<coop_mat16x16<f16, B>>(&ks[kb4 + 16u], QP / 4u), c);
#endif
            coopStoreT(c, &ss[rb * 16u * SP + cb * 16u], SP);
        }
        workgroupBarrier();

        var s = array<f32, KT>();
        var tile_max = MASKED;
        for (var i = 0u; i < KT; i++) {
            let j = part * KT + i;
            let kp = kb + j;
            var sj = MASKED;
            if (live && j < n && kp >= mine.x && kp < mine.y && visible(qp, kp)) {
                sj = ss[r * SP + j] * p.scale;
                if (p.softcap > 0.0) {
                    sj = p.softcap * tanh(clamp(sj / p.softcap, -9.0, 9.0));
                }
            }
            s[i] = sj;
            tile_max = max(tile_max, sj);
        }
        let new_max = max(run_max, row_max(tile_max));
        let corr = exp(run_max - new_max);
        run_sum *= corr;
        for (var i = 0u; i < DT; i++) {
            acc[i] *= corr;
        }
        let pb = r * PP / 4u + part * KT / 4u;
        for (var i = 0u; i < KT; i += 4u) {
            var w = vec4<f32>(0.0);
            for (var t = 0u; t < 4u; t++) {
                if (s[i + t] > MASKED) {
                    w[t] = exp(s[i + t] - new_max);
                }
            }
            run_sum += w.x + w.y + w.z + w.w;
            ps[pb + i / 4u] = vec4<f16>(w);
        }
        run_max = new_max;
        // The weights are complete, and every score has been read.
        workgroupBarrier();
        for (var cb = sg % 2u; cb < DP / 16u; cb += 2u) {
            var c = coop_mat16x16<f32, C>();
            for (var kk = 0u; kk < BK / 16u; kk++) {
                let a = coopLoadT<coop_mat16x16<f16, A>>(&ps[(rb * 16u * PP + kk * 16u) / 4u], PP / 4u);
                let b = coopLoadT<coop_mat16x16<f16, B>>(&vs[(kk * 16u * QP + cb * 16u) / 4u], QP / 4u);
                c = coopMultiplyAdd(a, b, c);
            }
            coopStoreT(c, &ss[rb * 16u * SP + cb * 16u], SP);
        }
        workgroupBarrier();
        for (var i = 0u; i < DT; i++) {
            acc[i] += ss[r * SP + part * DT + i];
        }
    }
    let total = row_sum(run_sum);
    if (!live) {
        return;
    }
    let inv = select(0.0, 1.0 / total, total > 0.0);
    let ob = p.o_at + row * p.o0 + h * p.o1;
    for (var i = 0u; i < DT; i++) {
        let c = part * DT + i;
        if (c < p.d) {
            o[ob + c * p.o2] = acc[i] * inv;
        }
    }
}
