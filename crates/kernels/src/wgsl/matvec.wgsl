// The one-token matrix-vector product y[m, out_offset + r] = sum_k W[r, k] * x[m, k], reading
// the weights straight from memory.
//
// A workgroup of 256 threads takes 256 / TPR groups of RPT consecutive rows. The TPR threads of
// a group stride over the rows' steps (STEP values, per dtype below); each thread dequantizes
// the step of each of its RPT rows against one load of the input, so the input is read once
// per RPT rows rather than once per row. Lanes of a group are summed with subgroup shuffles (and, for groups wider
// than the SG-lane subgroups, their subgroups' sums through workgroup memory), or without
// subgroups through workgroup memory alone. Tokens (few) are grid.z.
//
// GEGLU_OUT: rows are gate and up rows interleaved (2i: gate_i, 2i+1: up_i); the output is
// y[out_offset + i] = gelu_tanh(gate_i . x) * (up_i . x), a gated FFN's activation.
//
// RESIDUAL (tokens of k values): the residual step of the stream x runs here
// rather than in a dispatch of its own. Every workgroup computes h = (x + norm(delta) * post)
// * scale into workgroup memory, and the first also writes it to res_out for later readers
// (res_out is not x: other workgroups are still reading x). The product's input is h, or with
// PRENORM norm(h) * pre (the next block's norm), which the first workgroup writes to normed;
// the steps read it from workgroup memory.
// MOE_DELTA (with RESIDUAL, one token): delta is a mixture-of-experts FFN's output, computed
// here as moe.wgsl's MIX computes it (from the dense branch at binding 5 and the experts'
// row an EXPERTS_SUM product mixed, or with MOE_WEIGHTED the MOE_K slots' rows and weights),
// so that no dispatch of its own waits between the experts and this product.
// EXPERTS_SUM (with EXPERTS): token m's G = x_group slots in one product, weighted by the
// route's expert_w and summed: y[m] = sum_j expert_w[mG + j] * (W_sel[mG + j] . x[mG + j]).
// The slots' input rows (k values each) are read as one row of G segments, each against its
// slot's expert, so the experts' mix leaves the product as one row per token rather than a
// row per slot that the next dispatch would read back and weigh. A tile's dispatch skips
// segments whose expert lives in another tile; with p.accumulate it adds to what the tiles
// before it wrote.
// ROUTE_IN (with EXPERTS): the slots' experts come from the router's logits rather than sel:
// every workgroup routes its token (route.wgsl) and takes the expert of its slot's rank, and
// the first workgroup of each slot stores the slot's expert in sel and its weight in
// expert_w, for the products and the mix after it. No dispatch of its own routes between the
// router's product and this one.
// NORM_IN (tokens of k values): the input is norm(x) * pre, which every workgroup computes
// into its memory (no dispatch of its own normalises the row first).
// GELU_TIMES: y[out_offset + i] = gelu_tanh(row_i . x) * times[times_offset + i].
// LORA: every row r (W's row lora_first_row + r) gains an adapter's low-rank delta before
// its output is formed (the gated activation, the rounding): the dot product of t (x A^T,
// computed before this product) with B's row. t holds lora_t_stride values per token, one
// segment of lora_rank for each projection stacked in W; a row's segment is its range
// (from lora_seg1 segment 1, from lora_seg2 segment 2) or with lora_pairs its parity
// (gate/up rows interleaved). The lanes of a row's group share the delta's rank terms and
// add them to their sums before they are reduced: no dispatch of its own adds it.
//
// MERGE (one token): the input is a split decode attention's output (attn_split.wgsl), merged
// here rather than by attn_combine.wgsl in a dispatch of its own: every workgroup merges the
// chunks' partial results into workgroup memory, and with KV_STORE the first also stores the
// token's K and V, which the split left after them, in the caches.
//
// INT8_X (Q4_K and Q6_K): every workgroup first rounds the input (with RESIDUAL or MERGE, the
// one its prologue computed) to 8-bit integers, with one scale per 32 values, into workgroup
// memory; the steps then multiply 4 weight values by 4
// inputs in one integer dot product instead of converting each weight to a float (the
// conversions bound a float head's speed). As ggml's quantized dot products do.
//
// Activations as 8-bit integers (one token), for the FFN: with Q8_OUT (and GEGLU_OUT) the
// gated activations are written rounded, each workgroup's 32s with one scale, as INT8_X
// rounds an input; with XQ_IN (and INT8_X) the input comes rounded from such a product, so
// no workgroup rounds it again. The rounded vector (binding 2 of the one, 1 of the other)
// is k / 4 words of four integers, then from word xs_words per 16 values its 32's scale
// and the sum of its 16 values as rounded (two f32 words). Each workgroup of a long-row
// product then reads a quarter of the bytes a float input takes.
//
// TOKENS (with INT8_X, a few tokens: several sequences' decode steps): MT tokens a workgroup
// (grid.z counts groups of MT). Every workgroup rounds its MT tokens' inputs into its memory
// (XQ and XC hold all of them); each step's weights are then loaded and decoded once
// (step_decode: into the bytes and scales the integer dots take) and dotted with every
// token's input, so the tokens share the weight loads and their decoding, where one token a
// workgroup would read and decode every weight once per token. Plain or gated rows out.

struct Params {
    k: u32,
    n: u32,
    row_bytes: u32,
    out_offset: u32,
    m: u32,
    x_stride: u32,
    y_stride: u32,
    softcap: f32,
    // EXPERTS: the tile holds experts first_expert.. stacked, n rows each; slot z computes
    // expert sel[z] on input row z / x_group.
    first_expert: u32,
    experts_here: u32,
    x_group: u32,
    eps: f32,
    scale: f32,
    times_offset: u32,
    // MERGE: the attention's shape (attn_combine.wgsl's parameters).
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    window: u32,
    max_chunks: u32,
    capacity: u32,
    // Q8_OUT, XQ_IN: where the rounded vector's scales start (words).
    xs_words: u32,
    // EXPERTS_SUM: add to y rather than overwrite it (the tiles after the first).
    accumulate: u32,
    // ROUTE_IN: the router's experts, and whether expert_scale multiplies their weights.
    n_expert: u32,
    has_scale: u32,
    // LORA: the delta's rank, t's values per token, the segments' first rows (or parity),
    // and the tile's first row of W.
    lora_rank: u32,
    lora_t_stride: u32,
    lora_seg1: u32,
    lora_seg2: u32,
    lora_pairs: u32,
    lora_first_row: u32,
}

