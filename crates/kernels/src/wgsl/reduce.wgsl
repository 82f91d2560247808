// Workgroup-wide sum and max over 256 threads. With subgroups of exactly 32 lanes
// (SUBGROUP32), each subgroup reduces in registers and the eight partial results meet in
// workgroup memory: two barriers instead of a tree's nine.

var<workgroup> red: array<f32, 256>;

fn wg_sum(v: f32, li: u32) -> f32 {
#if SUBGROUP32
    let s = subgroupAdd(v);
    if (li % 32u == 0u) {
        red[li / 32u] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < 8u; i++) {
        total += red[i];
    }
#else
    red[li] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
#endif
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, li: u32) -> f32 {
#if SUBGROUP32
    let s = subgroupMax(v);
    if (li % 32u == 0u) {
        red[li / 32u] = s;
    }
    workgroupBarrier();
    var total = red[0];
    for (var i = 1u; i < 8u; i++) {
        total = max(total, red[i]);
    }
#else
    red[li] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] = max(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    let total = red[0];
#endif
    workgroupBarrier();
    return total;
}
