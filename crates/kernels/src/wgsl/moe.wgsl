// Mixture-of-experts helpers, one workgroup of 256 threads per token.
// ROUTE: the token's k most likely of n_expert experts (route.wgsl), their probabilities
//        renormalised to sum to one and times the expert's output scale: sel[t*k + j] =
//        expert, weight[t*k + j] = weight.
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
// The logits and scales: route.wgsl's bindings.
@group(0) @binding(1) var<storage, read_write> sel: array<u32>;
@group(0) @binding(2) var<storage, read_write> weight: array<f32>;
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

#if MIX
// Values of a row per thread: rows of up to 256 * PER stay in registers between the reductions.
const PER: u32 = 24u;
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wg.x;
#if ROUTE
    route_token(t, li, p.n_expert, p.k);
    if (li < p.k) {
        let pick = route_pick(li, p.k, p.has_scale != 0u);
        sel[t * p.k + li] = pick.expert;
        weight[t * p.k + li] = pick.weight;
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
