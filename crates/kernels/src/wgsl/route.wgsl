// Routing a token to its k of n experts (at most 256), shared by moe.wgsl's ROUTE and
// matvec.wgsl's ROUTE_IN: a softmax over the token's router logits, then one thread per expert
// counts the experts ranked above its own, and a rank below k is a pick (ties to the lower
// index; a probability that is not a number ranks last, as on the CPU). One pass over the
// probabilities in parallel, where picking one at a time took k passes on one thread (34 us a
// layer on an H100 for 8 of 128). Needs reduce.wgsl and 256 threads. The router's logits
// (n a token) and the experts' output scales are bindings 18 and 19.

@group(0) @binding(18) var<storage, read> route_logits: array<f32>;
@group(0) @binding(19) var<storage, read> route_scale: array<f32>;

var<workgroup> route_probs: array<f32, 256>;
// The picks in rank order: expert and probability.
var<workgroup> route_picked: array<u32, 256>;
var<workgroup> route_picked_p: array<f32, 256>;

// Ranks token t's experts and fills the picks; every thread of the workgroup calls it, and
// reads the picks after it returns.
fn route_token(t: u32, li: u32, n: u32, k: u32) {
    let mine = li < n;
    var logit = -3.4e38;
    if (mine) {
        logit = route_logits[t * n + li];
    }
    let mx = wg_max(logit, li);
    var e = 0.0;
    if (mine) {
        e = exp(logit - mx);
    }
    let pr = e / wg_sum(e, li);
    let key = select(-1.0, pr, pr >= 0.0);
    route_probs[li] = key;
    workgroupBarrier();
    if (mine) {
        var rank = 0u;
        for (var f = 0u; f < n; f++) {
            let q = route_probs[f];
            rank += u32(q > key || (q == key && f < li));
        }
        if (rank < k) {
            route_picked[rank] = li;
            route_picked_p[rank] = key;
        }
    }
    workgroupBarrier();
}

struct Pick {
    expert: u32,
    weight: f32,
}

// Pick j: its expert, and its probability renormalised over the k picks (summed in rank
// order, as the CPU sums them; the sum floored at 2^-14), times the expert's output scale
// where `scaled`.
fn route_pick(j: u32, k: u32, scaled: bool) -> Pick {
    var picked_sum = 0.0;
    for (var r = 0u; r < k; r++) {
        picked_sum += route_picked_p[r];
    }
    let ex = route_picked[j];
    var w = route_picked_p[j] / max(picked_sum, 6.103515625e-5);
    if (scaled) {
        w *= route_scale[ex];
    }
    return Pick(ex, w);
}
