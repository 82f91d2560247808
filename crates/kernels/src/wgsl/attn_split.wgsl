// Decode attention split over the keys (flash-decoding): workgroup (h, c) takes query head
// h and the c-th chunk of 64 visible keys, and writes the chunk's unnormalised output with its
// running max and sum to part[(h * max_chunks + c) * (hd + 2) ..]. attn_combine.wgsl then
// merges the chunks. The grid covers the largest context; chunks past the visible keys exit.
//
// HEAD_POST: head_post.wgsl's work for the one token, here rather than in a dispatch of its
// own. Each workgroup norms and ropes its query head from the raw projection; with KV_NEW (a
// layer that owns its cache) the workgroups whose chunk holds the token's position also norm
// and rope its K (and norm its V) in workgroup memory and use them for that key, and those of
// the first query head of each KV group store them in the cache for later steps. No other
// workgroup reads that slot, so nothing waits for the store.

struct Params {
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    window: u32,
    max_chunks: u32,
    capacity: u32,
    scale: f32,
    softcap: f32,
    q_offset: u32,
    n_rot: u32,
    eps: f32,
    base: f32,
    freq_scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
#if KV_NEW
@group(0) @binding(1) var<storage, read_write> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> vc: array<f32>;
#else
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
#endif
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;
#if HEAD_POST
@group(0) @binding(6) var<storage, read> q_norm: array<f32>;
@group(0) @binding(7) var<storage, read> k_norm: array<f32>;
#if FREQ_FACTORS
@group(0) @binding(8) var<storage, read> ff: array<f32>;
#endif
#endif

const CHUNK: u32 = 64u;
const MAX_HD: u32 = 512u;

#if HEAD_POST
// The head being normed and roped (head_math.wgsl works on it).
var<workgroup> row: array<f32, MAX_HD>;
#endif
#if KV_NEW
// The token's own K and V, used for its key in place of the cache.
var<workgroup> k_new: array<vec4<f32>, 128>;
var<workgroup> v_new: array<f32, MAX_HD>;
#endif

var<workgroup> qs: array<vec4<f32>, 128>;
var<workgroup> partial: array<f32, 256>;
var<workgroup> probs: array<f32, CHUNK>;

fn visible(pos: u32) -> vec2<u32> {
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    return vec2<u32>(lo, min(pos, p.capacity - 1u));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let c = wg.y;
    let hd = p.head_dim;
    let span = visible(positions[0]);
    let first = span.x + c * CHUNK;
    if (first > span.y) {
        return;
    }
    let count = min(CHUNK, span.y + 1u - first);
    let kvh = h / (p.n_head / p.n_kv_head);
    let kv_row = p.n_kv_head * hd;
    let pos = positions[0];
#if HEAD_POST
    for (var d = li; d < hd; d += 256u) {
        row[d] = q[p.q_offset + h * hd + d];
    }
    workgroupBarrier();
    norm_row(li, 1u);
    rope_row(li, f32(pos));
    for (var d = li; d < hd / 4u; d += 256u) {
        qs[d] = vec4<f32>(row[4u * d], row[4u * d + 1u], row[4u * d + 2u], row[4u * d + 3u]) * p.scale;
    }
#else
    for (var d = li; d < hd / 4u; d += 256u) {
        let qb = p.q_offset + h * hd + 4u * d;
        qs[d] = vec4<f32>(q[qb], q[qb + 1u], q[qb + 2u], q[qb + 3u]) * p.scale;
    }
#endif
#if KV_NEW
    // The token's key is the last visible one: in this chunk or not at all.
    let has_new = pos < p.capacity && pos < first + count;
    if (has_new) {
        let ko = p.q_offset + (p.n_head + kvh) * hd;
#if K_IS_V
        let vo = ko;
#else
        let vo = ko + p.n_kv_head * hd;
#endif
        let store = h % (p.n_head / p.n_kv_head) == 0u;
        let slot = (pos * p.n_kv_head + kvh) * hd;
        workgroupBarrier();
        for (var d = li; d < hd; d += 256u) {
            row[d] = q[vo + d];
        }
        workgroupBarrier();
#if V_NORM
        norm_row(li, 0u);
#endif
        for (var d = li; d < hd; d += 256u) {
            v_new[d] = row[d];
            if (store) {
                vc[slot + d] = row[d];
            }
        }
        workgroupBarrier();
        for (var d = li; d < hd; d += 256u) {
            row[d] = q[ko + d];
        }
        workgroupBarrier();
        norm_row(li, 2u);
        rope_row(li, f32(pos));
        for (var d = li; d < hd / 4u; d += 256u) {
            let k4 = vec4<f32>(row[4u * d], row[4u * d + 1u], row[4u * d + 2u], row[4u * d + 3u]);
            k_new[d] = k4;
            if (store) {
                kc[slot / 4u + d] = k4;
            }
        }
    }
#endif
    workgroupBarrier();

    // Four threads per key, each over every fourth vec4 of the head.
    let j = li / 4u;
    let sub = li % 4u;
    var dotv = 0.0;
    if (j < count) {
        let kb = ((first + j) * kv_row + kvh * hd) / 4u;
#if KV_NEW
        if (has_new && first + j == pos) {
            for (var i = sub; i < hd / 4u; i += 4u) {
                dotv += dot(qs[i], k_new[i]);
            }
        } else {
            for (var i = sub; i < hd / 4u; i += 4u) {
                dotv += dot(qs[i], kc[kb + i]);
            }
        }
#else
        for (var i = sub; i < hd / 4u; i += 4u) {
            dotv += dot(qs[i], kc[kb + i]);
        }
#endif
    }
    partial[li] = dotv;
    workgroupBarrier();
    var s = -3.0e38;
    if (li < CHUNK && li < count) {
        s = partial[4u * li] + partial[4u * li + 1u] + partial[4u * li + 2u] + partial[4u * li + 3u];
        s = softcapped(s, p.softcap);
    }
    let m = wg_max(s, li);
    var e = 0.0;
    if (li < CHUNK && li < count) {
        e = exp(s - m);
        probs[li] = e;
    }
    let l = wg_sum(e, li);
    let out = (h * p.max_chunks + c) * (hd + 2u);
    for (var d = li; d < hd; d += 256u) {
        var acc = 0.0;
        for (var jj = 0u; jj < count; jj++) {
#if KV_NEW
            if (has_new && first + jj == pos) {
                acc += probs[jj] * v_new[d];
                continue;
            }
#endif
            acc += probs[jj] * vc[(first + jj) * kv_row + kvh * hd + d];
        }
        part[out + d] = acc;
    }
    if (li == 0u) {
        part[out + hd] = m;
        part[out + hd + 1u] = l;
    }
}
