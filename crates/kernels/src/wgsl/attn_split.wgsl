// Decode attention split over the keys (flash-decoding): workgroup (h, c) takes query head
// h and the c-th chunk of CHUNK (64) visible keys, and writes the chunk's unnormalised
// output, then its running max and sum, where attn_merge.wgsl's chunk_at says. attn_combine.wgsl then merges the chunks. The grid covers the
// largest context; chunks past the visible keys exit.
//
// Several tokens (workgroup z: the token): the tokens of a batch of sequences' decode steps,
// whose cache holds slot_rows rows per sequence; a token sees only its own slot's keys, and
// its chunks follow the previous token's heads' (token r's head h is head r * n_head + h of
// the scratch). Token r's projection starts q_stride floats after token r - 1's.
//
// HEAD_POST: head_post.wgsl's work for the tokens, here rather than in a dispatch of its
// own. Each workgroup norms and ropes its query head from the raw projection; with KV_NEW (a
// layer that owns its cache) the workgroups whose chunk holds the token's position (its last
// key) also norm and rope its K (and norm its V) in workgroup memory and use them for that
// key; those of the first query head of each KV group leave them after the partial results
// (attn_merge.wgsl's kv_at), where attn_combine.wgsl (KV_STORE) copies them into the cache
// for later steps. The caches stay read-only here: no workgroup of this dispatch reads those
// rows (each token's is the last of its own slot).

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
    q_stride: u32,
    slot_rows: u32,
}

#if HEAD_POST
// The head's numbers for head_math.wgsl.
fn head_of_p() -> Head {
    return Head(p.head_dim, p.eps, Rope(p.n_rot, p.base, p.freq_scale));
}
#endif

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<storage, read_write> part: array<vec4<f32>>;
@group(0) @binding(5) var<uniform> p: Params;
#if HEAD_POST
@group(0) @binding(6) var<storage, read> q_norm: array<f32>;
@group(0) @binding(7) var<storage, read> k_norm: array<f32>;
#if FREQ_FACTORS
@group(0) @binding(8) var<storage, read> ff: array<f32>;
#endif
#endif

// The split's shape for attn_merge.wgsl (its CHUNK keys a chunk, and where chunk_at and
// kv_at put the results).
fn split_of_p() -> Split {
    return Split(p.n_head, p.n_kv_head, p.head_dim, p.window, p.max_chunks, p.capacity, p.slot_rows);
}

const MAX_HD: u32 = 512u;
// The head dimension as a pipeline constant (p.head_dim holds the same): the key and value
// loops get fixed trip counts, so every load of a thread can be in flight at once.
override HD: u32 = 256u;

#if HEAD_POST
// The query head being normed and roped and, with KV_NEW, the token's own K and V (used for
// its key in place of the cache).
#if KV_NEW
var<workgroup> heads: array<array<f32, MAX_HD>, 3>;
const HK: u32 = 1u;
const HV: u32 = 2u;
#else
var<workgroup> heads: array<array<f32, MAX_HD>, 1>;
#endif
const HQ: u32 = 0u;

// Values 4i..4i+3 of head r.
fn head4(r: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(heads[r][4u * i], heads[r][4u * i + 1u], heads[r][4u * i + 2u], heads[r][4u * i + 3u]);
}
#endif

var<workgroup> qs: array<vec4<f32>, 128>;
var<workgroup> partial: array<f32, 256>;
var<workgroup> probs: array<f32, CHUNK>;
var<workgroup> vsum: array<vec4<f32>, 256>;

// Loops whose loads must be in flight together take them in batches of eight written out:
// a browser's compiler (Tint, with robustness) gives every loop an iteration counter, after
// which the driver no longer unrolls it, and a loop of one load an iteration then waits on
// each load in turn (this kernel ran at half speed in Chrome's WebGPU).

