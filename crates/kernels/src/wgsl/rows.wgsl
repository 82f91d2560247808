// Per-row operations over the last dimension of a tensor of any layout, one workgroup a row
// (or, with LANE_ROWS, one subgroup a row: many short rows, such as per-head norms, where a
// workgroup a row would leave most of its threads idle and wait at its barriers):
// LAYER_NORM ((x - mean) / sqrt(var + eps)), else RMSNorm (x / sqrt(mean(x^2) + eps)), each then
// times `w` (WEIGHT) and plus `bias` (BIAS); or SOFTMAX of x * scale. Rows are numbered
// row-major over the first three of the four sizes. X_IN_Y: x lives in y's buffer.
// ROPE: a norm's rows (heads) then rotated (rope_math.wgsl's `rotated`): the row splits into
// `axes` sections of `section` values, each section's first n_rot in pairs (i, i + n_rot / 2)
// or, INTERLEAVED, (2i, 2i + 1), turned by the position on its axis of the row's token (its
// index over all but the last two sizes). Each thread norms its value and its partner's, so
// nothing passes between threads. Y_F16: y holds half floats.

struct Params {
    rows: u32,
    n: u32,
    r1: u32,
    r2: u32,
    x0: u32,
    x1: u32,
    x2: u32,
    x3: u32,
    x_at: u32,
    y0: u32,
    y1: u32,
    y2: u32,
    y3: u32,
    y_at: u32,
    w_at: u32,
    bias_at: u32,
    eps: f32,
    scale: f32,
    n_rot: u32,
    section: u32,
    axes: u32,
    base: f32,
    freq_scale: f32,
}

#if !X_IN_Y
@group(0) @binding(0) var<storage, read> x: array<f32>;
#endif
#if Y_F16
@group(0) @binding(1) var<storage, read_write> y: array<f16>;
#else
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
#endif
@group(0) @binding(2) var<uniform> p: Params;
#if WEIGHT
@group(0) @binding(3) var<storage, read> w: array<f32>;
#endif
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#endif
#if ROPE
@group(0) @binding(5) var<storage, read> positions: array<u32>;
#endif

fn write_y(o: u32, v: f32) {
#if Y_F16
    y[o] = f16(v);
#else
    y[o] = v;
#endif
}

fn read_x(o: u32) -> f32 {
#if X_IN_Y
    return y[o];
#else
    return x[o];
#endif
}

// Column c of the row at xb, normed: (x - mean) * inv, times w and plus bias.
fn normed(xb: u32, c: u32, mean: f32, inv: f32) -> f32 {
    var v = (read_x(xb + c * p.x3) - mean) * inv;
#if WEIGHT
    v *= w[p.w_at + c];
#endif
#if BIAS
    v += bias[p.bias_at + c];
#endif
    return v;
}

#if ROPE
// Column c of the normed row after the rotation by the token's positions.
fn roped(xb: u32, c: u32, token: u32, v: f32, mean: f32, inv: f32) -> f32 {
    let a = c / p.section;
    let within = c % p.section;
    if (within >= p.n_rot) {
        return v;
    }
    let half = p.n_rot / 2u;
#if INTERLEAVED
    let i = within / 2u;
    let first = within % 2u == 0u;
    let partner = select(c - 1u, c + 1u, first);
#else
    let i = within % half;
    let first = within < half;
    let partner = select(c - half, c + half, first);
#endif
    let pos = f32(positions[token * p.axes + a]);
    let other = normed(xb, partner, mean, inv);
    let pair = select(vec2<f32>(other, v), vec2<f32>(v, other), first);
    let turned = rotated(pair, i, pos, Rope(p.n_rot, p.base, p.freq_scale));
    return select(turned.y, turned.x, first);
}
#endif

// The sum and the maximum over the threads of a row (wg_sum and wg_max: reduce.wgsl, which
// LANE_ROWS leaves out).
fn row_sum(v: f32, li: u32) -> f32 {
#if LANE_ROWS
    return subgroupAdd(v);
#else
    return wg_sum(v, li);
#endif
}

fn row_max(v: f32, li: u32) -> f32 {
#if LANE_ROWS
    return subgroupMax(v);
#else
    return wg_max(v, li);
#endif
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if LANE_ROWS
    @builtin(subgroup_size) lanes: u32,
#endif
) {
#if LANE_ROWS
    // Subgroup li / lanes of the workgroup takes a row: lane `t` of `step` threads.
    let row = (wid.x + wid.y * nwg.x) * (256u / lanes) + li / lanes;
    let t = li % lanes;
    let step = lanes;
#else
    let row = wid.x + wid.y * nwg.x;
    let t = li;
    let step = 256u;
#endif
    if (row >= p.rows) {
        return;
    }
    let i2 = row % p.r2;
    let i1 = (row / p.r2) % p.r1;
    let i0 = row / (p.r2 * p.r1);
    let xb = p.x_at + i0 * p.x0 + i1 * p.x1 + i2 * p.x2;
    let yb = p.y_at + i0 * p.y0 + i1 * p.y1 + i2 * p.y2;
#if SOFTMAX
    var m = -3.0e38;
    for (var c = t; c < p.n; c += step) {
        m = max(m, read_x(xb + c * p.x3) * p.scale);
    }
    m = row_max(m, li);
    var s = 0.0;
    for (var c = t; c < p.n; c += step) {
        s += exp(read_x(xb + c * p.x3) * p.scale - m);
    }
    let inv = 1.0 / row_sum(s, li);
    for (var c = t; c < p.n; c += step) {
        write_y(yb + c * p.y3, exp(read_x(xb + c * p.x3) * p.scale - m) * inv);
    }
#else
    var mean = 0.0;
#if LAYER_NORM
    var s = 0.0;
    for (var c = t; c < p.n; c += step) {
        s += read_x(xb + c * p.x3);
    }
    mean = row_sum(s, li) / f32(p.n);
#endif
    var ss = 0.0;
    for (var c = t; c < p.n; c += step) {
        let d = read_x(xb + c * p.x3) - mean;
        ss += d * d;
    }
    let inv = inverseSqrt(row_sum(ss, li) / f32(p.n) + p.eps);
    for (var c = t; c < p.n; c += step) {
        var v = normed(xb, c, mean, inv);
#if ROPE
        v = roped(xb, c, row / p.r2, v, mean, inv);
#endif
        write_y(yb + c * p.y3, v);
    }
#endif
}
