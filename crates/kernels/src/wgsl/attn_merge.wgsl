// The merge of attn_split.wgsl's per-chunk results, shared by attn_combine.wgsl and the
// product that merges in its prologue (matvec.wgsl, MERGE). The including shader declares
// `part` (the split's scratch), `positions`, with KV_STORE the caches `kc` and `vc`, and `p`
// with n_head, n_kv_head, head_dim, window, max_chunks and capacity.

const CHUNK: u32 = 64u;

// The chunks of keys the token at `pos` sees.
fn visible_chunks(pos: u32) -> u32 {
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    return (min(pos, p.capacity - 1u) - lo) / CHUNK + 1u;
}

// Where head h's chunk c starts in `part`: hd values, then the chunk's max and sum.
fn chunk_at(h: u32, c: u32) -> u32 {
    return (h * p.max_chunks + c) * (p.head_dim + 2u);
}

// Head h's largest chunk max and the inverse of its chunks' total weight, over the
// `lanes` threads from `lane` 0 (the caller reduces `m` with max, then `l` with a sum).
fn chunk_max(h: u32, chunks: u32, lane: u32, lanes: u32) -> f32 {
    var m = -3.0e38;
    for (var c = lane; c < chunks; c += lanes) {
        m = max(m, part[chunk_at(h, c) + p.head_dim]);
    }
    return m;
}

fn chunk_weight(h: u32, chunks: u32, m: f32, lane: u32, lanes: u32) -> f32 {
    var l = 0.0;
    for (var c = lane; c < chunks; c += lanes) {
        let o = chunk_at(h, c) + p.head_dim;
        l += exp(part[o] - m) * part[o + 1u];
    }
    return l;
}

#if KV_STORE
// Values first..first + n of the token's K and V rows (all KV heads), which the split left
// after the partial results, into the caches at its position.
fn store_kv(pos: u32, first: u32, n: u32, li: u32) {
    let row = p.n_kv_head * p.head_dim;
    let kv_in = p.n_head * p.max_chunks * (p.head_dim + 2u);
    for (var e = first + li; e < first + n; e += 256u) {
        kc[pos * row + e] = part[kv_in + e];
        vc[pos * row + e] = part[kv_in + row + e];
    }
}
#endif
