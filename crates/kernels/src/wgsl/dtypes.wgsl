// load_unit(rb, u): the 32 values of unit `u` (elements 32u..32u+31) of the row whose bytes
// start at byte `rb`, dequantized exactly as ggml does. One DT_* flag selects the dtype.
// Q4_K reads its blocks 16 bytes at a time (bytes.wgsl's wquad), four times fewer loads than
// by words: the loads bound the tiled products, where each load of a warp touches a
// different row per pair of lanes.

#if DT_IQ4_NL|DT_IQ4_XS
var<private> IQ4: array<f32, 16> = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn iq4(v: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(IQ4[v.x], IQ4[v.y], IQ4[v.z], IQ4[v.w]);
}
#endif

#if DT_Q4_K
// Scale (x) and min (y) of sub-block j from a Q4_K block's 16-byte header (its 12 packed
// scale bytes are hdr.y (0..3), hdr.z (4..7), hdr.w (8..11)).
fn k4_header_scale_min(hdr: vec4<u32>, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32((hdr.y >> (8u * j)) & 63u), f32((hdr.z >> (8u * j)) & 63u));
    }
    let sh = 8u * (j - 4u);
    let a = (hdr.w >> sh) & 0xFFu;
    return vec2<f32>(f32((a & 0xFu) | ((((hdr.y >> sh) >> 6u) & 3u) << 4u)), f32((a >> 4u) | ((((hdr.z >> sh) >> 6u) & 3u) << 4u)));
}
#endif

#if DT_Q5_K
// Scale and min of sub-block j of the 12 packed scale bytes at `sb`.
fn k4_scale_min(sb: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(wb(sb + j) & 63u), f32(wb(sb + j + 4u) & 63u));
    }
    let a = wb(sb + j + 4u);
    return vec2<f32>(f32((a & 0xFu) | ((wb(sb + j - 4u) >> 6u) << 4u)), f32((a >> 4u) | ((wb(sb + j) >> 6u) << 4u)));
}
#endif

#if DT_Q5_0|DT_Q5_1
// The fifth bits of values b..b+3 of a Q5 unit (bits b.. of its 32-bit qh), as bit 4.
fn q5_high(qh: u32, b: u32) -> vec4<u32> {
    return ((vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + b)) & vec4<u32>(1u)) << vec4<u32>(4u);
}
#endif

