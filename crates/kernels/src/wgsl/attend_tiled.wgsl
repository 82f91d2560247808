// attend.wgsl's attention for many queries at once (an image's patches, a prompt): one
// workgroup per (block of 64 queries, head), one query per thread, each holding its query
// row and output accumulators in registers. Keys and values come through workgroup memory in
// tiles of TILE_KEYS rows that all 64 queries read, so each key row is loaded once per block
// rather than once per query. Per tile a thread scores its keys, rescales its running sums
// once by the tile's new maximum (online softmax), and adds the tile's weighted values.
// Every mask mode of attend_mask.wgsl; no relative-position term (attend.wgsl has it).
// Head dimensions up to 4 * MAX_D4, padded with zeros to D4 vec4s.

override D4: u32 = 16u;
// Register arrays as long as the head needs where the head dimension is a common one (so the
// compiler keeps them in registers), else the longest.
#if HEAD_DIM_64
const MAX_D4: u32 = 16u;
#endif
#if HEAD_DIM_72
const MAX_D4: u32 = 18u;
#endif
#if !HEAD_DIM_64
#if !HEAD_DIM_72
const MAX_D4: u32 = 32u;
#endif
#endif
const BLOCK: u32 = 64u;
const TILE_KEYS: u32 = 16u;

var<workgroup> ks: array<vec4<f32>, 512>;
var<workgroup> vs: array<vec4<f32>, 512>;

fn load_row(buf_at: u32, stride: u32, c4: u32, is_key: bool) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let c = c4 * 4u + i;
        if (c < p.d) {
            if (is_key) {
                out[i] = k[buf_at + c * stride];
            } else {
                out[i] = v[buf_at + c * stride];
            }
        }
    }
    return out;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let item = wid.x + wid.y * nwg.x;
    let blocks = (p.tq + BLOCK - 1u) / BLOCK;
    if (item >= blocks * p.heads) {
        return;
    }
    let h = item % p.heads;
    let first = (item / p.heads) * BLOCK;
    let row = first + li;
    let live = row < p.tq;
    let kvh = h / (p.heads / p.kv_heads);
    let qp = p.q_pos0 + min(row, p.tq - 1u);
    var qv: array<vec4<f32>, MAX_D4>;
    var acc: array<vec4<f32>, MAX_D4>;
    let qb = p.q_at + min(row, p.tq - 1u) * p.q0 + h * p.q1;
    for (var c4 = 0u; c4 < D4; c4++) {
        var x = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i++) {
            let c = c4 * 4u + i;
            if (c < p.d) {
                x[i] = q[qb + c * p.q2];
            }
        }
        qv[c4] = x;
        acc[c4] = vec4<f32>(0.0);
    }
    let last = p.q_pos0 + min(first + BLOCK, p.tq) - 1u;
    let range = block_keys(p.q_pos0 + first, last);
    let mine = key_range(qp);
    var run_max = MASKED;
    var run_sum = 0.0;
    for (var kb = range.x; kb < range.y; kb += TILE_KEYS) {
        let n = min(TILE_KEYS, range.y - kb);
        for (var e = li; e < TILE_KEYS * D4; e += BLOCK) {
            let j = e / D4;
            let c4 = e % D4;
            var kx = vec4<f32>(0.0);
            var vx = vec4<f32>(0.0);
            if (j < n) {
                kx = load_row(p.k_at + (kb + j) * p.k0 + kvh * p.k1, p.k2, c4, true);
                vx = load_row(p.v_at + (kb + j) * p.v0 + kvh * p.v1, p.v2, c4, false);
            }
            ks[j * D4 + c4] = kx;
            vs[j * D4 + c4] = vx;
        }
        workgroupBarrier();
        var s = array<f32, TILE_KEYS>();
        var tile_max = MASKED;
        for (var j = 0u; j < TILE_KEYS; j++) {
            let kp = kb + j;
            var sj = MASKED;
            if (live && j < n && kp >= mine.x && kp < mine.y && visible(qp, kp)) {
                var dot = vec4<f32>(0.0);
                for (var c4 = 0u; c4 < D4; c4++) {
                    dot += qv[c4] * ks[j * D4 + c4];
                }
                sj = (dot.x + dot.y + dot.z + dot.w) * p.scale;
                if (p.softcap > 0.0) {
                    sj = p.softcap * tanh(clamp(sj / p.softcap, -9.0, 9.0));
                }
            }
            s[j] = sj;
            tile_max = max(tile_max, sj);
        }
        if (tile_max > MASKED) {
            let new_max = max(run_max, tile_max);
            let corr = exp(run_max - new_max);
            run_sum *= corr;
            for (var c4 = 0u; c4 < D4; c4++) {
                acc[c4] *= corr;
            }
            for (var j = 0u; j < TILE_KEYS; j++) {
                if (s[j] > MASKED) {
                    let pj = exp(s[j] - new_max);
                    run_sum += pj;
                    for (var c4 = 0u; c4 < D4; c4++) {
                        acc[c4] += pj * vs[j * D4 + c4];
                    }
                }
            }
            run_max = new_max;
        }
        workgroupBarrier();
    }
    if (!live) {
        return;
    }
    let inv = select(0.0, 1.0 / run_sum, run_sum > 0.0);
    let ob = p.o_at + row * p.o0 + h * p.o1;
    for (var c4 = 0u; c4 < D4; c4++) {
        let y = acc[c4] * inv;
        for (var i = 0u; i < 4u; i++) {
            let c = c4 * 4u + i;
            if (c < p.d) {
                o[ob + c * p.o2] = y[i];
            }
        }
    }
}
