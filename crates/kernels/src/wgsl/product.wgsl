// y[b, i, j] = alpha * sum_k a[b, i, k] * bt[b, j, k] (+ bias[j] with BIAS, + what y held with
// ACCUMULATE): the product of
// two activation tensors of any layout (a transposed operand is a stride swap, a shared one a
// batch stride of 0). 16 x 16 outputs per workgroup, k in steps of 16 through workgroup
// memory.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    a0: u32,
    a1: u32,
    a2: u32,
    a_at: u32,
    b0: u32,
    b1: u32,
    b2: u32,
    b_at: u32,
    y0: u32,
    y1: u32,
    y2: u32,
    y_at: u32,
    bias_at: u32,
    alpha: f32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> bt: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#endif

var<workgroup> ta: array<array<f32, 17>, 16>;
var<workgroup> tb: array<array<f32, 17>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let batch = wid.z;
    let i = wid.y * 16u + lid.y;
    let j = wid.x * 16u + lid.x;
    // Rows of the tiles this thread loads: a's row i, bt's row (its tile's) lid.y.
    let bj = wid.x * 16u + lid.y;
    var acc = 0.0;
    for (var k0 = 0u; k0 < p.k; k0 += 16u) {
        let kk = k0 + lid.x;
        var av = 0.0;
        if (i < p.m && kk < p.k) {
            av = a[p.a_at + batch * p.a0 + i * p.a1 + kk * p.a2];
        }
        var bv = 0.0;
        if (bj < p.n && kk < p.k) {
            bv = bt[p.b_at + batch * p.b0 + bj * p.b1 + kk * p.b2];
        }
        ta[lid.y][lid.x] = av;
        tb[lid.y][lid.x] = bv;
        workgroupBarrier();
        for (var t = 0u; t < 16u; t++) {
            acc += ta[lid.y][t] * tb[lid.x][t];
        }
        workgroupBarrier();
    }
    if (i < p.m && j < p.n) {
        var v = acc * p.alpha;
#if BIAS
        v += bias[p.bias_at + j];
#endif
        let at = p.y_at + batch * p.y0 + i * p.y1 + j * p.y2;
#if ACCUMULATE
        v += y[at];
#endif
        y[at] = v;
    }
}
