// Per-head work shared by head_post.wgsl and attn_split.wgsl (HEAD_POST), on heads held in
// the kernel's workgroup array `heads` (slot r, MAX_HD values each): RMS norm with q_norm,
// k_norm or no weight, and NeoX RoPE (rope_math.wgsl) of the first n_rot dims. The head's
// numbers come as a `Head`; the arrays are the includer's (`heads`, whose row count is its
// own, and the storage buffers q_norm, k_norm and `ff`: WGSL passes neither to a function).
// Weights are loaded before the reduction so the two overlap.

struct Head {
    head_dim: u32,
    eps: f32,
    rope: Rope,
}

// RMS-normalises head `r` (times weight `which`: 0 none, 1 q_norm, 2 k_norm).
fn norm_row(r: u32, li: u32, which: u32, head: Head) {
    var ss = 0.0;
    var w: array<f32, MAX_HD / 256u>;
    for (var j = 0u; j < MAX_HD / 256u; j++) {
        let d = li + 256u * j;
        if (d < head.head_dim) {
            ss += heads[r][d] * heads[r][d];
            w[j] = 1.0;
            if (which == 1u) {
                w[j] = q_norm[d];
            } else if (which == 2u) {
                w[j] = k_norm[d];
            }
        }
    }
    let inv = inverseSqrt(wg_sum(ss, li) / f32(head.head_dim) + head.eps);
    for (var j = 0u; j < MAX_HD / 256u; j++) {
        let d = li + 256u * j;
        if (d < head.head_dim) {
            heads[r][d] *= inv * w[j];
        }
    }
    workgroupBarrier();
}

fn rope_row(r: u32, li: u32, pos: f32, head: Head) {
    let hr = head.rope.n_rot / 2u;
    for (var i = li; i < hr; i += 256u) {
        let v = rotated(vec2<f32>(heads[r][i], heads[r][i + hr]), i, pos, head.rope);
        heads[r][i] = v.x;
        heads[r][i + hr] = v.y;
    }
    workgroupBarrier();
}
