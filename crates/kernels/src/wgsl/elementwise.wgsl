// Elementwise kernels over n values, one flag each:
// GEGLU:  y[i] = gelu_tanh(a[i]) * b[i]       (a = gate, b = up; rows of a/b may be strided)
// ADD:    y[i] += a[i]
// SCALE:  y[i] *= s
// SOFTCAP: y[i] = c * tanh(y[i] / c)

struct Params {
    n: u32,
    cols: u32,
    a_stride: u32,
    b_stride: u32,
    s: f32,
    b_offset: u32,
}

#if GEGLU|ADD
@group(0) @binding(0) var<storage, read> a: array<f32>;
#endif
#if GEGLU
@group(0) @binding(1) var<storage, read> b: array<f32>;
#endif
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) {
        return;
    }
#if GEGLU
    let r = i / p.cols;
    let c = i % p.cols;
    y[i] = gelu_tanh(a[r * p.a_stride + c]) * b[p.b_offset + r * p.b_stride + c];
#endif
#if ADD
    y[i] += a[i];
#endif
#if SCALE
    y[i] *= p.s;
#endif
#if SOFTCAP
    y[i] = softcapped(y[i], p.s);
#endif
}
