// Causal attention of each query row against the KV cache, with grouped KV heads and an
// optional sliding window, by online softmax over chunks of 64 keys. One workgroup per
// (query head, token); four threads share each key's dot product (interleaved vec4s, so a
// key row is read in contiguous pieces), and each thread owns head dimensions of the output.
//
// q: [tokens, q_stride] with head h at h * head_dim; k, v caches: [capacity, n_kv_head,
// head_dim]; out: [tokens, n_head, head_dim]. Token m (at positions[m]) sees keys at positions
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
    q_stride: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

const CHUNK: u32 = 64u;

var<workgroup> qs: array<vec4<f32>, 128>;
var<workgroup> partial: array<f32, 256>;
var<workgroup> probs: array<f32, CHUNK>;

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
    let qb = m * p.q_stride + h * hd;
    for (var d = li; d < hd / 4u; d += 256u) {
        qs[d] = vec4<f32>(q[qb + 4u * d], q[qb + 4u * d + 1u], q[qb + 4u * d + 2u], q[qb + 4u * d + 3u]) * p.scale;
    }
    workgroupBarrier();

    let j = li / 4u;
    let sub = li % 4u;
    var run_max = -3.0e38;
    var run_sum = 0.0;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var first = lo; first <= hi; first += CHUNK) {
        let count = min(CHUNK, hi + 1u - first);
        var dotv = 0.0;
        if (j < count) {
            let kb = ((first + j) * row + kvh * hd) / 4u;
            for (var i = sub; i < hd / 4u; i += 4u) {
                dotv += dot(qs[i], kc[kb + i]);
            }
        }
        partial[li] = dotv;
        workgroupBarrier();
        var s = -3.0e38;
        if (li < count) {
            s = partial[4u * li] + partial[4u * li + 1u] + partial[4u * li + 2u] + partial[4u * li + 3u];
            if (p.softcap > 0.0) {
                s = p.softcap * tanh(clamp(s / p.softcap, -9.0, 9.0));
            }
        }
        let cmax = wg_max(s, li);
        let new_max = max(run_max, cmax);
        var e = 0.0;
        if (li < count) {
            e = exp(s - new_max);
            probs[li] = e;
        }
        let csum = wg_sum(e, li);
        let corr = exp(run_max - new_max);
        run_sum = run_sum * corr + csum;
        acc0 *= corr;
        acc1 *= corr;
        run_max = new_max;
        let vb = first * row + kvh * hd;
        for (var jj = 0u; jj < count; jj++) {
            let pj = probs[jj];
            if (li < hd) {
                acc0 += pj * vc[vb + jj * row + li];
            }
            if (li + 256u < hd) {
                acc1 += pj * vc[vb + jj * row + li + 256u];
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