// A step's inputs: XN vec4s of floats, or with INT8_X XN words of four 8-bit integers; and
// what every row's step shares (XS: per-part input scales d and sums s, by dtype).
#if INT8_X
alias XIn = array<u32, XN>;
#else
alias XIn = array<vec4<f32>, XN>;
#endif

struct XS {
    d: vec4<f32>,
    s: vec4<f32>,
}

// Binding 0, the weights: bytes.wgsl (Q4_K's as 16-byte words, w4).

// A step is the STEP values of a row one lane takes at a time; xv holds their XN vec4s of the
// input, which x_vec places in the row. Steps are small so that a lane holds few inputs in
// registers: more lanes fit on a core, and more loads are in flight.
#if DT_Q4_K
// Q4_K, 32 values a step: half of one 32-byte group of nibbles (its 16 low nibbles are values
// of sub-block 2j, its 16 high nibbles of sub-block 2j + 1) and its block's 16-byte header, as
// two 16-byte loads. Step u is block u / 8, group j = (u / 2) % 4, half u % 2.
const STEP: u32 = 32u;
const XN: u32 = 8u;

fn x_vec(u: u32, i: u32) -> u32 {
    return 8u * u - 4u * (u & 1u) + i + 4u * (i / 4u);
}

struct Raw {
    hdr: vec4<u32>,
    q: vec4<u32>,
}

fn step_load(rb: u32, u: u32) -> Raw {
    let o16 = (rb + (u >> 3u) * 144u) >> 4u;
    return Raw(w4[o16], w4[o16 + 1u + 2u * ((u >> 1u) & 3u) + (u & 1u)]);
}

// The scales (x, y) and mins (z, w) of sub-blocks 2j and 2j + 1 from a block's header.
fn k4_pair(hdr: vec4<u32>, j: u32) -> vec4<f32> {
    let a = k4_header_scale_min(hdr, 2u * j);
    let b = k4_header_scale_min(hdr, 2u * j + 1u);
    return vec4<f32>(a.x, b.x, a.y, b.y);
}

fn step_dot(r: Raw, u: u32, xv: ptr<function, XIn>, xs: XS) -> f32 {
    let dm = unpack2x16float(r.hdr.x);
    let sm = k4_pair(r.hdr, (u >> 1u) & 3u);
    let lh = nibble_dots(r.q, xv) * xs.d.xy;
    return dm.x * dot(sm.xy, lh) - dm.y * dot(sm.zw, xs.s.xy);
}

#if INT8_X
// xs.d: the scales of the low- and high-nibble inputs; xs.s: their sums, which the mins
// multiply (the same for every row, so read once per step).
fn step_pre(u: u32, xv: ptr<function, XIn>) -> XS {
    let lo = xscale(2u * u - (u & 1u));
    let hi = xscale(2u * u - (u & 1u) + 2u);
    return XS(vec4<f32>(lo.x, hi.x, 0.0, 0.0), vec4<f32>(lo.y, hi.y, 0.0, 0.0));
}

// The integer dot products of the step's low and high nibbles with their inputs.
fn nibble_dots(q: vec4<u32>, xv: ptr<function, XIn>) -> vec2<f32> {
    var lo = 0i;
    var hi = 0i;
    for (var i = 0u; i < 4u; i++) {
        lo += dot4I8Packed(q[i] & 0x0F0F0F0Fu, (*xv)[i]);
        hi += dot4I8Packed((q[i] >> 4u) & 0x0F0F0F0Fu, (*xv)[4u + i]);
    }
    return vec2<f32>(f32(lo), f32(hi));
}

#if TOKENS
// TOKENS: a step's weights as every token's dot product takes them, decoded once for all of
// them: the nibbles as bytes, the sub-blocks' scales and mins, the block's multipliers. (The
// one-token form decodes where it dots: measured 2% faster there.)
struct Dec {
    lo: vec4<u32>,
    hi: vec4<u32>,
    sm: vec4<f32>,
    dm: vec2<f32>,
}

fn step_decode(r: Raw, u: u32) -> Dec {
    let m = vec4<u32>(0x0F0F0F0Fu);
    return Dec(r.q & m, (r.q >> vec4<u32>(4u)) & m, k4_pair(r.hdr, (u >> 1u) & 3u), unpack2x16float(r.hdr.x));
}

fn dec_dot(d: Dec, xv: ptr<function, XIn>, xs: XS) -> f32 {
    var l = vec2<i32>(0);
    for (var i = 0u; i < 4u; i++) {
        l += vec2<i32>(dot4I8Packed(d.lo[i], (*xv)[i]), dot4I8Packed(d.hi[i], (*xv)[4u + i]));
    }
    let lh = vec2<f32>(l) * xs.d.xy;
    return d.dm.x * dot(d.sm.xy, lh) - d.dm.y * dot(d.sm.zw, xs.s.xy);
}
#endif
#else
fn step_pre(u: u32, xv: ptr<function, XIn>) -> XS {
    let lo = (*xv)[0] + (*xv)[1] + (*xv)[2] + (*xv)[3];
    let hi = (*xv)[4] + (*xv)[5] + (*xv)[6] + (*xv)[7];
    return XS(vec4<f32>(1.0), vec4<f32>(dot(lo, vec4<f32>(1.0)), dot(hi, vec4<f32>(1.0)), 0.0, 0.0));
}