// Each value goes through one small4 after its bits are put together as an integer: two
// small4 results added could be reassociated by the driver (2^23 + a + 2^23 + b loses a's
// low bits), which NVIDIA's compiler does.
fn load_unit(rb: u32, u: u32) -> array<vec4<f32>, 8> {
    var r: array<vec4<f32>, 8>;
#if DT_F32
#if F32_QUADS
    // Rows of whole units: every unit starts 16-byte aligned, and its 128 bytes are eight
    // 16-byte loads rather than thirty-two of 4.
    let b = (rb >> 4u) + u * 8u;
    for (var i = 0u; i < 8u; i++) {
        r[i] = bitcast<vec4<f32>>(wquad(b + i));
    }
#else
    let b = (rb >> 2u) + u * 32u;
    for (var i = 0u; i < 8u; i++) {
        r[i] = bitcast<vec4<f32>>(vec4<u32>(wword(b + 4u * i), wword(b + 4u * i + 1u), wword(b + 4u * i + 2u), wword(b + 4u * i + 3u)));
    }
#endif
#endif
#if DT_F16
    let b = (rb >> 2u) + u * 16u;
    for (var i = 0u; i < 8u; i++) {
        r[i] = vec4<f32>(unpack2x16float(wword(b + 2u * i)), unpack2x16float(wword(b + 2u * i + 1u)));
    }
#endif
#if DT_BF16
    let b = (rb >> 2u) + u * 16u;
    for (var i = 0u; i < 8u; i++) {
        let v0 = wword(b + 2u * i);
        let v1 = wword(b + 2u * i + 1u);
        r[i] = bitcast<vec4<f32>>(vec4<u32>(v0 << 16u, v0 & 0xFFFF0000u, v1 << 16u, v1 & 0xFFFF0000u));
    }
#endif
#if DT_Q8_0|DT_Q5_0
    r = decode_unit(fetch_unit(rb, u), u);
#endif
#if DT_Q4_0
    let o = rb + u * 18u;
    let d = wf16(o);
    for (var j = 0u; j < 4u; j++) {
        let q = w32(o + 2u + 4u * j);
        r[j] = (lo4(q) - 8.0) * d;
        r[j + 4u] = (hi4(q) - 8.0) * d;
    }
#endif
#if DT_Q4_1
    let o = rb + u * 20u;
    let d = wf16(o);
    let m = wf16(o + 2u);
    for (var j = 0u; j < 4u; j++) {
        let q = w32(o + 4u + 4u * j);
        r[j] = lo4(q) * d + m;
        r[j + 4u] = hi4(q) * d + m;
    }
#endif
#if DT_Q5_1
    let o = rb + u * 24u;
    let d = wf16(o);
    let m = wf16(o + 2u);
    let qh = w32(o + 4u);
    for (var j = 0u; j < 4u; j++) {
        let q = w32(o + 8u + 4u * j);
        r[j] = small4(lo4u(q) | q5_high(qh, 4u * j)) * d + m;
        r[j + 4u] = small4(hi4u(q) | q5_high(qh, 16u + 4u * j)) * d + m;
    }
#endif
#if DT_IQ4_NL
    let o = rb + u * 18u;
    let d = wf16(o);
    for (var j = 0u; j < 4u; j++) {
        let q = w32(o + 2u + 4u * j);
        r[j] = iq4(lo4u(q)) * d;
        r[j + 4u] = iq4(hi4u(q)) * d;
    }
#endif
#if DT_Q4_K
    r = decode_unit(fetch_unit(rb, u), u);
#endif
#if DT_Q5_K
    let ob = rb + (u >> 3u) * 176u;
    let s = u & 7u;
    let sm = k4_scale_min(ob + 4u, s);
    let dl = wf16(ob) * sm.x;
    let ml = wf16(ob + 2u) * sm.y;
    let qb = ob + 48u + (s >> 1u) * 32u;
    for (var i = 0u; i < 8u; i++) {
        let q = w32(qb + 4u * i);
        let h = bit4u(w32(ob + 16u + 4u * i), s) << vec4<u32>(4u);
        var v = vec4<u32>();
        if ((s & 1u) == 0u) {
            v = lo4u(q);
        } else {
            v = hi4u(q);
        }
        r[i] = dl * small4(v | h) - ml;
    }
#endif
#if DT_Q6_K
    let ob = rb + (u >> 3u) * 210u;
    let s = u & 7u;
    let hf = s >> 2u;
    let quarter = s & 3u;
    let qlb = ob + hf * 64u + (quarter & 1u) * 32u;
    let nshift = (quarter >> 1u) * 4u;
    let qhb = ob + 128u + hf * 32u;
    let hshift = quarter * 2u;
    let d = wf16(ob + 208u);
    let sc0 = d * sbyte(wb(ob + 192u + hf * 8u + quarter * 2u));
    let sc1 = d * sbyte(wb(ob + 192u + hf * 8u + quarter * 2u + 1u));
    let qlw = w32x8(qlb);
    let qhw = w32x8(qhb);
    for (var i = 0u; i < 8u; i++) {
        let ql = (bytes4(qlw[i]) >> vec4<u32>(nshift)) & vec4<u32>(0xFu);
        let qh = (bytes4(qhw[i]) >> vec4<u32>(hshift)) & vec4<u32>(3u);
        let q = small4_minus(ql | (qh << vec4<u32>(4u)), 32.0);
        if (i < 4u) {
            r[i] = sc0 * q;
        } else {
            r[i] = sc1 * q;
        }
    }
#endif
#if DT_Q2_K
    let ob = rb + (u >> 3u) * 84u;
    let s = u & 7u;
    let shift = (s & 3u) * 2u;
    let qb = ob + 16u + (s >> 2u) * 32u;
    let d = wf16(ob + 80u);
    let dmin = wf16(ob + 82u);
    let sa = wb(ob + s * 2u);
    let sb = wb(ob + s * 2u + 1u);
    for (var i = 0u; i < 8u; i++) {
        let q = small4((bytes4(w32(qb + 4u * i)) >> vec4<u32>(shift)) & vec4<u32>(3u));
        var sc = sa;
        if (i >= 4u) {
            sc = sb;
        }
        r[i] = d * f32(sc & 0xFu) * q - dmin * f32(sc >> 4u);
    }
#endif
#if DT_Q3_K
    let ob = rb + (u >> 3u) * 110u;
    let s = u & 7u;
    let n = s >> 2u;
    let j = s & 3u;
    let qb = ob + 32u + n * 32u;
    let d = wf16(ob + 108u);
    var scl: array<f32, 2>;
    for (var t = 0u; t < 2u; t++) {
        let idx = s * 2u + t;
        var low = u32();
        if (idx < 8u) {
            low = wb(ob + 96u + idx) & 0xFu;
        } else {
            low = wb(ob + 96u + idx - 8u) >> 4u;
        }
        let high = (wb(ob + 96u + 8u + (idx & 3u)) >> (2u * (idx >> 2u))) & 3u;
        scl[t] = d * (f32(low | (high << 4u)) - 32.0);
    }
    for (var i = 0u; i < 8u; i++) {
        let low = (bytes4(w32(qb + 4u * i)) >> vec4<u32>(2u * j)) & vec4<u32>(3u);
        let h = bit4u(w32(ob + 4u * i), n * 4u + j) << vec4<u32>(2u);
        r[i] = scl[i >> 2u] * small4_minus(low | h, 4.0);
    }
#endif
#if DT_IQ4_XS
    let ob = rb + (u >> 3u) * 136u;
    let s = u & 7u;
    let d = wf16(ob);
    let sh = w16(ob + 2u);
    let ls = ((wb(ob + 4u + (s >> 1u)) >> (4u * (s & 1u))) & 0xFu) | (((sh >> (2u * s)) & 3u) << 4u);
    let dl = d * (f32(ls) - 32.0);
    for (var j = 0u; j < 4u; j++) {
        let q = w32(ob + 8u + s * 16u + 4u * j);
        r[j] = iq4(lo4u(q)) * dl;
        r[j + 4u] = iq4(hi4u(q)) * dl;
    }
#endif
    return r;
}

