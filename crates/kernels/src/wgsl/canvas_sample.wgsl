// One draw per row of logits from softmax(x * inv_temp), by inverse CDF against a given
// uniform: the smallest index whose cumulative probability exceeds u[row]. One workgroup a
// row; thread li sums the probabilities of its contiguous stretch of the row, a scan over the
// threads gives each stretch's start, and the thread whose stretch holds u walks it. Past the
// total mass (rounding) the row's argmax is taken. stats[row] = (argmax, max, lse, entropy) of
// `row_stats` at the same temperature.

struct Params {
    rows: u32,
    n: u32,
    x_stride: u32,
    inv_temp: f32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read> u: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> scan: array<f32, 256>;
var<workgroup> found: atomic<u32>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.x_stride;
    let lse = stats[4u * row + 2u];
    let per = (p.n + 255u) / 256u;
    let lo = min(li * per, p.n);
    let hi = min(lo + per, p.n);
    var mine = 0.0;
    for (var c = lo; c < hi; c++) {
        mine += exp(x[base + c] * p.inv_temp - lse);
    }
    if (li == 0u) {
        atomicStore(&found, 0xffffffffu);
    }
    // Inclusive scan of the stretches' sums.
    scan[li] = mine;
    workgroupBarrier();
    for (var s = 1u; s < 256u; s <<= 1u) {
        var v = scan[li];
        if (li >= s) {
            v += scan[li - s];
        }
        workgroupBarrier();
        scan[li] = v;
        workgroupBarrier();
    }
    let goal = max(u[row], 0.0);
    let end = scan[li];
    let start = end - mine;
    if (goal >= start && goal < end) {
        var acc = start;
        var pick = hi - 1u;
        for (var c = lo; c < hi; c++) {
            acc += exp(x[base + c] * p.inv_temp - lse);
            if (acc > goal) {
                pick = c;
                break;
            }
        }
        atomicMin(&found, pick);
    }
    workgroupBarrier();
    if (li == 0u) {
        let f = atomicLoad(&found);
        out[row] = select(f, bitcast<u32>(stats[4u * row]), f == 0xffffffffu);
    }
}
