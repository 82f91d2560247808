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

// Values each thread holds: rows of up to 256 * PER values stay in registers between the
// reductions, so each is read from memory once.
const PER: u32 = 24u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.x_stride;
    var xv: array<f32, PER>;
    var ss = 0.0;
#if RESIDUAL_NORM
    var dv: array<f32, PER>;
    var sd = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = li + 256u * j;
        if (i >= p.dim) {
            break;
        }
        dv[j] = delta[row * p.dim + i];
        xv[j] = x[base + i];
        sd += dv[j] * dv[j];
    }
    let inv_d = inverseSqrt(wg_sum(sd, li) / f32(p.dim) + p.eps);
    for (var j = 0u; j < PER; j++) {
        let i = li + 256u * j;
        if (i >= p.dim) {
            break;
        }
        xv[j] = (xv[j] + dv[j] * inv_d * post[i]) * p.scale;
        x[base + i] = xv[j];
        ss += xv[j] * xv[j];
    }
#else
    for (var j = 0u; j < PER; j++) {
        let i = li + 256u * j;
        if (i >= p.dim) {
            break;
        }
        xv[j] = x[base + i];
        ss += xv[j] * xv[j];
    }
#endif
    let inv = inverseSqrt(wg_sum(ss, li) / f32(p.dim) + p.eps);
    for (var j = 0u; j < PER; j++) {
        let i = li + 256u * j;
        if (i >= p.dim) {
            break;
        }
        var v = xv[j] * inv;
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
