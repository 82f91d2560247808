// Everything between the QKV projection and attention, one workgroup per (token, head):
// per-head RMS norm of Q and K (with their weights) and of V (no weight, when V_NORM), NeoX
// RoPE of Q and K, and the store of K and V into the cache slot of the token's position.
//
// qkv holds, per token, [q: n_head*hd | k: n_kv*hd | v: n_kv*hd] (`stride` floats apart); with
// K_IS_V the v part is absent and V is the raw (un-normed) K. Q is rewritten in place.
// Workgroups 0..n_head-1 of a token take Q heads, the next n_kv take K/V heads. With
// slot_rows > 0 the cache holds several sequences, slot_rows rows each: a token at cache row
// pos has RoPE position pos % slot_rows.

struct Params {
    n_head: u32,
    n_kv: u32,
    head_dim: u32,
    n_rot: u32,
    stride: u32,
    tokens: u32,
    capacity: u32,
    eps: f32,
    base: f32,
    freq_scale: f32,
    slot_rows: u32,
}

// The head's numbers for head_math.wgsl.
fn head_of_p() -> Head {
    return Head(p.head_dim, p.eps, Rope(p.n_rot, p.base, p.freq_scale));
}

@group(0) @binding(0) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(1) var<storage, read> q_norm: array<f32>;
@group(0) @binding(2) var<storage, read> k_norm: array<f32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(5) var<storage, read> positions: array<u32>;
@group(0) @binding(6) var<uniform> p: Params;
#if FREQ_FACTORS
@group(0) @binding(7) var<storage, read> ff: array<f32>;
#endif

const MAX_HD: u32 = 512u;
var<workgroup> heads: array<array<f32, MAX_HD>, 1>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.x;
    let t = wg.y;
    let hd = p.head_dim;
    let pos = positions[t];
    let rope_pos = f32(select(pos, pos % p.slot_rows, p.slot_rows > 0u));
    let base = t * p.stride;
    if (head < p.n_head) {
        let o = base + head * hd;
        for (var d = li; d < hd; d += 256u) {
            heads[0][d] = qkv[o + d];
        }
        workgroupBarrier();
        norm_row(0u, li, 1u, head_of_p());
        rope_row(0u, li, rope_pos, head_of_p());
        for (var d = li; d < hd; d += 256u) {
            qkv[o + d] = heads[0][d];
        }
        return;
    }
    let kvh = head - p.n_head;
    let ko = base + (p.n_head + kvh) * hd;
    let slot = (pos * p.n_kv + kvh) * hd;
    let in_cache = pos < p.capacity;
    // V first: it may be the raw K, which the K steps below overwrite in `row`.
#if K_IS_V
    let vo = ko;
#else
    let vo = base + (p.n_head + p.n_kv + kvh) * hd;
#endif
    for (var d = li; d < hd; d += 256u) {
        heads[0][d] = qkv[vo + d];
    }
    workgroupBarrier();
#if V_NORM
    norm_row(0u, li, 0u, head_of_p());
#endif
    if (in_cache) {
        for (var d = li; d < hd; d += 256u) {
            v_cache[slot + d] = heads[0][d];
        }
    }
    workgroupBarrier();
    for (var d = li; d < hd; d += 256u) {
        heads[0][d] = qkv[ko + d];
    }
    workgroupBarrier();
    norm_row(0u, li, 2u, head_of_p());
    rope_row(0u, li, rope_pos, head_of_p());
    if (in_cache) {
        for (var d = li; d < hd; d += 256u) {
            k_cache[slot + d] = heads[0][d];
        }
    }
}
