// The merge of attn_split.wgsl's per-chunk results, shared by attn_combine.wgsl and the
// product that merges in its prologue (matvec.wgsl, MERGE); attn_split.wgsl writes its
// results where chunk_at and kv_at say. The split's shape comes as a
// `Split`; the including shader declares the storage buffers (WGSL passes none to a
// function): `part` (the split's scratch, as vec4s) and, with KV_STORE, the caches `kc` and
// `vc`.

struct Split {
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    window: u32,
    max_chunks: u32,
    capacity: u32,
    // Rows of each sequence's cache slot (attn_split.wgsl's tokens of several sequences); 0:
    // one sequence.
    slot_rows: u32,
}

const CHUNK: u32 = 64u;

// The chunks of keys the token at `pos` sees.
fn visible_chunks(pos: u32, sp: Split) -> u32 {
    var lo = 0u;
    if (sp.window > 0u && pos + 1u > sp.window) {
        lo = pos + 1u - sp.window;
    }
    if (sp.slot_rows > 0u) {
        lo = max(lo, pos - pos % sp.slot_rows);
    }
    return (min(pos, sp.capacity - 1u) - lo) / CHUNK + 1u;
}

// Where head h's chunk c starts in `part`: head_dim / 4 vec4s of values, then one holding the
// chunk's max and sum. Whole vec4s, so that a value's merge loads 16 bytes a chunk.
fn chunk_at(h: u32, c: u32, sp: Split) -> u32 {
    return (h * sp.max_chunks + c) * (sp.head_dim / 4u + 1u);
}

fn chunk_ml(h: u32, c: u32, sp: Split) -> vec2<f32> {
    return part[chunk_at(h, c, sp) + sp.head_dim / 4u].xy;
}

// The running max and sum of head h's chunks lane, lane + lanes, ..., one load a chunk: the
// caller takes the largest max m over its lanes and sums each lane's sum * exp(its max - m).
fn chunk_stats(h: u32, chunks: u32, lane: u32, lanes: u32, sp: Split) -> vec2<f32> {
    var m = -3.0e38;
    var l = 0.0;
    for (var c = lane; c < chunks; c += lanes) {
        let ml = chunk_ml(h, c, sp);
        let top = max(m, ml.x);
        l = l * exp(m - top) + ml.y * exp(ml.x - top);
        m = top;
    }
    return vec2<f32>(m, l);
}

// Values 4 d4 .. 4 d4 + 3 of head h summed over its chunks, each weighted exp(m_c - m). Four
// chunks' loads are issued before any is used, so that their latencies overlap rather than
// add up chunk after chunk.
fn merged4(h: u32, d4: u32, chunks: u32, m: f32, sp: Split) -> vec4<f32> {
    let stride = sp.head_dim / 4u + 1u;
    // Where a chunk's (max, sum) vec4 is, after its values.
    let ml = sp.head_dim / 4u;
    var acc = vec4<f32>(0.0);
    var c = 0u;
    for (; c + 4u <= chunks; c += 4u) {
        let o = chunk_at(h, c, sp);
        let v0 = part[o + d4];
        let v1 = part[o + stride + d4];
        let v2 = part[o + 2u * stride + d4];
        let v3 = part[o + 3u * stride + d4];
        let e = exp(vec4<f32>(part[o + ml].x, part[o + stride + ml].x, part[o + 2u * stride + ml].x, part[o + 3u * stride + ml].x) - m);
        acc += e.x * v0 + e.y * v1 + e.z * v2 + e.w * v3;
    }
    for (; c < chunks; c++) {
        let o = chunk_at(h, c, sp);
        acc += exp(part[o + ml].x - m) * part[o + d4];
    }
    return acc;
}

// Where token r (of `tokens`) has its K row (all KV heads) in `part`, its V row after it:
// after every token's heads' chunks.
fn kv_at(tokens: u32, r: u32, sp: Split) -> u32 {
    let row4 = sp.n_kv_head * sp.head_dim / 4u;
    return tokens * sp.n_head * sp.max_chunks * (sp.head_dim / 4u + 1u) + 2u * r * row4;
}

#if KV_STORE
// Values first..first + n (whole vec4s) of a token's K and V rows (all KV heads), which the
// split left at kv_in, into the caches at its position.
fn store_kv(pos: u32, first: u32, n: u32, li: u32, sp: Split, kv_in: u32) {
    let row = sp.n_kv_head * sp.head_dim;
    for (var e4 = first / 4u + li; e4 < (first + n) / 4u; e4 += 256u) {
        let k = part[kv_in + e4];
        let v = part[kv_in + row / 4u + e4];
        for (var i = 0u; i < 4u; i++) {
            kc[pos * row + 4u * e4 + i] = k[i];
            vc[pos * row + 4u * e4 + i] = v[i];
        }
    }
}
#endif
