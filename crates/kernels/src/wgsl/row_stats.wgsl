// Per row of logits (one workgroup a row, rows of any layout): the argmax (first index of the
// maximum), the maximum, log-sum-exp and entropy (nats) of softmax(x * inv_temp), written as
// out[row] = (argmax, max, lse, entropy); the argmax's bits as u32.

struct Params {
    rows: u32,
    n: u32,
    x0: u32,
    x1: u32,
    x_at: u32,
    out_at: u32,
    inv_temp: f32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> best: array<u32, 256>;

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
    let base = p.x_at + row * p.x0;
    var m = -3.0e38;
    var mi = 0xffffffffu;
    for (var c = li; c < p.n; c += 256u) {
        let v = x[base + c * p.x1];
        if (v > m) {
            m = v;
            mi = c;
        }
    }
    let top = wg_max(m, li);
    // The first index holding the maximum: each thread offers its own when it holds it.
    best[li] = select(0xffffffffu, mi, m == top);
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (li < s) {
            best[li] = min(best[li], best[li + s]);
        }
        workgroupBarrier();
    }
    let arg = best[0];
    let mt = top * p.inv_temp;
    var se = 0.0;
    var sxe = 0.0;
    for (var c = li; c < p.n; c += 256u) {
        let z = x[base + c * p.x1] * p.inv_temp - mt;
        let e = exp(z);
        se += e;
        sxe += e * z;
    }
    let sum = wg_sum(se, li);
    let weighted = wg_sum(sxe, li);
    if (li == 0u) {
        // H = log(sum) - sum(e z) / sum, with z = x * inv_temp - max.
        let lse = log(sum);
        let o = p.out_at + 4u * row;
        out[o] = bitcast<f32>(arg);
        out[o + 1u] = top;
        out[o + 2u] = mt + lse;
        out[o + 3u] = lse - weighted / sum;
    }
}
