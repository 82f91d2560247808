// Mixture-of-experts helpers, one workgroup of 256 threads per token.
// ROUTE: softmax over the token's n_expert router logits, the k most likely experts (ties to
//        the lower index), their probabilities renormalised to sum to one (floored at 2^-14)
//        and times the expert's output scale: sel[t*k + j] = expert, weight[t*k + j] = weight.
//        One thread per expert counts the experts ranked above its own; a rank below k is a
//        pick. One pass over the probabilities in parallel, where picking one at a time took
//        k passes on one thread (34 us a layer on an H100 for 8 of 128).
// MIX:   out[t] = norm(dense[t]) * dense_post + norm(mix) * experts_post, where
//        mix = sum_j weight[t*k + j] * y[t*k + j] (WEIGHTED; otherwise y holds one mixed row a
//        token, k = 1): the dense branch and the experts' weighted mix, each normalised, in one
//        pass (the layer's FFN output before its post-norm).
// GROUP: the k slots (here all tokens' slots) by expert, for the products of many tokens,
//        one workgroup in all: groups = [slots, expert by expert | count of each expert |
//        first entry of each], k + 2 n_expert words. An expert's slots are in the order
//        their threads got there, which leaves every slot's result the same.

struct Params {
    n_expert: u32,
    k: u32,
    dim: u32,
    has_scale: u32,
    eps: f32,
}

#if ROUTE
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> sel: array<u32>;
@group(0) @binding(2) var<storage, read_write> weight: array<f32>;
@group(0) @binding(4) var<storage, read> expert_scale: array<f32>;
#endif
#if GROUP
@group(0) @binding(0) var<storage, read> sel: array<u32>;
@group(0) @binding(1) var<storage, read_write> groups: array<u32>;
var<workgroup> counts: array<atomic<u32>, 256>;
var<workgroup> starts: array<u32, 256>;
#endif
#if MIX
@group(0) @binding(0) var<storage, read> y: array<f32>;
#if WEIGHTED
@group(0) @binding(1) var<storage, read> weight: array<f32>;
#endif
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> dense: array<f32>;
@group(0) @binding(5) var<storage, read> dense_post: array<f32>;
@group(0) @binding(6) var<storage, read> experts_post: array<f32>;
#endif
@group(0) @binding(3) var<uniform> p: Params;

#if ROUTE
var<workgroup> probs: array<f32, 256>;
// The picks in rank order: expert and probability.
var<workgroup> picked: array<u32, 256>;
var<workgroup> picked_p: array<f32, 256>;
#endif
#if MIX
// Values of a row per thread: rows of up to 256 * PER stay in registers between the reductions.
const PER: u32 = 24u;
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wg.x;
#if ROUTE
    let mine = li < p.n_expert;
    var l = -3.4e38;
    if (mine) {
        l = logits[t * p.n_expert + li];
    }
    let mx = wg_max(l, li);
    var e = 0.0;
    if (mine) {
        e = exp(l - mx);
    }
    let pr = e / wg_sum(e, li);
    // A probability that is not a number ranks last, as on the CPU.
    let key = select(-1.0, pr, pr >= 0.0);
    probs[li] = key;
    workgroupBarrier();
    if (mine) {
        var rank = 0u;
        for (var f = 0u; f < p.n_expert; f++) {
            let q = probs[f];
            rank += u32(q > key || (q == key && f < li));
        }
        if (rank < p.k) {
            picked[rank] = li;
            picked_p[rank] = key;
        }
    }
    workgroupBarrier();
    if (li < p.k) {
        // Summed in rank order, as the CPU sums its picks.
        var picked_sum = 0.0;
        for (var j = 0u; j < p.k; j++) {
            picked_sum += picked_p[j];
        }
        let ex = picked[li];
        var w = picked_p[li] / max(picked_sum, 6.103515625e-5);
        if (p.has_scale != 0u) {
            w *= expert_scale[ex];
        }
        sel[t * p.k + li] = ex;
        weight[t * p.k + li] = w;
    }
#endif
#if GROUP
    // Counted, then each slot claims a place in its expert's run.
    let n = p.n_expert;
    if (li < n) {
        atomicStore(&counts[li], 0u);
    }
    workgroupBarrier();
    for (var s = li; s < p.k; s += 256u) {
        atomicAdd(&counts[min(sel[s], n - 1u)], 1u);
    }
    workgroupBarrier();
    if (li == 0u) {
        var at = 0u;
        for (var e = 0u; e < n; e++) {
            let c = atomicLoad(&counts[e]);
            groups[p.k + e] = c;
            groups[p.k + n + e] = at;
            starts[e] = at;
            at += c;
        }
    }
    workgroupBarrier();
    if (li < n) {
        atomicStore(&counts[li], 0u);
    }
    workgroupBarrier();
    for (var s = li; s < p.k; s += 256u) {
        let e = min(sel[s], n - 1u);
        groups[starts[e] + atomicAdd(&counts[e], 1u)] = s;
    }
#endif
#if MIX
    var mv: array<f32, PER>;
    var dv: array<f32, PER>;
    var sm = 0.0;
    var sd = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = li + 256u * j;
        if (i >= p.dim) {
            break;
        }
        var acc = 0.0;
        for (var s = t * p.k; s < (t + 1u) * p.k; s++) {
#if WEIGHTED
            acc += weight[s] * y[s * p.dim + i];
#else
            acc += y[s * p.dim + i];
#endif
        }
        mv[j] = acc;
        dv[j] = dense[t * p.dim + i];
        sm += acc * acc;
        sd += dv[j] * dv[j];
    }
    let inv_m = inverseSqrt(wg_sum(sm, li) / f32(p.dim) + p.eps);
    let inv_d = inverseSqrt(wg_sum(sd, li) / f32(p.dim) + p.eps);
    for (var j = 0u; j < PER; j++) {
        let i = li + 256u * j;
        if (i >= p.dim) {
            break;
        }
        out[t * p.dim + i] = dv[j] * inv_d * dense_post[i] + mv[j] * inv_m * experts_post[i];
    }
#endif
}
