// Shared by attend.wgsl, attend_tiled.wgsl and attend_coop.wgsl: the parameters, the
// bindings and the mask modes (see attend.wgsl).

struct Params {
    tq: u32,
    tk: u32,
    heads: u32,
    kv_heads: u32,
    d: u32,
    q_pos0: u32,
    window: u32,
    prefix: u32,
    back: u32,
    ahead: u32,
    rel_len: u32,
    scale: f32,
    softcap: f32,
    q0: u32,
    q1: u32,
    q_at: u32,
    k0: u32,
    k1: u32,
    k_at: u32,
    v0: u32,
    v1: u32,
    v_at: u32,
    o0: u32,
    o1: u32,
    o_at: u32,
    r0: u32,
    r1: u32,
    r_at: u32,
    q2: u32,
    k2: u32,
    v2: u32,
    o2: u32,
    r2: u32,
}

// QKV_F16 (the tensor-core kernel only): q, k and v are half floats.
#if QKV_F16
alias Elem = f16;
#else
alias Elem = f32;
#endif
@group(0) @binding(0) var<storage, read> q: array<Elem>;
#if KV_VEC4
// Keys and values read four at a time: contiguous heads whose offsets and strides are
// whole vec4s (KV_VEC4's reader divides them by 4).
@group(0) @binding(1) var<storage, read> k: array<vec4<Elem>>;
@group(0) @binding(2) var<storage, read> v: array<vec4<Elem>>;
#else
@group(0) @binding(1) var<storage, read> k: array<Elem>;
@group(0) @binding(2) var<storage, read> v: array<Elem>;
#endif
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
#if SPANS
@group(0) @binding(5) var<storage, read> span: array<u32>;
#endif
#if RELATIVE
@group(0) @binding(6) var<storage, read> r: array<f32>;
#endif

const MASKED: f32 = -3.0e38;
fn causal(qp: u32, kp: u32) -> bool {
    return kp <= qp && (p.window == 0u || qp - kp < p.window);
}

fn visible(qp: u32, kp: u32) -> bool {
#if CAUSAL
    return causal(qp, kp);
#endif
#if FULL
    return true;
#endif
#if CANVAS
    if (qp < p.prefix) {
        return causal(qp, kp);
    }
    return kp >= p.prefix || p.window == 0u || kp + p.window - 1u >= p.prefix;
#endif
#if SPANS
    return causal(qp, kp) || (span[qp] != 0u && span[qp] == span[kp]);
#endif
#if LOCAL
    return kp + p.back >= qp && kp <= qp + p.ahead;
#endif
}

// The keys [lo, hi) a query at `qp` can see at most.
fn key_range(qp: u32) -> vec2<u32> {
    var lo = 0u;
    var hi = p.tk;
#if CAUSAL
    hi = min(hi, qp + 1u);
    if (p.window > 0u && qp + 1u > p.window) {
        lo = qp + 1u - p.window;
    }
#endif
#if LOCAL
    hi = min(hi, qp + p.ahead + 1u);
    lo = select(0u, qp - p.back, qp > p.back);
#endif
    return vec2<u32>(lo, max(lo, hi));
}


// The keys [lo, hi) some query of a block at positions [first, last] can see (the tiled
// kernels).
fn block_keys(first: u32, last: u32) -> vec2<u32> {
    let a = key_range(first);
    let b = key_range(last);
    return vec2<u32>(min(a.x, b.x), max(a.y, b.y));
}