// q . k over thread `sub`'s vec4s i, i + 4, ..., i + 28 of the key at vec4 `kb` (those past
// the head add nothing; their loads stay inside it).
fn key_dot8(kb: u32, i: u32) -> f32 {
    let last = HD / 4u - 1u;
    let k0 = kc[kb + min(i, last)];
    let k1 = kc[kb + min(i + 4u, last)];
    let k2 = kc[kb + min(i + 8u, last)];
    let k3 = kc[kb + min(i + 12u, last)];
    let k4 = kc[kb + min(i + 16u, last)];
    let k5 = kc[kb + min(i + 20u, last)];
    let k6 = kc[kb + min(i + 24u, last)];
    let k7 = kc[kb + min(i + 28u, last)];
    return dot(q_at(i), k0) + dot(q_at(i + 4u), k1) + dot(q_at(i + 8u), k2) + dot(q_at(i + 12u), k3)
        + dot(q_at(i + 16u), k4) + dot(q_at(i + 20u), k5) + dot(q_at(i + 24u), k6) + dot(q_at(i + 28u), k7);
}

// The query's vec4 i, zero past the head.
fn q_at(i: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), qs[min(i, HD / 4u - 1u)], i < HD / 4u);
}

// The probability-weighted sum of value vec4 `vb` over keys jj, jj + groups, ...,
// jj + 7 groups of the chunk (those from `cached` on add nothing; their loads stay inside the
// chunk's first `max(cached, 1)` rows).
fn value_sum8(first: u32, vb: u32, jj: u32, groups: u32, cached: u32) -> vec4<f32> {
    let last = max(cached, 1u) - 1u;
    let stride = p.n_kv_head * HD / 4u;
    var acc = vec4<f32>(0.0);
    let v0 = vc[(first + min(jj, last)) * stride + vb];
    let v1 = vc[(first + min(jj + groups, last)) * stride + vb];
    let v2 = vc[(first + min(jj + 2u * groups, last)) * stride + vb];
    let v3 = vc[(first + min(jj + 3u * groups, last)) * stride + vb];
    let v4 = vc[(first + min(jj + 4u * groups, last)) * stride + vb];
    let v5 = vc[(first + min(jj + 5u * groups, last)) * stride + vb];
    let v6 = vc[(first + min(jj + 6u * groups, last)) * stride + vb];
    let v7 = vc[(first + min(jj + 7u * groups, last)) * stride + vb];
    acc += weighted(v0, jj, cached);
    acc += weighted(v1, jj + groups, cached);
    acc += weighted(v2, jj + 2u * groups, cached);
    acc += weighted(v3, jj + 3u * groups, cached);
    acc += weighted(v4, jj + 4u * groups, cached);
    acc += weighted(v5, jj + 5u * groups, cached);
    acc += weighted(v6, jj + 6u * groups, cached);
    acc += weighted(v7, jj + 7u * groups, cached);
    return acc;
}

// Key jj's value times its probability; nothing for keys from `cached` on (a select, not a
// product: a stale row there may hold anything).
fn weighted(v: vec4<f32>, jj: u32, cached: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), probs[min(jj, CHUNK - 1u)] * v, jj < cached);
}

