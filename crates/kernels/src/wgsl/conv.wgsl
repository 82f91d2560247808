// Convolution and pooling over tensors of any layout, one thread an output element:
// IM2COL: cols[oy * ow + ox, (c * kh + ky) * kw + kx] = x[c, oy*sh + ky - ph, ox*sw + kx - pw]
//   (0 outside x): with a product by the [out, c * kh * kw] weight, a 2-D convolution;
// DEPTHWISE: y[t, c] = sum_j w[c, j] * x[t - (kw - 1) + j, c] (+ bias[c]): causal, zero
//   before the start (kh, sh, ph unused);
// AVG_POOL: y[oy, ox, c] = mean of x[oy*sh + ky, ox*sw + kx, c] over the kh x kw window.
// `x0..x2` are x's strides over its three dimensions ([c, h, w] for IM2COL, [t, c] in x1, x2
// for DEPTHWISE, [h, w, c] for AVG_POOL); y is written at `y0..y2` likewise.

struct Params {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    x0: u32,
    x1: u32,
    x2: u32,
    x_at: u32,
    y0: u32,
    y1: u32,
    y2: u32,
    y_at: u32,
    w_at: u32,
    bias_at: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
#if DEPTHWISE
@group(0) @binding(3) var<storage, read> wt: array<f32>;
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#endif
#endif

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) {
        return;
    }
#if IM2COL
    let width = p.c * p.kh * p.kw;
    let col = i % width;
    let pix = i / width;
    let kx = col % p.kw;
    let ky = (col / p.kw) % p.kh;
    let c = col / (p.kw * p.kh);
    let iy = i32((pix / p.ow) * p.sh + ky) - i32(p.ph);
    let ix = i32((pix % p.ow) * p.sw + kx) - i32(p.pw);
    var v = 0.0;
    if (iy >= 0 && ix >= 0 && u32(iy) < p.h && u32(ix) < p.w) {
        v = x[p.x_at + c * p.x0 + u32(iy) * p.x1 + u32(ix) * p.x2];
    }
    y[p.y_at + pix * p.y1 + col * p.y2] = v;
#endif
#if DEPTHWISE
    let c = i % p.c;
    let t = i / p.c;
    var v = 0.0;
#if BIAS
    v = bias[p.bias_at + c];
#endif
    for (var j = 0u; j < p.kw; j++) {
        let back = p.kw - 1u - j;
        if (t >= back) {
            v += wt[p.w_at + c * p.kw + j] * x[p.x_at + (t - back) * p.x1 + c * p.x2];
        }
    }
    y[p.y_at + t * p.y1 + c * p.y2] = v;
#endif
#if AVG_POOL
    let c = i % p.c;
    let ox = (i / p.c) % p.ow;
    let oy = i / (p.c * p.ow);
    var s = 0.0;
    for (var ky = 0u; ky < p.kh; ky++) {
        for (var kx = 0u; kx < p.kw; kx++) {
            s += x[p.x_at + (oy * p.sh + ky) * p.x0 + (ox * p.sw + kx) * p.x1 + c * p.x2];
        }
    }
    y[p.y_at + oy * p.y0 + ox * p.y1 + c * p.y2] = s / f32(p.kh * p.kw);
#endif
}
