// Two-stage top-K (K <= 64) of each row, sorted by value descending, ties to the smaller
// index; row `y` is workgroup row y. Stage PARTIAL: workgroup g takes the row's values
// [g*4096, (g+1)*4096) (the row starts at x_at + y * row_stride) and writes its top K as
// (value bits, index) pairs to the row's candidates, cand[((y * groups + g)*K + r)*2 ..].
// Stage FINAL: one workgroup a row reduces its `n` candidate pairs to the row's top K,
// written to out[(y*K + r)*2] = index, out[(y*K + r)*2 + 1] = value bits. Each thread keeps
// 16 entries; K rounds of a workgroup argmax pick and retire the winners.

struct Params {
    n: u32,
    k: u32,
    row_stride: u32,
    x_at: u32,
}

const PER_THREAD: u32 = 16u;

#if PARTIAL
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> cand: array<u32>;
#else
@group(0) @binding(0) var<storage, read> cand: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
#endif
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;
var<workgroup> bt: array<u32, 256>;

fn better(v: f32, i: u32, ov: f32, oi: u32) -> bool {
    return v > ov || (v == ov && i < oi);
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    var vals: array<f32, PER_THREAD>;
    var idxs: array<u32, PER_THREAD>;
    for (var t = 0u; t < PER_THREAD; t++) {
        vals[t] = -3.4e38;
        idxs[t] = 0xFFFFFFFFu;
#if PARTIAL
        let i = wg.x * 4096u + t * 256u + li;
        if (i < p.n) {
            var v = x[p.x_at + wg.y * p.row_stride + i];
            // NaN and -inf count as the lowest value, so every candidate has an index.
            if (!(v > -3.4e38)) {
                v = -3.4e38;
            }
            vals[t] = v;
            idxs[t] = i;
        }
#else
        let c = t * 256u + li;
        if (c < p.n) {
            let o = 2u * (wg.y * p.n + c);
            vals[t] = bitcast<f32>(cand[o]);
            idxs[t] = cand[o + 1u];
        }
#endif
    }
    for (var r = 0u; r < p.k; r++) {
        var best = -3.4e38;
        var besti = 0xFFFFFFFFu;
        var bestt = 0u;
        for (var t = 0u; t < PER_THREAD; t++) {
            if (better(vals[t], idxs[t], best, besti)) {
                best = vals[t];
                besti = idxs[t];
                bestt = t;
            }
        }
        bv[li] = best;
        bi[li] = besti;
        bt[li] = li * PER_THREAD + bestt;
        workgroupBarrier();
        for (var s = 128u; s > 0u; s >>= 1u) {
            if (li < s && better(bv[li + s], bi[li + s], bv[li], bi[li])) {
                bv[li] = bv[li + s];
                bi[li] = bi[li + s];
                bt[li] = bt[li + s];
            }
            workgroupBarrier();
        }
        let win = bt[0];
        if (li == 0u) {
#if PARTIAL
            let o = ((wg.y * nwg.x + wg.x) * p.k + r) * 2u;
            cand[o] = bitcast<u32>(bv[0]);
            cand[o + 1u] = bi[0];
#else
            let o = (wg.y * p.k + r) * 2u;
            out[o] = bi[0];
            out[o + 1u] = bitcast<u32>(bv[0]);
#endif
        }
        if (win / PER_THREAD == li) {
            vals[win % PER_THREAD] = -3.4e38;
            idxs[win % PER_THREAD] = 0xFFFFFFFFu;
        }
        workgroupBarrier();
    }
}
