// Causal attention of each query row against the KV cache, with grouped KV heads and an
// optional sliding window, by online softmax over chunks of 256 keys. One workgroup per
// (query head, token).
//
// q: [tokens, n_head, head_dim]; k, v caches: [capacity, n_kv_head, head_dim];
// out: [tokens, n_head, head_dim]. Token m (at positions[m]) sees keys at positions
// max(0, pos - window + 1) ..= pos (window 0 = unlimited).

struct Params {
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    m: u32,
    window: u32,
    scale: f32,
    softcap: f32,
    capacity: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<f32>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

const MAX_HD: u32 = 512u;

var<workgroup> qs: array<f32, MAX_HD>;
var<workgroup> probs: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let m = wg.y;
    let hd = p.head_dim;
    let pos = positions[m];
    let kvh = h / (p.n_head / p.n_kv_head);
    let row = p.n_kv_head * hd;
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let hi = min(pos, p.capacity - 1u);
    let qb = (m * p.n_head + h) * hd;
    for (var d = li; d < hd; d += 256u) {
        qs[d] = q[qb + d] * p.scale;
    }
    workgroupBarrier();

    var run_max = -3.0e38;
    var run_sum = 0.0;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var c0 = lo; c0 <= hi; c0 += 256u) {
        let j = c0 + li;
        var s = -3.0e38;
        if (j <= hi) {
            let kb = j * row + kvh * hd;
            var dotv = 0.0;
            for (var d = 0u; d < hd; d++) {
                dotv += qs[d] * kc[kb + d];
            }
            if (p.softcap > 0.0) {
                dotv = p.softcap * tanh(clamp(dotv / p.softcap, -9.0, 9.0));
            }
            s = dotv;
        }
        let cmax = wg_max(s, li);
        let new_max = max(run_max, cmax);
        var e = 0.0;
        if (j <= hi) {
            e = exp(s - new_max);
        }
        let csum = wg_sum(e, li);
        let corr = exp(run_max - new_max);
        run_sum = run_sum * corr + csum;
        acc0 *= corr;
        acc1 *= corr;
        run_max = new_max;
        probs[li] = e;
        workgroupBarrier();
        let count = min(256u, hi + 1u - c0);
        for (var jj = 0u; jj < count; jj++) {
            let pj = probs[jj];
            let vb = (c0 + jj) * row + kvh * hd;
            if (li < hd) {
                acc0 += pj * vc[vb + li];
            }
            if (li + 256u < hd) {
                acc1 += pj * vc[vb + li + 256u];
            }
        }
        workgroupBarrier();
    }
    let ob = (m * p.n_head + h) * hd;
    if (li < hd) {
        out[ob + li] = acc0 / run_sum;
    }
    if (li + 256u < hd) {
        out[ob + li + 256u] = acc1 / run_sum;
    }
}
