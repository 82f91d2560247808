// Causal attention of many query tokens against the KV cache, with grouped KV heads and an
// optional sliding window, by online softmax over chunks of 64 keys. One workgroup per
// (KV head, R consecutive tokens) takes the G query heads that share the KV head for each of
// its R tokens: GV = G R (at most 8) "virtual heads", so each key and value row is read once
// for all of them rather than once per head and token (Gemma has 2 to 8 query heads per KV
// head; R = 8 / G). The workgroup walks the union of its tokens' key ranges; a key outside
// a token's own range weighs nothing for it.
//
// Per chunk: four threads share each key (interleaved vec4s, so a warp reads key rows in
// 64-byte pieces) and score it against all GV heads; thread (virtual head g = li / 32, lane l)
// then takes keys l and l + 32 of head g for the softmax, reduced over the head's 32
// threads; every thread accumulates output dimensions li and li + 256 of all GV heads.
//
// q: [tokens, q_stride] with head h at h * head_dim; k, v caches: [capacity, n_kv_head,
// head_dim]; out: [tokens, n_head, head_dim]. Token m (at positions[m]) sees keys at positions
// max(0, pos - window + 1) ..= pos (window 0 = unlimited); with SPANS, up to last_key[m]
// where that is later (bidirectional within an image); with FIRST_KEYS, from first_key[m]
// instead of the window's reach (a DiffusionGemma canvas row sees a fixed stretch of the
// prompt before the canvas). With slot_rows > 0 the cache holds
// several sequences, slot_rows rows each (a batch of decode steps): a token sees only the keys
// of its own slot.

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Query heads per KV head, and tokens per workgroup: G R at most MAX_G.
override G: u32 = 1u;
override R: u32 = 1u;
const MAX_G: u32 = 8u;
const CHUNK: u32 = 64u;
// Per token of the workgroup: its first and last key (first > last: no token there).
var<workgroup> row_keys: array<vec2<u32>, MAX_G>;

// Partial scores [head][key][quarter], then probabilities [head][key].
var<workgroup> part: array<f32, 2048>;
var<workgroup> probs: array<f32, 512>;
// Tree reductions over each head's 32 threads; per head: the factor the old sums are
// rescaled by, then the final sum.
var<workgroup> red: array<f32, 256>;
var<workgroup> corr: array<f32, MAX_G>;