fn nibble_dots(q: vec4<u32>, xv: ptr<function, XIn>) -> vec2<f32> {
    var lo = 0.0;
    var hi = 0.0;
    for (var i = 0u; i < 4u; i++) {
        lo += dot(lo4(q[i]), (*xv)[i]);
        hi += dot(hi4(q[i]), (*xv)[4u + i]);
    }
    return vec2<f32>(lo, hi);
}
#endif
#endif

#if DT_Q6_K
// Q6_K, 64 values a step: one 16-value sub-block (s = u % 2: a or b) of each quarter of half
// a block (hf = (u / 2) % 2); each word of low nibbles and high bits is read once and serves
// the quarters it holds bits of. xv[4q + i] are quarter q's inputs.
const STEP: u32 = 64u;
const XN: u32 = 16u;

fn x_vec(u: u32, i: u32) -> u32 {
    return 16u * u - 12u * (u & 1u) + 8u * (i / 4u) + (i & 3u);
}

// The 16 bytes at an even offset, from the five words that hold them.
fn words16(o: u32) -> vec4<u32> {
    let i = o >> 2u;
    let a = vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
    if ((o & 2u) == 0u) {
        return a;
    }
    let b = vec4<u32>(a.yzw, w[i + 4u]);
    return (a >> vec4<u32>(16u)) | (b << vec4<u32>(16u));
}

// Step u's bytes in the block of row rb: the block (x), its low nibbles (y; and y + 32) and
// high bits (z).
fn q6_at(rb: u32, u: u32) -> vec3<u32> {
    let ob = rb + (u >> 2u) * 210u;
    let hf = (u >> 1u) & 1u;
    return vec3<u32>(ob, ob + 64u * hf + 16u * (u & 1u), ob + 128u + 32u * hf + 16u * (u & 1u));
}

// Step u's quarter scales from block ob: quarter q's is sub-block 2q + s (s = u % 2), byte
// 2q + s of the half's scales.
fn q6_scales(ob: u32, u: u32) -> vec4<f32> {
    let hf = (u >> 1u) & 1u;
    let sh = 8u * (u & 1u);
    let s_lo = w32(ob + 192u + 8u * hf);
    let s_hi = w32(ob + 196u + 8u * hf);
    return vec4<f32>(sbyte((s_lo >> sh) & 0xFFu), sbyte((s_lo >> (16u + sh)) & 0xFFu), sbyte((s_hi >> sh) & 0xFFu), sbyte((s_hi >> (16u + sh)) & 0xFFu));
}

fn step_dot(r: Raw, u: u32, xv: ptr<function, XIn>, xs: XS) -> f32 {
    let at = q6_at(r.rb, u);
    let pq = quarter_dots(words16(at.y), words16(at.y + 32u), words16(at.z), xv, xs);
    return wf16(at.x + 208u) * dot(q6_scales(at.x, u), pq);
}

#if INT8_X
// xs.d, xs.s: each quarter's input scale and input sum.
fn step_pre(u: u32, xv: ptr<function, XIn>) -> XS {
    let c = 4u * u - 3u * (u & 1u);
    let a = xscale(c);
    let b = xscale(c + 2u);
    let e = xscale(c + 4u);
    let f = xscale(c + 6u);
    return XS(vec4<f32>(a.x, b.x, e.x, f.x), vec4<f32>(a.y, b.y, e.y, f.y));
}

// Per quarter, the 6-bit values (0..63, from the low nibbles wl0/wl1 and the high bits wh)
// as bytes dotted with the integer inputs; minus 32 times the input sum.
fn quarter_dots(wl0: vec4<u32>, wl1: vec4<u32>, wh: vec4<u32>, xv: ptr<function, XIn>, xs: XS) -> vec4<f32> {
    let m4 = 0x0F0F0F0Fu;
    let m2 = 0x03030303u;
    var iq = vec4<i32>(0);
    for (var i = 0u; i < 4u; i++) {
        let h = wh[i];
        iq.x += dot4I8Packed((wl0[i] & m4) | ((h & m2) << 4u), (*xv)[i]);
        iq.y += dot4I8Packed((wl1[i] & m4) | (((h >> 2u) & m2) << 4u), (*xv)[4u + i]);
        iq.z += dot4I8Packed(((wl0[i] >> 4u) & m4) | (((h >> 4u) & m2) << 4u), (*xv)[8u + i]);
        iq.w += dot4I8Packed(((wl1[i] >> 4u) & m4) | (((h >> 6u) & m2) << 4u), (*xv)[12u + i]);
    }
    return xs.d * vec4<f32>(iq) - 32.0 * xs.s;
}

#if TOKENS
// TOKENS: a step's weights decoded once for every token (see the Q4_K form): per quarter
// its four words of 6-bit values as bytes, the quarters' scales, the block's multiplier.
struct Dec {
    q: array<vec4<u32>, 4>,
    sc: vec4<f32>,
    d: f32,
}

fn step_decode(r: Raw, u: u32) -> Dec {
    let at = q6_at(r.rb, u);
    let wl0 = words16(at.y);
    let wl1 = words16(at.y + 32u);
    let wh = words16(at.z);
    let m4 = vec4<u32>(0x0F0F0F0Fu);
    let m2 = vec4<u32>(0x03030303u);
    let s4 = vec4<u32>(4u);
    let q = array<vec4<u32>, 4>(
        (wl0 & m4) | ((wh & m2) << s4),
        (wl1 & m4) | (((wh >> vec4<u32>(2u)) & m2) << s4),
        ((wl0 >> s4) & m4) | (((wh >> s4) & m2) << s4),
        ((wl1 >> s4) & m4) | (((wh >> vec4<u32>(6u)) & m2) << s4),
    );
    return Dec(q, q6_scales(at.x, u), wf16(at.x + 208u));
}

