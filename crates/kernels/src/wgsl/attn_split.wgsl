// Decode attention split over the keys (flash-decoding): workgroup (h, c) takes query head
// h and the c-th chunk of 64 visible keys, and writes the chunk's unnormalised output with its
// running max and sum to part[(h * max_chunks + c) * (hd + 2) ..]. attn_combine.wgsl then
// merges the chunks. The grid covers the largest context; chunks past the visible keys exit.

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
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

const CHUNK: u32 = 64u;
const MAX_HD: u32 = 512u;

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
    let row = p.n_kv_head * hd;
    for (var d = li; d < hd / 4u; d += 256u) {
        let qb = p.q_offset + h * hd + 4u * d;
        qs[d] = vec4<f32>(q[qb], q[qb + 1u], q[qb + 2u], q[qb + 3u]) * p.scale;
    }
    workgroupBarrier();

    // Four threads per key, each over every fourth vec4 of the head.
    let j = li / 4u;
    let sub = li % 4u;
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
            acc += probs[jj] * vc[(first + jj) * row + kvh * hd + d];
        }
        part[out + d] = acc;
    }
    if (li == 0u) {
        part[out + hd] = m;
        part[out + hd + 1u] = l;
    }
}
