// matmul.wgsl's tiled product for Q4_K, Q6_K and Q8_0 weights on devices without cooperative
// matrices, in integer dot products: every 32 inputs of a token are rounded to 8-bit integers
// with the scale max|x| / 127 (as the one-token INT8_X products and ggml's quantized products
// round them), the weights' 4-, 6- or 8-bit values are kept as the integers they are, and one
// dot4I8Packed multiplies four of each. Each unit of 32 values then costs a 32-bit float
// update per output (its scales and, for Q4_K, its mins) where f32 FMAs cost 32, and the
// tiles in workgroup memory take a quarter of the bytes.
//
// A workgroup computes a tile of 64 tokens x 64 rows (4 x 4 outputs per thread) or with
// ROWS_128 of 64 x 128 (4 x 8: two groups of 4 rows, 64 apart), in steps of 64 values of k:
// its threads decode the weight rows' units of 32 values and round the tokens', one unit
// each at a time; both land in workgroup memory as words of four bytes, k-major, so that the
// inner loop reads a vec4 of words of 4 tokens and one of 4 rows per 16 integer dot products.
// The wider tile rounds each token's inputs for twice the rows.

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;

const TM: u32 = 64u;
#if ROWS_128
const TN: u32 = 128u;
#else
const TN: u32 = 64u;
#endif
// Groups of 4 rows a thread takes (16 apart), and groups of the tile.
const RG: u32 = TN / 64u;
const GN: u32 = TN / 4u;
// Units of 32 values a step.
const UNITS: u32 = 2u;

// [unit][word][GN groups of 4]: wq[(u * 8 + w) * GN + g] holds word w (values 4w..4w+3 of the
// unit) of rows 4g..4g+3; xq likewise tokens (16 groups).
var<workgroup> wq: array<vec4<u32>, UNITS * 8u * GN>;
var<workgroup> xq: array<vec4<u32>, 256>;
// Per unit and group of 4 rows: IntUnit's a and b.
var<workgroup> wsa: array<vec4<f32>, UNITS * GN>;
var<workgroup> wsb: array<vec4<f32>, UNITS * GN>;
// Per unit and group of 4 tokens: the rounding's scale d, and d times the rounded sum.
var<workgroup> xd: array<vec4<f32>, 32>;
var<workgroup> xs: array<vec4<f32>, 32>;

// A row's unit of 32 values as integers (eight words of four bytes), with what turns their
// dot product with a rounded input into floats: w = a * q (first 16 values), b * q (last
// 16; Q6_K) or a * q - b (Q4_K; Q8_0's b is zero).
struct IntUnit {
    q: array<u32, 8>,
    a: f32,
    b: f32,
}

#if DT_Q4_K
// Unit u of the row at byte rb: sub-block j = u % 8 of block u / 8, its nibbles the low (even
// j) or high (odd j) halves of the block's 32-byte group j / 2.
fn int_unit(rb: u32, u: u32) -> IntUnit {
    let o16 = (rb + (u >> 3u) * 144u) >> 4u;
    let j = u & 7u;
    let hdr = w4[o16];
    let q0 = w4[o16 + 1u + 2u * (j >> 1u)];
    let q1 = w4[o16 + 2u + 2u * (j >> 1u)];
    let shift = vec4<u32>(4u * (j & 1u));
    let m = vec4<u32>(0x0F0F0F0Fu);
    let lo = (q0 >> shift) & m;
    let hi = (q1 >> shift) & m;
    let dm = unpack2x16float(hdr.x);
    let sm = k4_header_scale_min(hdr, j);
    return IntUnit(array<u32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w), dm.x * sm.x, dm.y * sm.y);
}
#endif