fn dec_dot(d: Dec, xv: ptr<function, XIn>, xs: XS) -> f32 {
    var iq = vec4<i32>(0);
    for (var i = 0u; i < 4u; i++) {
        iq += vec4<i32>(
            dot4I8Packed(d.q[0][i], (*xv)[i]),
            dot4I8Packed(d.q[1][i], (*xv)[4u + i]),
            dot4I8Packed(d.q[2][i], (*xv)[8u + i]),
            dot4I8Packed(d.q[3][i], (*xv)[12u + i]),
        );
    }
    return d.d * dot(d.sc, xs.d * vec4<f32>(iq) - 32.0 * xs.s);
}
#endif
#else
fn step_pre(u: u32, xv: ptr<function, XIn>) -> XS {
    return XS(vec4<f32>(1.0), vec4<f32>(0.0));
}

fn quarter_dots(wl0: vec4<u32>, wl1: vec4<u32>, wh: vec4<u32>, xv: ptr<function, XIn>, xs: XS) -> vec4<f32> {
    var pq = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let l0 = bytes4(wl0[i]);
        let l1 = bytes4(wl1[i]);
        let h = bytes4(wh[i]);
        let q0 = small4_minus((l0 & vec4<u32>(0xFu)) | ((h & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        let q1 = small4_minus((l1 & vec4<u32>(0xFu)) | (((h >> vec4<u32>(2u)) & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        let q2 = small4_minus((l0 >> vec4<u32>(4u)) | (((h >> vec4<u32>(4u)) & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        let q3 = small4_minus((l1 >> vec4<u32>(4u)) | ((h >> vec4<u32>(6u)) << vec4<u32>(4u)), 32.0);
        pq += vec4<f32>(dot(q0, (*xv)[i]), dot(q1, (*xv)[4u + i]), dot(q2, (*xv)[8u + i]), dot(q3, (*xv)[12u + i]));
    }
    return pq;
}
#endif
#endif

#if !DT_Q4_K
// Other dtypes load where the values are used: Q6_K holding a step's 60 bytes a row for the
// next step made its products 30% slower on the H100, and the shared dequantizer loads as it
// converts.
struct Raw {
    rb: u32,
}

fn step_load(rb: u32, u: u32) -> Raw {
    return Raw(rb);
}
#endif

#if !DT_Q4_K
#if !DT_Q6_K
// Every other dtype: 32 values a step through the shared dequantizer.
const STEP: u32 = 32u;
const XN: u32 = 8u;

fn x_vec(u: u32, i: u32) -> u32 {
    return 8u * u + i;
}

fn step_pre(u: u32, xv: ptr<function, XIn>) -> XS {
    return XS(vec4<f32>(1.0), vec4<f32>(0.0));
}

fn step_dot(r: Raw, u: u32, xv: ptr<function, XIn>, xs: XS) -> f32 {
    let q = load_unit(r.rb, u);
    var s = 0.0;
    for (var i = 0u; i < 8u; i++) {
        s += dot(q[i], (*xv)[i]);
    }
    return s;
}
#endif
#endif

#if MERGE
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
#else
#if XQ_IN
@group(0) @binding(1) var<storage, read> xg: array<u32>;
#else
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#endif
#endif
#if Q8_OUT
@group(0) @binding(2) var<storage, read_write> yq: array<u32>;
// The workgroup's gated activations, before they are rounded.
var<workgroup> act_sh: array<f32, 128>;
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#endif
@group(0) @binding(3) var<uniform> p: Params;

override TPR: u32 = 32u;
// Rows per group: 4, or 2 and 1 for matrices with few rows (more workgroups, fewer rows
// each). GEGLU_OUT needs at least a gate/up pair.
override RPT: u32 = 4u;
// PREFETCH: each step's weights are loaded while the step before it is summed, so that two
// steps' loads are in flight; for rows long enough that a lane takes many steps (output
// heads). Otherwise a step's loads are issued at its start.
override PREFETCH: bool = false;

// A step's weights for the group's rows.
fn group_load(rb: vec4<u32>, u: u32) -> array<Raw, 4> {
    var r: array<Raw, 4>;
    r[0] = step_load(rb.x, u);
    if (RPT > 1u) {
        r[1] = step_load(rb.y, u);
    }
    if (RPT > 2u) {
        r[2] = step_load(rb.z, u);
        r[3] = step_load(rb.w, u);
    }
    return r;
}

#if NO_SUBGROUPS
var<workgroup> rows_red: array<f32, 1024>;
#else
// The smallest subgroup size the device has: shuffles stay within aligned SG-lane blocks.
override SG: u32 = 32u;
var<workgroup> sg_sums: array<vec4<f32>, 64>;
#endif
#if ROUTE_IN
@group(0) @binding(4) var<storage, read_write> sel: array<u32>;
@group(0) @binding(15) var<storage, read_write> expert_w: array<f32>;
// The router's logits and the experts' scales: route.wgsl's bindings 18 and 19.

// Slot j of token t: its expert (the same value in every thread), stored with its weight
// where `writer`.
fn route_slot(t: u32, j: u32, li: u32, writer: bool) -> u32 {
    route_token(t, li, p.n_expert, p.x_group);
    if (writer && li == 0u) {
        let pick = route_pick(j, p.x_group, p.has_scale != 0u);
        sel[t * p.x_group + j] = pick.expert;
        expert_w[t * p.x_group + j] = pick.weight;
    }
    return workgroupUniformLoad(&route_picked[j]);
}
#else
#if EXPERTS
@group(0) @binding(4) var<storage, read> sel: array<u32>;
#endif
#endif
#if EXPERTS_SUM|MOE_WEIGHTED
@group(0) @binding(15) var<storage, read> expert_w: array<f32>;
#endif
#if EXPERTS_SUM
// The token's slots: expert and weight (at most 64, the dispatcher checks).
var<workgroup> slot_e: array<u32, 64>;
var<workgroup> slot_w: array<f32, 64>;
#endif
#if RESIDUAL|MERGE|NORM_IN
// The product's input row: k / 4 vec4s.
override XV: u32 = 1u;
var<workgroup> xsh: array<vec4<f32>, XV>;
// Vec4s of the row per thread: RV = ceil(k / 1024) <= RV_MAX (k <= 8192).
const RV_MAX: u32 = 8u;
override RV: u32 = 1u;
#endif
#if RESIDUAL
@group(0) @binding(5) var<storage, read> delta: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> post: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> res_out: array<vec4<f32>>;
#endif
#if PRENORM|NORM_IN
@group(0) @binding(7) var<storage, read> pre: array<vec4<f32>>;
#endif
#if PRENORM
@group(0) @binding(9) var<storage, read_write> normed: array<vec4<f32>>;
#endif
#if GELU_TIMES
@group(0) @binding(10) var<storage, read> times: array<f32>;
#endif
#if LORA
@group(0) @binding(20) var<storage, read> lora_t: array<f32>;
@group(0) @binding(21) var<storage, read> lora_b: array<f32>;

// Lane `lane`'s share of the adapter's delta on row `row` (of the tile) for token m: every
// TPR-th term from its own, summed with the row's dot product by the lanes' reduction.
fn lora_share(m: u32, row: u32, lane: u32) -> f32 {
    let r = p.lora_first_row + row;
    var seg = u32(r >= p.lora_seg1) + u32(r >= p.lora_seg2);
    if (p.lora_pairs != 0u) {
        seg = r & 1u;
    }
    let tb = m * p.lora_t_stride + seg * p.lora_rank;
    let bb = r * p.lora_rank;
    var s = 0.0;
    for (var i = lane; i < p.lora_rank; i += TPR) {
        s += lora_t[tb + i] * lora_b[bb + i];
    }
    return s;
}
#endif

#if MOE_DELTA
@group(0) @binding(14) var<storage, read> experts: array<vec4<f32>>;
@group(0) @binding(16) var<storage, read> dense_post: array<vec4<f32>>;
@group(0) @binding(17) var<storage, read> experts_post: array<vec4<f32>>;
override MOE_K: u32 = 1u;

// The thread's vec4s of delta = norm(dense) * dense_post + norm(mix) * experts_post, where
// mix = sum_s expert_w[s] * experts[s] (MOE_WEIGHTED), or experts[0] as an EXPERTS_SUM
// product mixed it; returns their sum of squares.
fn moe_delta(li: u32, dv: ptr<function, array<vec4<f32>, RV_MAX>>) -> f32 {
    let n4 = p.k / 4u;
    var mv: array<vec4<f32>, RV_MAX>;
    var sdn = 0.0;
    var sm = 0.0;
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < n4) {
            (*dv)[j] = delta[i];
            var acc = vec4<f32>(0.0);
#if MOE_WEIGHTED
            for (var s = 0u; s < MOE_K; s++) {
                acc += expert_w[s] * experts[s * n4 + i];
            }
#else
            acc = experts[i];
#endif
            mv[j] = acc;
            sdn += dot((*dv)[j], (*dv)[j]);
            sm += dot(acc, acc);
        }
    }
    let inv_dn = inverseSqrt(wg_sum(sdn, li) / f32(p.k) + p.eps);
    let inv_m = inverseSqrt(wg_sum(sm, li) / f32(p.k) + p.eps);
    var sd = 0.0;
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < n4) {
            let v = (*dv)[j] * inv_dn * dense_post[i] + mv[j] * inv_m * experts_post[i];
            (*dv)[j] = v;
            sd += dot(v, v);
        }
    }
    return sd;
}
#endif

#if RESIDUAL
// Fills xsh with the product's input (see RESIDUAL above). Every input a thread needs is
// loaded at the start, so the step waits for one round of loads rather than one per pass.
fn residual_prologue(xb: u32, li: u32, writer: bool) {
    let n4 = p.k / 4u;
    var dv: array<vec4<f32>, RV_MAX>;
    var hv: array<vec4<f32>, RV_MAX>;
    var pv: array<vec4<f32>, RV_MAX>;
    var nv: array<vec4<f32>, RV_MAX>;
    var sd = 0.0;
#if MOE_DELTA
    sd = moe_delta(li, &dv);
#endif
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < n4) {
#if !MOE_DELTA
            dv[j] = delta[xb + i];
#endif
            hv[j] = x[xb + i];
            pv[j] = post[i];
#if PRENORM
            nv[j] = pre[i];
#endif
#if !MOE_DELTA
            sd += dot(dv[j], dv[j]);
#endif
        }
    }
    let inv_d = inverseSqrt(wg_sum(sd, li) / f32(p.k) + p.eps);
    var ss = 0.0;
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < n4) {
            let h = (hv[j] + dv[j] * inv_d * pv[j]) * p.scale;
            hv[j] = h;
            ss += dot(h, h);
            xsh[i] = h;
            if (writer) {
                res_out[xb + i] = h;
            }
        }
    }
#if PRENORM
    let inv = inverseSqrt(wg_sum(ss, li) / f32(p.k) + p.eps);
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < n4) {
            let v = hv[j] * inv * nv[j];
            xsh[i] = v;
            if (writer) {
                normed[xb + i] = v;
            }
        }
    }
