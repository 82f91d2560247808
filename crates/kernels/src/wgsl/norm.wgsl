// RMS normalisation of rows: y = x / sqrt(mean(x^2) + eps) (* w). One workgroup per row.
// RESIDUAL: res += norm(x) * w instead (a post-norm followed by the residual add).
// INPLACE: x is normalised where it lies.
// RESIDUAL_NORM: the step between two blocks of a layer in one pass: the residual stream x
// becomes (x + norm(delta) * post) * scale in place, and y = norm(x) * w is the next block's
// input. One workgroup owns a whole row, so the in-place update is race-free.

struct Params {
    dim: u32,
    rows: u32,
    eps: f32,
    x_stride: u32,
    scale: f32,
}

#if INPLACE|RESIDUAL_NORM
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
#else
@group(0) @binding(0) var<storage, read> x: array<f32>;
#endif
#if !INPLACE
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
#endif
@group(0) @binding(2) var<uniform> p: Params;
#if WEIGHT
@group(0) @binding(3) var<storage, read> nw: array<f32>;
#endif
#if RESIDUAL_NORM
@group(0) @binding(4) var<storage, read> delta: array<f32>;
@group(0) @binding(5) var<storage, read> post: array<f32>;
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.x_stride;
#if RESIDUAL_NORM
    var sd = 0.0;
    for (var i = li; i < p.dim; i += 256u) {
        let v = delta[row * p.dim + i];
        sd += v * v;
    }
    let inv_d = inverseSqrt(wg_sum(sd, li) / f32(p.dim) + p.eps);
    for (var i = li; i < p.dim; i += 256u) {
        x[base + i] = (x[base + i] + delta[row * p.dim + i] * inv_d * post[i]) * p.scale;
    }
#endif
    var ss = 0.0;
    for (var i = li; i < p.dim; i += 256u) {
        let v = x[base + i];
        ss += v * v;
    }
    let inv = inverseSqrt(wg_sum(ss, li) / f32(p.dim) + p.eps);
    for (var i = li; i < p.dim; i += 256u) {
        var v = x[base + i] * inv;
#if WEIGHT
        v *= nw[i];
#endif
#if INPLACE
        x[base + i] = v;
#else
#if RESIDUAL
        y[row * p.dim + i] += v;
#else
        y[row * p.dim + i] = v;
#endif
#endif
    }
}
