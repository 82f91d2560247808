// Merges the per-chunk results of attn_split.wgsl: one workgroup per query head rescales each
// chunk by exp(m_c - max) and divides by the total weight.
// KV_STORE: the split left each token's K and V after the partial results; the workgroup of
// each KV group's first query head stores them in the cache row of the token's position.
// Several tokens (workgroup y): token r's heads are the split's heads r * n_head ..., and its
// output row r.

struct Params {
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    window: u32,
    max_chunks: u32,
    capacity: u32,
    slot_rows: u32,
}

// The split's shape for attn_merge.wgsl.
fn split_of_p() -> Split {
    return Split(p.n_head, p.n_kv_head, p.head_dim, p.window, p.max_chunks, p.capacity, p.slot_rows);
}

@group(0) @binding(0) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#if KV_STORE
@group(0) @binding(4) var<storage, read_write> kc: array<f32>;
@group(0) @binding(5) var<storage, read_write> vc: array<f32>;
#endif

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let h = wg.x;
    let r = wg.y;
    let hh = r * p.n_head + h;
    let hd = p.head_dim;
    let pos = positions[r];
    let chunks = visible_chunks(pos, split_of_p());
    let s = chunk_stats(hh, chunks, li, 256u, split_of_p());
    let m = wg_max(s.x, li);
    let l = wg_sum(s.y * exp(s.x - m), li);
    for (var d4 = li; d4 < hd / 4u; d4 += 256u) {
        let v = merged4(hh, d4, chunks, m, split_of_p()) / l;
        for (var i = 0u; i < 4u; i++) {
            out[hh * hd + 4u * d4 + i] = v[i];
        }
    }
#if KV_STORE
    let group = p.n_head / p.n_kv_head;
    if (h % group == 0u && pos < p.capacity) {
        store_kv(pos, (h / group) * hd, hd, li, split_of_p(), kv_at(nwg.y, r, split_of_p()));
    }
#endif
}
