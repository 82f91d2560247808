// The decode matrix-vector product y[out_offset + r] = sum_k W[r, k] * xin(k), for one token.
//
// Each workgroup takes R consecutive rows: it copies their bytes into workgroup memory with
// coalesced loads (16 bytes a thread when the span is 16-byte aligned), then dequantizes from
// there, G = 256 / R threads per row. xin is the input after the fused prologue:
//   PLAIN     x[k]
//   NORM      rmsnorm(x)[k] * nw[k]
//   RESIDUAL  h = (x + rmsnorm(delta) * wpost) * scale, then rmsnorm(h)[k] * nw[k];
//             workgroup 0 also writes h to res_out (the next residual stream)
//   GEGLU     gelu_tanh(x[k]) * x[up_offset + k]
// so the norms, residual adds and activations between matrix products cost no dispatch.

struct Params {
    k: u32,
    rows: u32,
    row_bytes: u32,
    out_offset: u32,
    rows_per_group: u32,
    up_offset: u32,
    eps: f32,
    softcap: f32,
    scale: f32,
}

#if VEC4
@group(0) @binding(0) var<storage, read> wv: array<vec4<u32>>;
#else
@group(0) @binding(0) var<storage, read> wv: array<u32>;
#endif
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#if NORM|RESIDUAL
@group(0) @binding(4) var<storage, read> nw: array<f32>;
#endif
#if RESIDUAL
@group(0) @binding(5) var<storage, read> delta: array<f32>;
@group(0) @binding(6) var<storage, read> wpost: array<f32>;
@group(0) @binding(7) var<storage, read_write> res_out: array<f32>;
#endif

const STAGE_WORDS: u32 = 3840u;
var<workgroup> stage: array<u32, STAGE_WORDS>;

// The dtype code reads weight words through `w`, here the staged copy.
fn wword(i: u32) -> u32 {
    return stage[i];
}

var<private> inv_norm: f32;
var<private> inv_delta: f32;

fn gelu_tanh(v: f32) -> f32 {
    let inner = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    return 0.5 * v * (1.0 + tanh(clamp(inner, -9.0, 9.0)));
}

#if RESIDUAL
fn resid(k: u32) -> f32 {
    return (x[k] + delta[k] * inv_delta * wpost[k]) * p.scale;
}
#endif

fn xin(k: u32) -> f32 {
#if PLAIN
    return x[k];
#endif
#if NORM
    return x[k] * inv_norm * nw[k];
#endif
#if RESIDUAL
    return resid(k) * inv_norm * nw[k];
#endif
#if GEGLU
    return gelu_tanh(x[k]) * x[p.up_offset + k];
#endif
}

fn xin4(k: u32) -> vec4<f32> {
    return vec4<f32>(xin(k), xin(k + 1u), xin(k + 2u), xin(k + 3u));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let group = wg.x + wg.y * nwg.x;
    let r_per = p.rows_per_group;
    let row0 = group * r_per;

    // The prologue's reductions (every workgroup repeats them: K values from cache).
#if NORM
    var ss = 0.0;
    for (var k = li; k < p.k; k += 256u) {
        ss += x[k] * x[k];
    }
    inv_norm = inverseSqrt(wg_sum(ss, li) / f32(p.k) + p.eps);
#endif
#if RESIDUAL
    var sd = 0.0;
    for (var k = li; k < p.k; k += 256u) {
        sd += delta[k] * delta[k];
    }
    inv_delta = inverseSqrt(wg_sum(sd, li) / f32(p.k) + p.eps);
    var sh = 0.0;
    for (var k = li; k < p.k; k += 256u) {
        let h = resid(k);
        sh += h * h;
        if (group == 0u) {
            res_out[k] = h;
        }
    }
    inv_norm = inverseSqrt(wg_sum(sh, li) / f32(p.k) + p.eps);
#endif

    // Stage this group's rows.
    let rows_here = min(r_per, p.rows - min(row0, p.rows));
    let span_bytes = rows_here * p.row_bytes;
#if VEC4
    let base = row0 * p.row_bytes / 16u;
    let n4 = (span_bytes + 15u) / 16u;
    for (var i = li; i < n4; i += 256u) {
        let v = wv[base + i];
        stage[4u * i] = v.x;
        stage[4u * i + 1u] = v.y;
        stage[4u * i + 2u] = v.z;
        stage[4u * i + 3u] = v.w;
    }
#else
    let base = row0 * p.row_bytes / 4u;
    let n1 = (span_bytes + 3u) / 4u + 1u;
    for (var i = li; i < n1; i += 256u) {
        stage[i] = wv[base + i];
    }
#endif
    workgroupBarrier();

    let g = 256u / r_per;
    let r = li / g;
    let lane = li % g;
    var acc = 0.0;
    if (r < rows_here) {
        let rb = r * p.row_bytes;
        for (var u = lane; u < p.k / 32u; u += g) {
            let q = load_unit(rb, u);
            var s = 0.0;
            for (var i = 0u; i < 8u; i++) {
                s += dot(q[i], xin4(u * 32u + 4u * i));
            }
            acc += s;
        }
    }
    red[li] = acc;
    workgroupBarrier();
    for (var s = g / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < rows_here) {
        var v = red[li];
        if (p.softcap > 0.0) {
            v = p.softcap * tanh(clamp(v / p.softcap, -9.0, 9.0));
        }
        y[p.out_offset + row0 + r] = v;
    }
}
