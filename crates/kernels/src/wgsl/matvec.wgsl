// The one-token matrix-vector product y[m, out_offset + r] = sum_k W[r, k] * x[m, k], reading
// the weights straight from memory.
//
// A workgroup of 256 threads takes 256 / TPR groups of RPT consecutive rows. The TPR threads of
// a group stride over the rows' 32-element units; each thread dequantizes the unit of each of
// its RPT rows against one load of the input, so the input is read once per RPT rows rather
// than once per row. Lanes of a group are summed with subgroup shuffles (and, for groups wider
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
// GELU_TIMES: y[out_offset + i] = gelu_tanh(row_i . x) * times[times_offset + i].

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
}

#if DT_Q4_K
// Q4_K reads its 16-byte-aligned blocks as 16-byte words.
@group(0) @binding(0) var<storage, read> w4: array<vec4<u32>>;

fn wword(i: u32) -> u32 {
    return w4[i >> 2u][i & 3u];
}
#else
@group(0) @binding(0) var<storage, read> w: array<u32>;

fn wword(i: u32) -> u32 {
    return w[i];
}
#endif

#if DT_Q4_K
// Q4_K, 64 values a step: one 32-byte group of nibbles (low: sub-block 2j, high: 2j+1) and
// its block's 16-byte header, as three 16-byte loads.
const STEP: u32 = 64u;

// The sums of the step's two 32-value halves of x, which the mins multiply: the same for
// every row, so computed once per step.
fn step_pre(xv: ptr<function, array<vec4<f32>, 32>>) -> vec2<f32> {
    var xlo = vec4<f32>(0.0);
    var xhi = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
        xlo += (*xv)[i];
        xhi += (*xv)[8u + i];
    }
    return vec2<f32>(dot(xlo, vec4<f32>(1.0)), dot(xhi, vec4<f32>(1.0)));
}

fn step_dot(rb: u32, c: u32, xv: ptr<function, array<vec4<f32>, 32>>, xs: vec2<f32>) -> f32 {
    let o16 = (rb + (c >> 2u) * 144u) >> 4u;
    let j = c & 3u;
    let hdr = w4[o16];
    let dm = unpack2x16float(hdr.x);
    // k4_scale_min on the 12 scale bytes hdr.y (0..3), hdr.z (4..7), hdr.w (8..11).
    var scs: vec2<f32>;
    var mns: vec2<f32>;
    for (var t = 0u; t < 2u; t++) {
        let sb = 2u * j + t;
        if (sb < 4u) {
            scs[t] = f32((hdr.y >> (8u * sb)) & 63u);
            mns[t] = f32((hdr.z >> (8u * sb)) & 63u);
        } else {
            let sh = 8u * (sb - 4u);
            let a = (hdr.w >> sh) & 0xFFu;
            scs[t] = f32((a & 0xFu) | ((((hdr.y >> sh) >> 6u) & 3u) << 4u));
            mns[t] = f32((a >> 4u) | ((((hdr.z >> sh) >> 6u) & 3u) << 4u));
        }
    }
    let qa = w4[o16 + 1u + 2u * j];
    let qb = w4[o16 + 2u + 2u * j];
    var lo = 0.0;
    var hi = 0.0;
    for (var i = 0u; i < 4u; i++) {
        lo += dot(lo4(qa[i]), (*xv)[i]) + dot(lo4(qb[i]), (*xv)[4u + i]);
        hi += dot(hi4(qa[i]), (*xv)[8u + i]) + dot(hi4(qb[i]), (*xv)[12u + i]);
    }
    return dm.x * (scs.x * lo + scs.y * hi) - dm.y * (mns.x * xs.x + mns.y * xs.y);
}
#endif

#if DT_Q6_K
// Q6_K, 128 values a step (half a block): each word of its low nibbles and high bits is read
// once and serves the quarters it holds bits of.
const STEP: u32 = 128u;

fn step_pre(xv: ptr<function, array<vec4<f32>, 32>>) -> vec2<f32> {
    return vec2<f32>(0.0);
}

