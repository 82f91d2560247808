// Mixture-of-experts helpers, one workgroup per token.
// ROUTE: softmax over the token's n_expert router logits, the k most likely experts (ties to
//        the lower index), their probabilities renormalised to sum to one (floored at 2^-14)
//        and times the expert's output scale: sel[t*k + j] = expert, weight[t*k + j] = weight.
// SUM:   out[t, d] = sum_j weight[t*k + j] * y[(t*k + j) * dim + d], the experts' mix.

struct Params {
    n_expert: u32,
    k: u32,
    dim: u32,
    has_scale: u32,
}

#if ROUTE
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> sel: array<u32>;
@group(0) @binding(2) var<storage, read_write> weight: array<f32>;
@group(0) @binding(4) var<storage, read> expert_scale: array<f32>;
#endif
#if SUM
@group(0) @binding(0) var<storage, read> y: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
#endif
@group(0) @binding(3) var<uniform> p: Params;

const MAX_EXPERTS: u32 = 256u;
var<workgroup> probs: array<f32, MAX_EXPERTS>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wg.x;
#if ROUTE
    if (li != 0u) {
        return;
    }
    // Serial over at most 256 experts: a few microseconds, and exactly the CPU's order.
    let base = t * p.n_expert;
    var mx = -3.4e38;
    for (var e = 0u; e < p.n_expert; e++) {
        mx = max(mx, logits[base + e]);
    }
    var total = 0.0;
    for (var e = 0u; e < p.n_expert; e++) {
        probs[e] = exp(logits[base + e] - mx);
        total += probs[e];
    }
    for (var e = 0u; e < p.n_expert; e++) {
        probs[e] /= total;
    }
    var picked_sum = 0.0;
    for (var j = 0u; j < p.k; j++) {
        var best = 0u;
        var bv = -1.0;
        for (var e = 0u; e < p.n_expert; e++) {
            if (probs[e] > bv) {
                bv = probs[e];
                best = e;
            }
        }
        sel[t * p.k + j] = best;
        weight[t * p.k + j] = bv;
        picked_sum += bv;
        probs[best] = -2.0;
    }
    let norm = max(picked_sum, 6.103515625e-5);
    for (var j = 0u; j < p.k; j++) {
        var w = weight[t * p.k + j] / norm;
        if (p.has_scale != 0u) {
            w *= expert_scale[sel[t * p.k + j]];
        }
        weight[t * p.k + j] = w;
    }
#endif
#if SUM
    for (var d = li; d < p.dim; d += 64u) {
        var acc = 0.0;
        for (var j = 0u; j < p.k; j++) {
            let s = t * p.k + j;
            acc += weight[s] * y[s * p.dim + d];
        }
        out[t * p.dim + d] = acc;
    }
#endif
}