fn visible(pos: u32) -> vec2<u32> {
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    if (p.slot_rows > 0u) {
        lo = max(lo, pos - pos % p.slot_rows);
    }
    return vec2<u32>(lo, min(pos, p.capacity - 1u));
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let h = wg.x;
    let c = wg.y;
    let r = wg.z;
    let qr = p.q_offset + r * p.q_stride;
    let hd = HD;
    let span = visible(positions[r]);
    let first = span.x + c * CHUNK;
    if (first > span.y) {
        return;
    }
    let count = min(CHUNK, span.y + 1u - first);
    let kvh = h / (p.n_head / p.n_kv_head);
    let kv_row = p.n_kv_head * hd;
    let pos = positions[r];
#if KV_NEW
    // The token's key is the last visible one: in this chunk or not at all.
    let has_new = pos < p.capacity && pos < first + count;
    let ko = qr + (p.n_head + kvh) * hd;
#if K_IS_V
    let vo = ko;
#else
    let vo = ko + p.n_kv_head * hd;
#endif
#else
    let has_new = false;
#endif
#if HEAD_POST
    // Every load first (Q, and the token's K and V where this chunk holds it), then the norms.
    for (var d = li; d < hd; d += 256u) {
        heads[HQ][d] = q[qr + h * hd + d];
#if KV_NEW
        if (has_new) {
            heads[HK][d] = q[ko + d];
            heads[HV][d] = q[vo + d];
        }
#endif
    }
    workgroupBarrier();
    norm_row(HQ, li, 1u, head_of_p());
    // A token at cache row pos of a slot has RoPE position pos % slot_rows.
    let rope_pos = f32(select(pos, pos % p.slot_rows, p.slot_rows > 0u));
    rope_row(HQ, li, rope_pos, head_of_p());
    for (var d = li; d < hd / 4u; d += 256u) {
        qs[d] = head4(HQ, d) * p.scale;
    }
#if KV_NEW
    if (has_new) {
#if V_NORM
        norm_row(HV, li, 0u, head_of_p());
#endif
        norm_row(HK, li, 2u, head_of_p());
        rope_row(HK, li, rope_pos, head_of_p());
        if (h % (p.n_head / p.n_kv_head) == 0u) {
            let kv_out = kv_at(nwg.z, r, split_of_p()) + kvh * hd / 4u;
            for (var d4 = li; d4 < hd / 4u; d4 += 256u) {
                part[kv_out + d4] = head4(HK, d4);
                part[kv_out + kv_row / 4u + d4] = head4(HV, d4);
            }
        }
    }
#endif
#else
    for (var d = li; d < hd / 4u; d += 256u) {
        let qb = qr + h * hd + 4u * d;
        qs[d] = vec4<f32>(q[qb], q[qb + 1u], q[qb + 2u], q[qb + 3u]) * p.scale;
    }
#endif
    workgroupBarrier();

    // Four threads per key, each over every fourth vec4 of the head.
    let j = li / 4u;
    let sub = li % 4u;
    var dotv = 0.0;
    // The token's own key, when this chunk holds it, is the chunk's last.
    let fresh = has_new && j + 1u == count;
    let steps = (HD / 4u + 3u) / 4u;
    if (j < count && !fresh) {
        let kb = ((first + j) * kv_row + kvh * hd) / 4u;
        for (var t = 0u; t < steps; t += 8u) {
            dotv += key_dot8(kb, sub + 4u * t);
        }
    }
#if KV_NEW
    if (fresh) {
        for (var t = 0u; t < steps; t++) {
            let i = sub + 4u * t;
            if (i < HD / 4u) {
                dotv += dot(qs[i], head4(HK, i));
            }
        }
    }
#endif
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
    let out = chunk_at(r * p.n_head + h, c, split_of_p());
    // Values: each thread takes one vec4 of the head over every `groups`-th key, so its loads
    // are 16 bytes and few (a thread per value over all 64 keys waited on 64 loads); the key
    // groups then meet in workgroup memory.
    let h4 = HD / 4u;
    let d4 = li % h4;
    let kg = li / h4;
    let groups = 256u / h4;
    var acc = vec4<f32>(0.0);
    let cached = count - select(0u, 1u, has_new);
    if (kg < groups) {
        let vb = kvh * h4 + d4;
        for (var jj = kg; jj < cached; jj += 8u * groups) {
            acc += value_sum8(first, vb, jj, groups, cached);
        }
#if KV_NEW
        if (has_new && cached % groups == kg) {
            acc += probs[cached] * head4(HV, d4);
        }
#endif
    }
    vsum[li] = acc;
    workgroupBarrier();
    if (li < h4) {
        var total = vsum[li];
        for (var g = 1u; g < groups; g++) {
            total += vsum[g * h4 + li];
        }
        part[out + li] = total;
    }
    if (li == 0u) {
        part[out + h4] = vec4<f32>(m, l, 0.0, 0.0);
    }
}
