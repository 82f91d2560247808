// Attention of queries q[tq, heads, d] over keys and values k, v[tk, kv_heads, d] (tensors of
// any layout; query head h reads KV head h / (heads / kv_heads)), written to o[tq, heads, d].
// Query row i sits at position q_pos0 + i, key j at j. The mask mode is one flag:
//   CAUSAL  key <= query, within `window` positions when window > 0;
//   FULL    every key;
//   CANVAS  rows before `prefix` causal (and windowed); rows from `prefix` on see every key
//           from `prefix` on, and the prefix keys (only the last window - 1 when window > 0);
//   SPANS   causal (and windowed), and bidirectional among keys of the query's span
//           (span[pos] != 0 names the span);
//   LOCAL   keys with -ahead <= query - key <= back.
// The logit is scale * (q . k (+ q . r[query - key] with RELATIVE, r[rel_len, heads, d])),
// then softcapped when softcap > 0. One workgroup per (query, head); keys in blocks of 256
// with a running (online) softmax. A row that sees no key is written as zeros.

var<workgroup> qs: array<f32, 512>;
var<workgroup> probs: array<f32, 256>;

fn logit(qp: u32, kp: u32, h: u32, kvh: u32) -> f32 {
    let kb = p.k_at + kp * p.k0 + kvh * p.k1;
    var s = 0.0;
    for (var c = 0u; c < p.d; c++) {
        s += qs[c] * k[kb + c * p.k2];
    }
#if RELATIVE
    let dist = qp - kp;
    if (kp <= qp && dist < p.rel_len) {
        let rb = p.r_at + dist * p.r0 + h * p.r1;
        for (var c = 0u; c < p.d; c++) {
            s += qs[c] * r[rb + c * p.r2];
        }
    }
#endif
    s *= p.scale;
    if (p.softcap > 0.0) {
        s = p.softcap * tanh(clamp(s / p.softcap, -9.0, 9.0));
    }
    return s;
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let item = wid.x + wid.y * nwg.x;
    if (item >= p.tq * p.heads) {
        return;
    }
    let h = item % p.heads;
    let row = item / p.heads;
    let kvh = h / (p.heads / p.kv_heads);
    let qp = p.q_pos0 + row;
    let qb = p.q_at + row * p.q0 + h * p.q1;
    for (var c = li; c < p.d; c += 256u) {
        qs[c] = q[qb + c * p.q2];
    }
    workgroupBarrier();
    let range = key_range(qp);
    var run_max = MASKED;
    var run_sum = 0.0;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var kb = range.x; kb < range.y; kb += 256u) {
        let kp = kb + li;
        var s = MASKED;
        if (kp < range.y && visible(qp, kp)) {
            s = logit(qp, kp, h, kvh);
        }
        // A block without a visible key changes nothing. No branch on it: the barriers below
        // need control flow that WGSL's uniformity analysis can prove uniform, and a value
        // read back from workgroup memory is not one it can.
        let block_max = wg_max(s, li);
        let new_max = select(run_max, max(run_max, block_max), block_max > MASKED);
        let corr = exp(run_max - new_max);
        var e = 0.0;
        if (s > MASKED) {
            e = exp(s - new_max);
        }
        probs[li] = e;
        run_sum = run_sum * corr + wg_sum(e, li);
        run_max = new_max;
        acc0 *= corr;
        acc1 *= corr;
        let n = min(256u, range.y - kb);
        for (var t = 0u; t < n; t++) {
            let pt = probs[t];
            if (pt != 0.0) {
                let vb = p.v_at + (kb + t) * p.v0 + kvh * p.v1;
                if (li < p.d) {
                    acc0 += pt * v[vb + li * p.v2];
                }
                if (li + 256u < p.d) {
                    acc1 += pt * v[vb + (li + 256u) * p.v2];
                }
            }
        }
        workgroupBarrier();
    }
    let inv = select(0.0, 1.0 / run_sum, run_sum > 0.0);
    let ob = p.o_at + row * p.o0 + h * p.o1;
    if (li < p.d) {
        o[ob + li * p.o2] = acc0 * inv;
    }
    if (li + 256u < p.d) {
        o[ob + (li + 256u) * p.o2] = acc1 * inv;
    }
}