// fetch_unit(rb, u) then decode_unit(raw, u) is load_unit(rb, u) in two halves: the loads,
// then the arithmetic on what they returned. A tiled product fetches the next step's units
// before this step's tensor work and decodes them after it, so the loads' latency hides
// behind that work; load_unit's arithmetic would wait for the loads where it stands.
#if DT_Q4_K
// Block u / 8: a 16-byte header, then 32-byte groups of nibbles (sub-block 2j low, 2j + 1
// high); the unit's group holds both.
struct RawUnit {
    hdr: vec4<u32>,
    q0: vec4<u32>,
    q1: vec4<u32>,
}

fn fetch_unit(rb: u32, u: u32) -> RawUnit {
    let ob = (rb >> 4u) + (u >> 3u) * 9u;
    let qg = ob + 1u + 2u * ((u & 7u) >> 1u);
    return RawUnit(wquad(ob), wquad(qg), wquad(qg + 1u));
}

fn decode_unit(raw: RawUnit, u: u32) -> array<vec4<f32>, 8> {
    let s = u & 7u;
    let sm = k4_header_scale_min(raw.hdr, s);
    let dm = unpack2x16float(raw.hdr.x);
    let dl = dm.x * sm.x;
    let ml = dm.y * sm.y;
    var r: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        var q = raw.q1[i % 4u];
        if (i < 4u) {
            q = raw.q0[i];
        }
        var v = vec4<f32>();
        if ((s & 1u) == 0u) {
            v = lo4(q);
        } else {
            v = hi4(q);
        }
        r[i] = dl * v - ml;
    }
    return r;
}
#endif

#if DT_Q8_0
// The scale, then 32 signed bytes.
const UNIT_BYTES: u32 = 34u;
#endif
#if DT_Q5_0
// The scale, 32 fifth bits, then 16 bytes of nibbles (value j low, j + 16 high).
const UNIT_BYTES: u32 = 22u;
#endif

#if DT_Q8_0|DT_Q5_0
// Units of UNIT_BYTES start at even offsets: `lo` when at a word's start, else 2 bytes into
// it. The raw unit is the words it spans.
struct RawUnit {
    w: array<u32, (UNIT_BYTES + 5u) / 4u>,
    lo: bool,
}