#endif
}
#endif

#if NORM_IN
// Fills xsh with the product's input, norm(x) * pre.
fn norm_prologue(xb: u32, li: u32) {
    let n4 = p.k / 4u;
    var hv: array<vec4<f32>, RV_MAX>;
    var ss = 0.0;
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < n4) {
            hv[j] = x[xb + i];
            ss += dot(hv[j], hv[j]);
        }
    }
    let inv = inverseSqrt(wg_sum(ss, li) / f32(p.k) + p.eps);
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < n4) {
            xsh[i] = hv[j] * inv * pre[i];
        }
    }
}
#endif

#if MERGE
// The split attention's shape for attn_merge.wgsl.
fn split_of_p() -> Split {
    return Split(p.n_head, p.n_kv_head, p.head_dim, p.window, p.max_chunks, p.capacity, 0u);
}

@group(0) @binding(11) var<storage, read> positions: array<u32>;
#if KV_STORE
@group(0) @binding(12) var<storage, read_write> kc: array<f32>;
@group(0) @binding(13) var<storage, read_write> vc: array<f32>;
#endif
// Per query head: the largest chunk max, and the inverse of the chunks' total weight.
var<workgroup> head_ml: array<vec2<f32>, 64>;

// Fills xsh with the attention output (see MERGE above), each head's reductions in one
// subgroup where subgroups have 32 lanes.
fn merge_prologue(li: u32, writer: bool) {
    let hd = p.head_dim;
    let pos = positions[0];
    let chunks = visible_chunks(pos, split_of_p());
#if SUBGROUP32
    for (var h = li / 32u; h < p.n_head; h += 8u) {
        let s = chunk_stats(h, chunks, li % 32u, 32u, split_of_p());
        let m = subgroupMax(s.x);
        let l = subgroupAdd(s.y * exp(s.x - m));
        if (li % 32u == 0u) {
            head_ml[h] = vec2<f32>(m, 1.0 / l);
        }
    }
#else
    for (var h = 0u; h < p.n_head; h++) {
        let s = chunk_stats(h, chunks, li, 256u, split_of_p());
        let m = wg_max(s.x, li);
        let l = wg_sum(s.y * exp(s.x - m), li);
        if (li == 0u) {
            head_ml[h] = vec2<f32>(m, 1.0 / l);
        }
    }
#endif
    workgroupBarrier();
    for (var j = 0u; j < RV; j++) {
        let i = li + 256u * j;
        if (i < p.k / 4u) {
            let h = 4u * i / hd;
            let ml = head_ml[h];
            xsh[i] = merged4(h, i % (hd / 4u), chunks, ml.x, split_of_p()) * ml.y;
        }
    }
#if KV_STORE
    if (writer && pos < p.capacity) {
        store_kv(pos, 0u, p.n_kv_head * hd, li, split_of_p(), kv_at(1u, 0u, split_of_p()));
    }
#endif
}
#endif

