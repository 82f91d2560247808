// Two-stage argmax over n values. Stage PARTIAL: workgroup g reduces values
// [g*CHUNK, (g+1)*CHUNK) to (value, index) in part[2g], part[2g+1]. Stage FINAL: one
// workgroup reduces the partials and writes the index to result[0] and the value's bits to
// result[1]. Ties go to the smaller index; NaN and -inf count as -3.4e38.
//
// GUMBEL: each logit first becomes logit / temperature + Gumbel(seed, step, index) noise, so
// the argmax is an exact sample from softmax(logits / temperature).
//
// ROWS: `rows` rows of n values one after another (a batched decode step's logits), each with
// its own draw (`draws[row]`: GUMBEL's numbers, or the plain argmax); the partial stage's
// workgroups are (chunk, row), the final stage's one a row, its result at 2 row.

struct Params {
    n: u32,
    parts: u32,
    seed: u32,
    step: u32,
    inv_temp: f32,
}

const CHUNK: u32 = 1024u;

#if PARTIAL
@group(0) @binding(0) var<storage, read> x: array<f32>;
#else
@group(0) @binding(0) var<storage, read_write> result: array<u32>;
#endif
@group(0) @binding(1) var<storage, read_write> part: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;
#if ROWS
#if PARTIAL
// A row's draw: Gumbel noise at its seed, step and 1 / temperature where `gumbel` is 1.
struct Draw {
    seed: u32,
    step: u32,
    inv_temp: f32,
    gumbel: u32,
}

@group(0) @binding(3) var<storage, read> draws: array<Draw>;
#endif
#endif

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

// PCG-style hash: the same stream on CPU and GPU for (seed, step, index).
fn hash(a: u32) -> u32 {
    var s = a * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn gumbel(seed: u32, step: u32, i: u32) -> f32 {
    let h = hash(hash(hash(seed) ^ step) ^ i);
    // Uniform in (0, 1), never exactly 0 or 1.
    let u = (f32(h >> 8u) + 0.5) / 16777216.0;
    return -log(-log(u));
}

fn better(v: f32, i: u32, ov: f32, oi: u32) -> bool {
    return v > ov || (v == ov && i < oi);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    var best = -3.4e38;
    var besti = 0xFFFFFFFFu;
#if ROWS
#if PARTIAL
    let row = wg.y;
    let d = draws[row];
#else
    let row = wg.x;
#endif
#else
    let row = 0u;
#endif
    // This row's partials.
    let pb = 2u * row * p.parts;
#if PARTIAL
    let start = wg.x * CHUNK;
    for (var j = li; j < CHUNK; j += 256u) {
        let i = start + j;
        if (i < p.n) {
            var v = x[row * p.n + i];
#if GUMBEL
            v = v * p.inv_temp + gumbel(p.seed, p.step, i);
#endif
#if ROWS
            if (d.gumbel != 0u) {
                v = v * d.inv_temp + gumbel(d.seed, d.step, i);
            }
#endif
            // NaN and -inf (also after the noise) count as the lowest value, so an index always
            // wins and a model computing NaN shows in the value left beside it.
            if (!(v > -3.4e38)) {
                v = -3.4e38;
            }
            if (better(v, i, best, besti)) {
                best = v;
                besti = i;
            }
        }
    }
#else
    for (var j = li; j < p.parts; j += 256u) {
        let v = bitcast<f32>(part[pb + 2u * j]);
        let i = part[pb + 2u * j + 1u];
        if (better(v, i, best, besti)) {
            best = v;
            besti = i;
        }
    }
#endif
    bv[li] = best;
    bi[li] = besti;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (li < s && better(bv[li + s], bi[li + s], bv[li], bi[li])) {
            bv[li] = bv[li + s];
            bi[li] = bi[li + s];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
#if PARTIAL
        part[pb + 2u * wg.x] = bitcast<u32>(bv[0]);
        part[pb + 2u * wg.x + 1u] = bi[0];
#else
        result[2u * row] = bi[0];
        result[2u * row + 1u] = bitcast<u32>(bv[0]);
#endif
    }
}
