// The prefill attention kernels' parameters, the bindings that say which keys each token
// sees, and those keys (attention.wgsl's header describes them).

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
    slot_rows: u32,
}

@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;
#if SPANS
// Per token, the last key it sees when past its own position (an image's other tokens).
@group(0) @binding(6) var<storage, read> last_key: array<u32>;
#endif
#if FIRST_KEYS
@group(0) @binding(7) var<storage, read> first_key: array<u32>;
#endif

// Token m's keys: the first and last it sees.
fn key_range(m: u32) -> vec2<u32> {
    let pos = positions[m];
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
#if FIRST_KEYS
    lo = first_key[m];
#endif
    if (p.slot_rows > 0u) {
        lo = max(lo, pos - pos % p.slot_rows);
    }
    var hi = min(pos, p.capacity - 1u);
#if SPANS
    hi = min(max(pos, last_key[m]), p.capacity - 1u);
#endif
    return vec2<u32>(lo, hi);
}