#if XQ_IN
// Per 16 values of the input: its 32's scale and its sum as rounded.
fn xscale(j: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(xg[p.xs_words + 2u * j]), bitcast<f32>(xg[p.xs_words + 2u * j + 1u]));
}
#else
#if INT8_X
override XQ: u32 = 1u;
override XC: u32 = 1u;
// The input's k / 4 words of four 8-bit integers, and per 16 values (XC = k / 16) its
// 32 values' scale and the sum of its 16 values as rounded; with TOKENS, MT tokens' of them
// one after another.
#if TOKENS
// In vec4s, so that a token's step reads its inputs 16 bytes at a time: XQ4 = XQ / 4 of
// them, a constant of its own (naga 30 panics on an override expression as an array size).
override XQ4: u32 = 1u;
var<workgroup> xq: array<vec4<u32>, XQ4>;

fn put_xq(i: u32, v: u32) {
    xq[i / 4u][i % 4u] = v;
}
#else
var<workgroup> xq: array<u32, XQ>;

fn put_xq(i: u32, v: u32) {
    xq[i] = v;
}
#endif
var<workgroup> xqs: array<vec2<f32>, XC>;
// TOKENS: where the token the steps read starts in xqs.
var<private> xs_at: u32;

fn xscale(j: u32) -> vec2<f32> {
    return xqs[xs_at + j];
}

// One thread per 32 inputs: rounded to integers in -127..127 with the scale max|x| / 127.
fn quantize_input(xb: u32, li: u32) {
    for (var b = li; b < p.k / 32u; b += 256u) {
        quantize_block(xb, b, 0u, 0u);
    }
}

// TOKENS: the group's tokens from x[xb] (x_stride apart), a thread per token's 32 inputs, each
// token's k / 4 words after the one before it in xq (k / 16 in xqs).
fn quantize_tokens(xb: u32, tokens: u32, li: u32) {
    let blocks = p.k / 32u;
    for (var i = li; i < tokens * blocks; i += 256u) {
        let t = i / blocks;
        quantize_block(xb + t * (p.x_stride / 4u), i - t * blocks, t * (p.k / 4u), t * (p.k / 16u));
    }
}

// Block b (32 inputs) of the row at x[xb] (or the workgroup's row xsh) into xq from word qo
// and xqs from so.
fn quantize_block(xb: u32, b: u32, qo: u32, so: u32) {
    var v: array<vec4<f32>, 8>;
    var amax = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
#if RESIDUAL|MERGE|NORM_IN
        v[i] = xsh[8u * b + i];
#else
        v[i] = x[xb + 8u * b + i];
#endif
        amax = max(amax, abs(v[i]));
    }
    let a = max(max(amax.x, amax.y), max(amax.z, amax.w));
    let inv = select(0.0, 127.0 / a, a > 0.0);
    let d = a / 127.0;
    var sums = vec2<i32>(0);
    for (var i = 0u; i < 8u; i++) {
        let q = vec4<i32>(round(v[i] * inv));
        put_xq(qo + 8u * b + i, pack4xI8(q));
        sums[i / 4u] += q.x + q.y + q.z + q.w;
    }
    xqs[so + 2u * b] = vec2<f32>(d, d * f32(sums.x));
    xqs[so + 2u * b + 1u] = vec2<f32>(d, d * f32(sums.y));
}
#endif
#endif

#if Q8_OUT
// Rounds the workgroup's `per` gated activations (act_sh), from output o0, one thread per 32.
fn write_rounded(o0: u32, per: u32, li: u32) {
    if (li >= per / 32u) {
        return;
    }
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(act_sh[32u * li + i]));
    }
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let d = amax / 127.0;
    let b = (o0 + 32u * li) / 32u;
    var sums = vec2<i32>(0);
    for (var w = 0u; w < 8u; w++) {
        let a = 32u * li + 4u * w;
        let q = vec4<i32>(round(vec4<f32>(act_sh[a], act_sh[a + 1u], act_sh[a + 2u], act_sh[a + 3u]) * inv));
        yq[8u * b + w] = pack4xI8(q);
        sums[w / 4u] += q.x + q.y + q.z + q.w;
    }
    let sb = p.xs_words + 4u * b;
    yq[sb] = bitcast<u32>(d);
    yq[sb + 1u] = bitcast<u32>(d * f32(sums.x));
    yq[sb + 2u] = bitcast<u32>(d);
    yq[sb + 3u] = bitcast<u32>(d * f32(sums.y));
}
#endif