fn fetch_unit(rb: u32, u: u32) -> RawUnit {
    let o = rb + u * UNIT_BYTES;
    var r: RawUnit;
    for (var i = 0u; i < (UNIT_BYTES + 5u) / 4u; i++) {
        r.w[i] = wword((o >> 2u) + i);
    }
    r.lo = (o & 3u) == 0u;
    return r;
}

// The 32 bits at byte 4i + 2 of a unit: the halves of words i and i + 1, or else word
// i + 1 whole.
fn odd_half_word(a: u32, b: u32, lo: bool) -> u32 {
    return select(b, (a >> 16u) | (b << 16u), lo);
}

// The unit's f16 scale (its first two bytes).
fn unit_scale(w0: u32, lo: bool) -> f32 {
    return unpack2x16float(select(w0 >> 16u, w0, lo)).x;
}
#endif

#if DT_Q8_0
fn decode_unit(raw: RawUnit, u: u32) -> array<vec4<f32>, 8> {
    let d = unit_scale(raw.w[0], raw.lo);
    var r: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        r[i] = d * sbytes4(odd_half_word(raw.w[i], raw.w[i + 1u], raw.lo));
    }
    return r;
}
#endif

#if DT_Q5_0
fn decode_unit(raw: RawUnit, u: u32) -> array<vec4<f32>, 8> {
    let d = unit_scale(raw.w[0], raw.lo);
    let qh = odd_half_word(raw.w[0], raw.w[1], raw.lo);
    var r: array<vec4<f32>, 8>;
    for (var j = 0u; j < 4u; j++) {
        let q = odd_half_word(raw.w[j + 1u], raw.w[j + 2u], raw.lo);
        r[j] = small4_minus(lo4u(q) | q5_high(qh, 4u * j), 16.0) * d;
        r[j + 4u] = small4_minus(hi4u(q) | q5_high(qh, 16u + 4u * j), 16.0) * d;
    }
    return r;
}
#endif

#if DT_F16|DT_BF16
// The unit's 16 words of half-width floats.
struct RawUnit {
    w: array<u32, 16>,
}

// F16_QUADS (rows of whole units, so every unit starts 16-byte aligned): the unit's 64 bytes
// as four 16-byte loads rather than sixteen of 4, a quarter of the requests (the towers'
// products on tensor cores, benches/RESULTS.md).
fn fetch_unit(rb: u32, u: u32) -> RawUnit {
    var r: RawUnit;
#if F16_QUADS
    let b = (rb >> 4u) + u * 4u;
    for (var i = 0u; i < 4u; i++) {
        let q = wquad(b + i);
        r.w[4u * i] = q.x;
        r.w[4u * i + 1u] = q.y;
        r.w[4u * i + 2u] = q.z;
        r.w[4u * i + 3u] = q.w;
    }
#else
    let b = (rb >> 2u) + u * 16u;
    for (var i = 0u; i < 16u; i++) {
        r.w[i] = wword(b + i);
    }
#endif
    return r;
}

fn decode_unit(raw: RawUnit, u: u32) -> array<vec4<f32>, 8> {
    var r: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let v0 = raw.w[2u * i];
        let v1 = raw.w[2u * i + 1u];
#if DT_F16
        r[i] = vec4<f32>(unpack2x16float(v0), unpack2x16float(v1));
#else
        r[i] = bitcast<vec4<f32>>(vec4<u32>(v0 << 16u, v0 & 0xFFFF0000u, v1 << 16u, v1 & 0xFFFF0000u));
#endif
    }
    return r;
}
#endif

#if !DT_Q4_K
#if !DT_Q8_0
#if !DT_Q5_0
#if !DT_F16
#if !DT_BF16
// Other dtypes decode as they fetch. (Q6_K split the same way, its raw unit 21 words,
// measured 1-2% slower in the tiled products on the H100.)
struct RawUnit {
    v: array<vec4<f32>, 8>,
}

fn fetch_unit(rb: u32, u: u32) -> RawUnit {
    return RawUnit(load_unit(rb, u));
}

fn decode_unit(raw: RawUnit, u: u32) -> array<vec4<f32>, 8> {
    return raw.v;
}
#endif
#endif
#endif
#endif
#endif