fn step_dot(rb: u32, c: u32, xv: ptr<function, array<vec4<f32>, 32>>, xs: vec2<f32>) -> f32 {
    let ob = rb + (c >> 1u) * 210u;
    let hf = c & 1u;
    let lb = ob + 64u * hf;
    let hb = ob + 128u + 32u * hf;
    // Per quarter (columns) and sub-block of 16 (a: values 0..15, b: 16..31).
    var pa = vec4<f32>(0.0);
    var pb = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
        let l0 = bytes4(w32(lb + 4u * i));
        let l1 = bytes4(w32(lb + 32u + 4u * i));
        let h = bytes4(w32(hb + 4u * i));
        let q0 = small4_minus((l0 & vec4<u32>(0xFu)) | ((h & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        let q1 = small4_minus((l1 & vec4<u32>(0xFu)) | (((h >> vec4<u32>(2u)) & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        let q2 = small4_minus((l0 >> vec4<u32>(4u)) | (((h >> vec4<u32>(4u)) & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        let q3 = small4_minus((l1 >> vec4<u32>(4u)) | ((h >> vec4<u32>(6u)) << vec4<u32>(4u)), 32.0);
        let d4 = vec4<f32>(dot(q0, (*xv)[i]), dot(q1, (*xv)[8u + i]), dot(q2, (*xv)[16u + i]), dot(q3, (*xv)[24u + i]));
        if (i < 4u) {
            pa += d4;
        } else {
            pb += d4;
        }
    }
    // Scales: sub-block 2 * quarter + (0: a, 1: b), bytes 192 + 8 * hf of the block.
    let s_lo = w32(ob + 192u + 8u * hf);
    let s_hi = w32(ob + 196u + 8u * hf);
    let sa = vec4<f32>(sbyte(s_lo & 0xFFu), sbyte((s_lo >> 16u) & 0xFFu), sbyte(s_hi & 0xFFu), sbyte((s_hi >> 16u) & 0xFFu));
    let sbv = vec4<f32>(sbyte((s_lo >> 8u) & 0xFFu), sbyte(s_lo >> 24u), sbyte((s_hi >> 8u) & 0xFFu), sbyte(s_hi >> 24u));
    return wf16(ob + 208u) * (dot(sa, pa) + dot(sbv, pb));
}
#endif

#if !DT_Q4_K
#if !DT_Q6_K
// Every other dtype: 32 values a step through the shared dequantizer.
const STEP: u32 = 32u;

fn step_pre(xv: ptr<function, array<vec4<f32>, 32>>) -> vec2<f32> {
    return vec2<f32>(0.0);
}

fn step_dot(rb: u32, u: u32, xv: ptr<function, array<vec4<f32>, 32>>, xs: vec2<f32>) -> f32 {
    let q = load_unit(rb, u);
    var s = 0.0;
    for (var i = 0u; i < 8u; i++) {
        s += dot(q[i], (*xv)[i]);
    }
    return s;
}
#endif
#endif

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override TPR: u32 = 32u;
// Rows per group: 4, or 2 and 1 for matrices with few rows (more workgroups, fewer rows
// each). GEGLU_OUT needs at least a gate/up pair.
override RPT: u32 = 4u;

#if NO_SUBGROUPS
var<workgroup> rows_red: array<f32, 1024>;
#else
// The smallest subgroup size the device has: shuffles stay within aligned SG-lane blocks.
override SG: u32 = 32u;
var<workgroup> sg_sums: array<vec4<f32>, 64>;
#endif
#if EXPERTS
@group(0) @binding(4) var<storage, read> sel: array<u32>;
#endif
#if RESIDUAL
// The product's input row: k / 4 vec4s.
override XV: u32 = 1u;
var<workgroup> xsh: array<vec4<f32>, XV>;
@group(0) @binding(5) var<storage, read> delta: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> post: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> res_out: array<vec4<f32>>;
#endif
#if PRENORM
@group(0) @binding(7) var<storage, read> pre: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> normed: array<vec4<f32>>;
#endif
#if GELU_TIMES
@group(0) @binding(10) var<storage, read> times: array<f32>;
#endif

#if RESIDUAL
// Fills xsh with the product's input (see RESIDUAL above).
fn residual_prologue(xb: u32, li: u32, writer: bool) {
    let n4 = p.k / 4u;
    var sd = 0.0;
    for (var i = li; i < n4; i += 256u) {
        let d4 = delta[xb + i];
        xsh[i] = d4;
        sd += dot(d4, d4);
    }
    let inv_d = inverseSqrt(wg_sum(sd, li) / f32(p.k) + p.eps);
    var ss = 0.0;
    for (var i = li; i < n4; i += 256u) {
        let h = (x[xb + i] + xsh[i] * inv_d * post[i]) * p.scale;
        xsh[i] = h;
        ss += dot(h, h);
        if (writer) {
            res_out[xb + i] = h;
        }
    }
#if PRENORM
    let inv = inverseSqrt(wg_sum(ss, li) / f32(p.k) + p.eps);
    for (var i = li; i < n4; i += 256u) {
        let v = xsh[i] * inv * pre[i];
        xsh[i] = v;
        if (writer) {
            normed[xb + i] = v;
        }
    }
#endif
}
#endif

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
#if EXPERTS
    // A slot whose expert lives in another tile has nothing to do here.
    let expert = sel[m] - p.first_expert;
    if (sel[m] < p.first_expert || expert >= p.experts_here) {
        return;
    }
    let xb = (m / p.x_group) * (p.x_stride / 4u);
    let rbase = expert * p.n;
#else
    let xb = m * (p.x_stride / 4u);
    let rbase = 0u;
#endif
#if RESIDUAL
    residual_prologue(xb, li, wg.x == 0u && wg.y == 0u);
    workgroupBarrier();
#endif
    var acc = vec4<f32>(0.0);
    let steps = p.k / STEP;
    if (row0 < p.n) {
        // Rows past the end repeat the last row: same loads, results dropped.
        let last = p.n - 1u;
        let rb0 = (rbase + row0) * p.row_bytes;
        let rb1 = (rbase + min(row0 + 1u, last)) * p.row_bytes;
        let rb2 = (rbase + min(row0 + 2u, last)) * p.row_bytes;
        let rb3 = (rbase + min(row0 + 3u, last)) * p.row_bytes;
        for (var u = lane; u < steps; u += TPR) {
            var xv: array<vec4<f32>, 32>;
            for (var i = 0u; i < STEP / 4u; i++) {
#if RESIDUAL
                xv[i] = xsh[u * (STEP / 4u) + i];
#else
                xv[i] = x[xb + u * (STEP / 4u) + i];
#endif
            }
            let xs = step_pre(&xv);
            acc.x += step_dot(rb0, u, &xv, xs);
            if (RPT > 1u) {
                acc.y += step_dot(rb1, u, &xv, xs);
            }
            if (RPT > 2u) {
                acc.z += step_dot(rb2, u, &xv, xs);
                acc.w += step_dot(rb3, u, &xv, xs);
            }
        }
    }
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
            y[ob + row0 + r] = softcapped(acc[r], p.softcap);
#endif
        }
    }
#endif
}