#if TOKENS
// Step u of the group's rows decoded once for every token (Q4_K or Q6_K, INT8_X).
fn group_decode(cur: array<Raw, 4>, u: u32) -> array<Dec, 4> {
    var d: array<Dec, 4>;
    d[0] = step_decode(cur[0], u);
    if (RPT > 1u) {
        d[1] = step_decode(cur[1], u);
    }
    if (RPT > 2u) {
        d[2] = step_decode(cur[2], u);
        d[3] = step_decode(cur[3], u);
    }
    return d;
}

// The decoded step of the group's rows dotted with one token's inputs xv.
fn group_apply(dec: array<Dec, 4>, u: u32, xv: ptr<function, XIn>) -> vec4<f32> {
    let xs = step_pre(u, xv);
    var d = vec4<f32>(0.0);
    d.x = dec_dot(dec[0], xv, xs);
    if (RPT > 1u) {
        d.y = dec_dot(dec[1], xv, xs);
    }
    if (RPT > 2u) {
        d.z = dec_dot(dec[2], xv, xs);
        d.w = dec_dot(dec[3], xv, xs);
    }
    return d;
}
#endif

// Step u of the group's rows (their weights in cur) dotted with the inputs xv.
fn group_dots(cur: array<Raw, 4>, u: u32, xv: ptr<function, XIn>) -> vec4<f32> {
    let xs = step_pre(u, xv);
    var d = vec4<f32>(0.0);
    d.x = step_dot(cur[0], u, xv, xs);
    if (RPT > 1u) {
        d.y = step_dot(cur[1], u, xv, xs);
    }
    if (RPT > 2u) {
        d.z = step_dot(cur[2], u, xv, xs);
        d.w = step_dot(cur[3], u, xv, xs);
    }
    return d;
}

// The sums of a group's TPR lanes, in its lane 0 (every thread calls it: it may wait at
// barriers; a caller that reduces again waits at one first).
fn lanes_sum(acc_in: vec4<f32>, li: u32, lane: u32) -> vec4<f32> {
    var acc = acc_in;
#if !NO_SUBGROUPS
    for (var off = min(TPR, SG) / 2u; off > 0u; off >>= 1u) {
        acc += subgroupShuffleXor(acc, off);
    }
    if (TPR > SG) {
        if (li % SG == 0u) {
            sg_sums[li / SG] = acc;
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var i = 1u; i < TPR / SG; i++) {
                acc += sg_sums[li / SG + i];
            }
        }
    }
#else
    for (var r = 0u; r < RPT; r++) {
        rows_red[r * 256u + li] = acc[r];
    }
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var r = 0u; r < RPT; r++) {
                rows_red[r * 256u + li] += rows_red[r * 256u + li + s];
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < RPT; r++) {
        acc[r] = rows_red[r * 256u + li];
    }
#endif
    return acc;
}

#if TOKENS
// Most tokens a workgroup takes (MT of them).
const MT_MAX: u32 = 8u;
override MT: u32 = 4u;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let group = (wg.x + wg.y * nwg.x) * (256u / TPR) + li / TPR;
    let lane = li % TPR;
    let row0 = group * RPT;
    let t0 = wg.z * MT;
    let tokens = min(MT, p.m - t0);
    let steps = p.k / STEP;
    // Rows past the end repeat the last row: same loads, results dropped.
    let last = p.n - 1u;
    let rb = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) * p.row_bytes;
    // PREFETCH: the first step's weights are in flight while the inputs are rounded, and
    // each step's while the step before is dotted with every token.
    var cur = array<Raw, 4>();
    if (PREFETCH && row0 < p.n && lane < steps) {
        cur = group_load(rb, lane);
    }
    quantize_tokens(t0 * (p.x_stride / 4u), tokens, li);
    workgroupBarrier();
    var acc: array<vec4<f32>, MT_MAX>;
    if (row0 < p.n) {
        for (var u = lane; u < steps; u += TPR) {
            var next = array<Raw, 4>();
            if (!PREFETCH) {
                cur = group_load(rb, u);
            } else if (u + TPR < steps) {
                next = group_load(rb, u + TPR);
            }
            let dec = group_decode(cur, u);
            cur = next;
            for (var t = 0u; t < tokens; t++) {
                let xq_at = t * (p.k / 16u);
                xs_at = t * (p.k / 16u);
                var xv = XIn();
                // The step's inputs lie in runs of four words: a 16-byte load each.
                for (var i = 0u; i < XN; i += 4u) {
                    let v = xq[xq_at + x_vec(u, i) / 4u];
                    xv[i] = v.x;
                    xv[i + 1u] = v.y;
                    xv[i + 2u] = v.z;
                    xv[i + 3u] = v.w;
                }
                acc[t] += group_apply(dec, u, &xv);
            }
        }
    }
    for (var t = 0u; t < MT; t++) {
        // The reduction's workgroup memory is free again (a group of one subgroup uses none).
#if NO_SUBGROUPS
        workgroupBarrier();
#else
        if (TPR > SG) {
            workgroupBarrier();
        }
#endif
        let sums = lanes_sum(acc[t], li, lane);
        if (lane == 0u && row0 < p.n && t < tokens) {
            write_token(t0 + t, row0, sums);
        }
    }
}