// The max (or sum) of v over the 32 threads of li's head; every thread takes part. With
// subgroups of exactly 32 lanes a head's threads are one subgroup: no barriers.
fn head_reduce(v: f32, li: u32, is_max: bool) -> f32 {
#if SUBGROUP32
    if (is_max) {
        return subgroupMax(v);
    }
    return subgroupAdd(v);
#else
    red[li] = v;
    workgroupBarrier();
    for (var s = 16u; s > 0u; s >>= 1u) {
        if (li % 32u < s) {
            if (is_max) {
                red[li] = max(red[li], red[li + s]);
            } else {
                red[li] += red[li + s];
            }
        }
        workgroupBarrier();
    }
    let r = red[li - li % 32u];
    workgroupBarrier();
    return r;
#endif
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let kvh = wg.x;
    let hd = p.head_dim;
    let row = p.n_kv_head * hd;
    // Token r of the workgroup is m_top - r: later tokens (more keys) first, so that the
    // longest workgroups start before the short ones. Past the first token: none.
    let m_top = p.m - 1u - wg.y * R;
    if (li < R) {
        var keys = vec2<u32>(1u, 0u);
        if (li <= m_top) {
            keys = key_range(m_top - li);
        }
        row_keys[li] = keys;
    }
    workgroupBarrier();
    // The keys of all the tokens (uniform: the chunk loop's barriers need every thread to
    // take the same trips), and those of this thread's softmax head.
    var lo = 0xFFFFFFFFu;
    var hi = 0u;
    for (var r = 0u; r < R; r++) {
        let k = workgroupUniformLoad(&row_keys[r]);
        if (k.x <= k.y) {
            lo = min(lo, k.x);
            hi = max(hi, k.y);
        }
    }
    let key = li / 4u;
    let quarter = li % 4u;
    let g_mine = li / 32u;
    let lane = li % 32u;
    let my_keys = row_keys[min(g_mine / G, R - 1u)];
    // Query of virtual head g (token g / G, head kvh G + g % G): vec4 index q_at(g) + i.
    let q_top = (m_top * p.q_stride + kvh * G * hd) / 4u;
    let q_row = p.q_stride / 4u;

    var run_max = -3.0e38;
    var run_sum = 0.0;
    var acc: array<vec2<f32>, MAX_G>;
    for (var first = lo; first <= hi; first += CHUNK) {
        let count = min(CHUNK, hi + 1u - first);
        var dv = array<f32, MAX_G>();
        if (key < count) {
            let kb = ((first + key) * row + kvh * hd) / 4u;
            // Four of the key's vec4s loaded before they are used: loads in flight together
            // rather than one after another (this loop waits on memory, not arithmetic).
            for (var i0 = quarter; i0 < hd / 4u; i0 += 16u) {
                var ks = array<vec4<f32>, 4>();
                for (var t = 0u; t < 4u; t++) {
                    if (i0 + 4u * t < hd / 4u) {
                        ks[t] = kc[kb + i0 + 4u * t];
                    }
                }
                for (var t = 0u; t < 4u; t++) {
                    let i = i0 + 4u * t;
                    if (i < hd / 4u) {
                        for (var g = 0u; g < G * R; g++) {
                            // Rows of tokens past the first read token 0's query (dropped).
                            let r = min(g / G, m_top);
                            dv[g] += dot(q[q_top - r * q_row + (g % G) * (hd / 4u) + i], ks[t]);
                        }
                    }
                }
            }
        }
        for (var g = 0u; g < G * R; g++) {
            part[(g * CHUNK + key) * 4u + quarter] = dv[g];
        }
        workgroupBarrier();
        // Thread (g_mine, lane): keys lane and lane + 32 of virtual head g_mine, those in its
        // token's range.
        var s = vec2<f32>(-3.0e38);
        var seen = vec2<bool>(false);
        if (g_mine < G * R) {
            for (var h = 0u; h < 2u; h++) {
                let j = lane + 32u * h;
                seen[h] = j < count && first + j >= my_keys.x && first + j <= my_keys.y;
                if (seen[h]) {
                    let b = (g_mine * CHUNK + j) * 4u;
                    s[h] = softcapped((part[b] + part[b + 1u] + part[b + 2u] + part[b + 3u]) * p.scale, p.softcap);
                }
            }
        }
        let new_max = max(run_max, head_reduce(max(s.x, s.y), li, true));
        let e = select(vec2<f32>(0.0), exp(s - vec2<f32>(new_max)), seen);
        let csum = head_reduce(e.x + e.y, li, false);
        if (g_mine < G * R) {
            probs[g_mine * CHUNK + lane] = e.x;
            probs[g_mine * CHUNK + lane + 32u] = e.y;
            if (lane == 0u) {
                corr[g_mine] = exp(run_max - new_max);
            }
        }
        run_sum = run_sum * exp(run_max - new_max) + csum;
        run_max = new_max;
        workgroupBarrier();
        for (var g = 0u; g < G * R; g++) {
            acc[g] *= corr[g];
        }
        let vb = first * row + kvh * hd;
        // Keys in batches of 8 whose values are loaded before they are summed, as above. Keys
        // past `count` have zero values (their stale probabilities add nothing).
        for (var j0 = 0u; j0 < count; j0 += 8u) {
            var vs = array<vec2<f32>, 8>();
            for (var t = 0u; t < 8u; t++) {
                let vr = vb + (j0 + t) * row;
                if (j0 + t < count && li < hd) {
                    vs[t].x = vc[vr + li];
                }
                if (j0 + t < count && li + 256u < hd) {
                    vs[t].y = vc[vr + li + 256u];
                }
            }
            for (var t = 0u; t < 8u; t++) {
                for (var g = 0u; g < G * R; g++) {
                    acc[g] += probs[g * CHUNK + j0 + t] * vs[t];
                }
            }
        }
        workgroupBarrier();
    }
    // Each head's sum reaches every thread through workgroup memory.
    if (g_mine < G * R && lane == 0u) {
        corr[g_mine] = run_sum;
    }
    workgroupBarrier();
    for (var g = 0u; g < G * R; g++) {
        let r = g / G;
        if (r > m_top) {
            break;
        }
        let ob = ((m_top - r) * p.n_head + kvh * G + g % G) * hd;
        if (li < hd) {
            out[ob + li] = acc[g].x / corr[g];
        }
        if (li + 256u < hd) {
            out[ob + li + 256u] = acc[g].y / corr[g];
        }
    }
}
