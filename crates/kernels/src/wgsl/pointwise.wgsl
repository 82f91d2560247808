// y = f(a) or y = a (op) b over tensors of any layout (the sizes `d`, each operand's strides
// and offset; a broadcast operand has stride 0). One thread per element of y.
// Flags: BINARY with ADD | SUB | MUL | GATED (activation(a) * b); without BINARY, y =
// activation(a). A_IN_Y / B_IN_Y: that operand lives in y's buffer (read through y).

struct Params {
    n: u32,
    d0: u32,
    d1: u32,
    d2: u32,
    d3: u32,
    y0: u32,
    y1: u32,
    y2: u32,
    y3: u32,
    y_at: u32,
    a0: u32,
    a1: u32,
    a2: u32,
    a3: u32,
    a_at: u32,
    b0: u32,
    b1: u32,
    b2: u32,
    b3: u32,
    b_at: u32,
    lo: f32,
    hi: f32,
}

#if !A_IN_Y
@group(0) @binding(0) var<storage, read> a: array<f32>;
#endif
#if BINARY
#if !B_IN_Y
@group(0) @binding(1) var<storage, read> b: array<f32>;
#endif
#endif
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

fn read_a(o: u32) -> f32 {
#if A_IN_Y
    return y[o];
#else
    return a[o];
#endif
}

#if BINARY
fn read_b(o: u32) -> f32 {
#if B_IN_Y
    return y[o];
#else
    return b[o];
#endif
}
#endif

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) {
        return;
    }
    let d = vec4<u32>(p.d0, p.d1, p.d2, p.d3);
    let av = read_a(at4(i, d, vec4<u32>(p.a0, p.a1, p.a2, p.a3), p.a_at));
#if BINARY
    let bv = read_b(at4(i, d, vec4<u32>(p.b0, p.b1, p.b2, p.b3), p.b_at));
#endif
    var v = activation(av, p.lo, p.hi);
#if ADD
    v = av + bv;
#endif
#if SUB
    v = av - bv;
#endif
#if MUL
    v = av * bv;
#endif
#if GATED
    v = v * bv;
#endif
    y[at4(i, d, vec4<u32>(p.y0, p.y1, p.y2, p.y3), p.y_at)] = v;
}