fn write_token(m: u32, row0: u32, sums: vec4<f32>) {
    let ob = m * p.y_stride + p.out_offset;
#if GEGLU_OUT
    y[ob + row0 / 2u] = gelu_tanh(sums.x) * sums.y;
    if (RPT > 2u && row0 + 2u < p.n) {
        y[ob + row0 / 2u + 1u] = gelu_tanh(sums.z) * sums.w;
    }
#else
    for (var r = 0u; r < RPT; r++) {
        if (row0 + r < p.n) {
            y[ob + row0 + r] = softcapped(sums[r], p.softcap);
        }
    }
#endif
}
#else
@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let group = (wg.x + wg.y * nwg.x) * (256u / TPR) + li / TPR;
    let lane = li % TPR;
    let row0 = group * RPT;
    let m = wg.z;
#if EXPERTS_SUM
    if (li < p.x_group) {
        slot_e[li] = sel[m * p.x_group + li];
        slot_w[li] = expert_w[m * p.x_group + li];
    }
    workgroupBarrier();
    let xb = m * (p.x_stride / 4u);
    let rbase = 0u;
#else
#if EXPERTS
#if ROUTE_IN
    let chosen = route_slot(m / p.x_group, m % p.x_group, li, wg.x == 0u && wg.y == 0u);
#else
    let chosen = sel[m];
#endif
    // A slot whose expert lives in another tile has nothing to do here.
    let expert = chosen - p.first_expert;
    if (chosen < p.first_expert || expert >= p.experts_here) {
        return;
    }
    let xb = (m / p.x_group) * (p.x_stride / 4u);
    let rbase = expert * p.n;
#else
    let xb = m * (p.x_stride / 4u);
    let rbase = 0u;
#endif
#endif
#if RESIDUAL
    residual_prologue(xb, li, wg.x == 0u && wg.y == 0u);
    workgroupBarrier();
#endif
#if MERGE
    merge_prologue(li, wg.x == 0u && wg.y == 0u);
    workgroupBarrier();
#endif
#if NORM_IN
    norm_prologue(xb, li);
    workgroupBarrier();
#endif
#if INT8_X
#if !XQ_IN
    quantize_input(xb, li);
    workgroupBarrier();
#endif
#endif
    var acc = vec4<f32>(0.0);
    // Float rows may end inside their last step (at a multiple of 4 values): its inputs past
    // the end are zero, so the weights read there (the next row's, finite) add nothing.
    let steps = (p.k + STEP - 1u) / STEP;
#if EXPERTS_SUM
    let all_steps = steps * p.x_group;
#else
    let all_steps = steps;
#endif
    if (row0 < p.n) {
        // Rows past the end repeat the last row: same loads, results dropped.
        let last = p.n - 1u;
        let rb = (rbase + min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last))) * p.row_bytes;
        var cur = array<Raw, 4>();
        if (PREFETCH && lane < steps) {
            cur = group_load(rb, lane);
        }
        for (var v = lane; v < all_steps; v += TPR) {
#if EXPERTS_SUM
            // Step u of segment j: slot j's expert, its input row and weight.
            let j = v / steps;
            let u = v - j * steps;
            let expert = slot_e[j] - p.first_expert;
            if (slot_e[j] < p.first_expert || expert >= p.experts_here) {
                continue;
            }
            let rbu = rb + vec4<u32>(expert * p.n * p.row_bytes);
            let xbu = xb + j * (p.k / 4u);
            let wu = slot_w[j];
#else
            let u = v;
            let rbu = rb;
            let xbu = xb;
            let wu = 1.0;
#endif
            var next = array<Raw, 4>();
            if (!PREFETCH) {
                cur = group_load(rbu, u);
            } else if (u + TPR < steps) {
                next = group_load(rb, u + TPR);
            }
            var xv = XIn();
            for (var i = 0u; i < XN; i++) {
                let c = x_vec(u, i);
                if (4u * c < p.k) {
#if XQ_IN
                    xv[i] = xg[c];
#else
#if INT8_X
                    xv[i] = xq[c];
#else
#if RESIDUAL|MERGE|NORM_IN
                    xv[i] = xsh[c];
#else
                    xv[i] = x[xbu + c];
#endif
#endif
#endif
                }
            }
            acc += wu * group_dots(cur, u, &xv);
            if (PREFETCH) {
                cur = next;
            }
        }
    }
#if LORA
    if (row0 < p.n) {
        for (var r = 0u; r < RPT; r++) {
            acc[r] += lora_share(m, min(row0 + r, p.n - 1u), lane);
        }
    }
#endif
    acc = lanes_sum(acc, li, lane);
#if Q8_OUT
    // One token, whole blocks of outputs per workgroup (the dispatcher checks).
    let per = 256u / TPR * RPT / 2u;
    if (lane == 0u) {
        act_sh[li / TPR * (RPT / 2u)] = gelu_tanh(acc.x) * acc.y;
        if (RPT > 2u) {
            act_sh[li / TPR * 2u + 1u] = gelu_tanh(acc.z) * acc.w;
        }
    }
    workgroupBarrier();
    write_rounded(p.out_offset + (wg.x + wg.y * nwg.x) * per, per, li);
#else
    if (lane != 0u || row0 >= p.n) {
        return;
    }
    let ob = m * p.y_stride + p.out_offset;
#if GEGLU_OUT
    y[ob + row0 / 2u] = gelu_tanh(acc.x) * acc.y;
    if (RPT > 2u && row0 + 2u < p.n) {
        y[ob + row0 / 2u + 1u] = gelu_tanh(acc.z) * acc.w;
    }
#else
    for (var r = 0u; r < RPT; r++) {
        if (row0 + r < p.n) {
#if GELU_TIMES
            y[ob + row0 + r] = gelu_tanh(acc[r]) * times[p.times_offset + row0 + r];
#else
#if EXPERTS_SUM
            y[ob + row0 + r] = acc[r] + select(0.0, y[ob + row0 + r], p.accumulate != 0u);
#else
            y[ob + row0 + r] = softcapped(acc[r], p.softcap);
#endif
#endif
        }
    }
#endif
#endif
}
#endif
