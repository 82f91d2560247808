// Per-head work shared by head_post.wgsl and attn_split.wgsl (HEAD_POST), on a head held in
// the including kernel's workgroup array `row`: RMS norm with q_norm / k_norm / no weight, and
// NeoX RoPE of the first n_rot dims. The kernel's Params name head_dim, eps, n_rot, base and
// freq_scale; FREQ_FACTORS binds `ff`.

// RMS-normalises the head in `row` (times weight `which`: 0 none, 1 q_norm, 2 k_norm).
fn norm_row(li: u32, which: u32) {
    var ss = 0.0;
    for (var d = li; d < p.head_dim; d += 256u) {
        ss += row[d] * row[d];
    }
    let inv = inverseSqrt(wg_sum(ss, li) / f32(p.head_dim) + p.eps);
    for (var d = li; d < p.head_dim; d += 256u) {
        var v = row[d] * inv;
        if (which == 1u) {
            v *= q_norm[d];
        } else if (which == 2u) {
            v *= k_norm[d];
        }
        row[d] = v;
    }
    workgroupBarrier();
}

fn rope_row(li: u32, pos: f32) {
    let hr = p.n_rot / 2u;
    for (var i = li; i < hr; i += 256u) {
        var theta = pos * p.freq_scale * pow(p.base, -2.0 * f32(i) / f32(p.n_rot));
#if FREQ_FACTORS
        theta /= ff[i];
#endif
        let c = cos(theta);
        let s = sin(theta);
        let a = row[i];
        let b = row[i + hr];
        row[i] = a * c - b * s;
        row[i + hr] = a * s + b * c;
    }
    workgroupBarrier();
}