#if DT_Q6_K
// Unit u of the row at byte rb: quarter u % 4 of half (u / 4) % 2 of block u / 8, its 6-bit
// values minus 32 as signed bytes, and the scales of its two 16s.
fn int_unit(rb: u32, u: u32) -> IntUnit {
    let ob = rb + (u >> 3u) * 210u;
    let s = u & 7u;
    let hf = s >> 2u;
    let quarter = s & 3u;
    let qlw = w32x8(ob + hf * 64u + (quarter & 1u) * 32u);
    let qhw = w32x8(ob + 128u + hf * 32u);
    let nshift = (quarter >> 1u) * 4u;
    let hshift = quarter * 2u;
    var r: IntUnit;
    for (var i = 0u; i < 8u; i++) {
        let v = ((qlw[i] >> nshift) & 0x0F0F0F0Fu) | (((qhw[i] >> hshift) & 0x03030303u) << 4u);
        // Each byte v (0..63) as v - 32 in two's complement: (v + 128 - 32) ^ 128 borrows
        // from no other byte.
        r.q[i] = ((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    }
    let d = wf16(ob + 208u);
    let sc = ob + 192u + hf * 8u + quarter * 2u;
    r.a = d * sbyte(wb(sc));
    r.b = d * sbyte(wb(sc + 1u));
    return r;
}
#endif

#if DT_Q8_0
// Unit u of the row at byte rb: block u, a 2-byte scale then its 32 signed bytes.
fn int_unit(rb: u32, u: u32) -> IntUnit {
    let ob = rb + u * 34u;
    var r: IntUnit;
    r.q = w32x8(ob + 2u);
    r.a = wf16(ob);
    return r;
}
#endif

// Row r of the tile (row n0 + r of the tile's weight), unit uu of the step from unit u0.
fn stage_weights(tt: Tokens, n0: u32, r: u32, u0: u32, uu: u32) {
    var d = IntUnit();
    if (n0 + r < p.n && (u0 + uu) * 32u < p.k) {
        d = int_unit((tt.w_row + n0 + r) * p.row_bytes, u0 + uu);
    }
    for (var w = 0u; w < 8u; w++) {
        wq[(uu * 8u + w) * GN + r / 4u][r % 4u] = d.q[w];
    }
    wsa[uu * GN + r / 4u][r % 4u] = d.a;
    wsb[uu * GN + r / 4u][r % 4u] = d.b;
}

// Token t of the tile, unit uu of the step from unit u0, rounded (zero past the tokens).
fn stage_inputs(tt: Tokens, m0: u32, t: u32, u0: u32, uu: u32) {
    var v: array<vec4<f32>, 8>;
    var amax = vec4<f32>(0.0);
    if (m0 + t < tt.count && (u0 + uu) * 32u < p.k) {
        let xb = (x_row(tt, m0 + t) * p.x_stride + (u0 + uu) * 32u) / 4u;
        for (var i = 0u; i < 8u; i++) {
            v[i] = input_vec(x[xb + i]);
            amax = max(amax, abs(v[i]));
        }
    }
    let a = max(max(amax.x, amax.y), max(amax.z, amax.w));
    let inv = select(0.0, 127.0 / a, a > 0.0);
    var sum = 0;
    for (var w = 0u; w < 8u; w++) {
        let q = vec4<i32>(round(v[w] * inv));
        xq[(uu * 8u + w) * 16u + t / 4u][t % 4u] = pack4xI8(q);
        sum += q.x + q.y + q.z + q.w;
    }
    let d = a / 127.0;
    xd[uu * 16u + t / 4u][t % 4u] = d;
    xs[uu * 16u + t / 4u][t % 4u] = d * f32(sum);
}

// The integer dot products of words w0..w0 + n - 1 of unit uu between the thread's 4 tokens
// (group ty) and its rows (groups tx + 16 g): entry 4 g + i, token i's with group g's rows.
fn unit_dots(uu: u32, w0: u32, n: u32, tx: u32, ty: u32) -> array<vec4<i32>, 4u * RG> {
    var s: array<vec4<i32>, 4u * RG>;
    for (var w = w0; w < w0 + n; w++) {
        let a = xq[(uu * 8u + w) * 16u + ty];
        for (var g = 0u; g < RG; g++) {
            let b = wq[(uu * 8u + w) * GN + tx + 16u * g];
            for (var i = 0u; i < 4u; i++) {
                s[4u * g + i] += vec4<i32>(dot4I8Packed(a[i], b.x), dot4I8Packed(a[i], b.y), dot4I8Packed(a[i], b.z), dot4I8Packed(a[i], b.w));
            }
        }
    }
    return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = wg.x * TN;
    let m0 = wg.y * TM;
    let tt = tile_tokens(wg.z);
#if EXPERTS
    if (li == 0u) {
        tile_count = tt.count;
    }
    if (m0 >= workgroupUniformLoad(&tile_count)) {
        return;
    }
#endif
    let part = k_part_of(wg.z);
    let tx = li % 16u;
    let ty = li / 16u;
    var acc: array<vec4<f32>, 4u * RG>;
    // Rows are whole units (Q8_0's may end half way through a step: its last unit is zero).
    let per = p.k_part / (32u * UNITS);
    let steps = min((p.k + 32u * UNITS - 1u) / (32u * UNITS), (part + 1u) * per);
    for (var s = part * per; s < steps; s++) {
        // Everyone is done reading the previous step's tiles.
        workgroupBarrier();
        let u0 = s * UNITS;
        for (var e = li; e < (TN + TM) * UNITS; e += 256u) {
            if (e < TN * UNITS) {
                stage_weights(tt, n0, e % TN, u0, e / TN);
            } else {
                stage_inputs(tt, m0, (e - TN * UNITS) % TM, u0, (e - TN * UNITS) / TM);
            }
        }
        workgroupBarrier();
        for (var uu = 0u; uu < UNITS; uu++) {
            let d = xd[uu * 16u + ty];
#if DT_Q6_K
            let lo = unit_dots(uu, 0u, 4u, tx, ty);
            let hi = unit_dots(uu, 4u, 4u, tx, ty);
#else
            let sums = xs[uu * 16u + ty];
            let dots = unit_dots(uu, 0u, 8u, tx, ty);
#endif
            for (var g = 0u; g < RG; g++) {
                let a = wsa[uu * GN + tx + 16u * g];
                let b = wsb[uu * GN + tx + 16u * g];
                for (var i = 0u; i < 4u; i++) {
                    let o = 4u * g + i;
#if DT_Q6_K
                    acc[o] += (vec4<f32>(lo[o]) * a + vec4<f32>(hi[o]) * b) * d[i];
#else
                    acc[o] += vec4<f32>(dots[o]) * (a * d[i]) - b * sums[i];
#endif
                }
            }
        }
    }
    let yb = part * p.part_stride + p.out_offset;
    for (var g = 0u; g < RG; g++) {
        for (var i = 0u; i < 4u; i++) {
            store_outputs(tt, m0 + ty * 4u + i, n0 + 64u * g + tx * 4u, yb, acc[4u * g + i]);
        }
    }
}
