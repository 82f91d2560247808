// The weights (binding 0) and byte-level reads of their GGUF blocks through `wword(i)`, the
// i-th 32-bit word of the bytes exactly as the file stores them. Blocks of Q8_0, Q5_0,
// Q6_K... start at 2-byte boundaries, so reads of a word may straddle two words. Weight
// buffers are padded so the word after the last one exists. Q4_K rows are whole 144-byte
// blocks, read 16 bytes at a time through `wquad(i)`, as are F16 and F32 rows of whole
// 32-value units in the tiled products (F16_QUADS, F32_QUADS).

#if DT_Q4_K|F16_QUADS|F32_QUADS
@group(0) @binding(0) var<storage, read> w4: array<vec4<u32>>;

fn wword(i: u32) -> u32 {
    return w4[i >> 2u][i & 3u];
}

fn wquad(i: u32) -> vec4<u32> {
    return w4[i];
}
#else
@group(0) @binding(0) var<storage, read> w: array<u32>;

fn wword(i: u32) -> u32 {
    return w[i];
}
#endif

fn wb(o: u32) -> u32 {
    return (wword(o >> 2u) >> ((o & 3u) << 3u)) & 0xFFu;
}

// A 16-bit value at an even byte offset.
fn w16(o: u32) -> u32 {
    return (wword(o >> 2u) >> ((o & 2u) << 3u)) & 0xFFFFu;
}

// A 32-bit little-endian value at any byte offset.
fn w32(o: u32) -> u32 {
    let s = (o & 3u) << 3u;
    let a = wword(o >> 2u);
    if (s == 0u) {
        return a;
    }
    return (a >> s) | (wword((o >> 2u) + 1u) << (32u - s));
}

// The eight 32-bit values from byte offset `o` (any alignment): nine word loads rather than
// w32's sixteen when `o` is not a multiple of 4.
fn w32x8(o: u32) -> array<u32, 8> {
    let s = (o & 3u) << 3u;
    var a: array<u32, 9>;
    for (var i = 0u; i < 9u; i++) {
        a[i] = wword((o >> 2u) + i);
    }
    var r: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        // (A shift by 32 is taken modulo 32: the unshifted word is selected then.)
        r[i] = select((a[i] >> s) | (a[i + 1u] << (32u - s)), a[i], s == 0u);
    }
    return r;
}

fn wf16(o: u32) -> f32 {
    return unpack2x16float(w16(o)).x;
}

fn bytes4(v: u32) -> vec4<u32> {
    return (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
}

// Exact floats of small unsigned integers (below 2^23) minus `bias`, without int-to-float
// conversions, which run at a fraction of the FMA rate: the float with exponent 2^23 and
// mantissa v is 2^23 + v. On the H100 this made the Q5_0 and Q6_K matrix-vector products
// 10-15% faster and Q4_K and Q8_0's 7% slower, so nibbles and signed bytes keep the plain
// conversion.
fn small4_minus(v: vec4<u32>, bias: f32) -> vec4<f32> {
    return bitcast<vec4<f32>>(v | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0 + bias);
}

fn small4(v: vec4<u32>) -> vec4<f32> {
    return small4_minus(v, 0.0);
}

// The four bytes of `v` as signed values.
fn sbytes4(v: u32) -> vec4<f32> {
    let i = bitcast<i32>(v);
    return vec4<f32>(vec4<i32>(extractBits(i, 0u, 8u), extractBits(i, 8u, 8u), extractBits(i, 16u, 8u), extractBits(i, 24u, 8u)));
}

// Low and high nibbles of the four bytes of `v`, as integers and as floats.
fn lo4u(v: u32) -> vec4<u32> {
    return (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFu);
}

fn hi4u(v: u32) -> vec4<u32> {
    return (vec4<u32>(v) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(0xFu);
}

fn lo4(v: u32) -> vec4<f32> {
    return vec4<f32>(lo4u(v));
}

fn hi4(v: u32) -> vec4<f32> {
    return vec4<f32>(hi4u(v));
}

// Bit `b` of each byte of `v` (0 or 1).
fn bit4u(v: u32, b: u32) -> vec4<u32> {
    return (bytes4(v) >> vec4<u32>(b)) & vec4<u32>(1u);
}

// A byte as a signed value.
fn sbyte(b: u32) -> f32 {
    return f32(extractBits(bitcast<i32>(b), 0u, 8u));
}
