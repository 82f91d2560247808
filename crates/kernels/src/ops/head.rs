//! The per-head step after the q/k/v products: norms, rope and the KV store in one kernel.

use super::*;

kernel_bindings!(
    /// `head_post.wgsl`.
    HeadPostBindings {
        qkv: 0,
        q_norm: 1,
        k_norm: 2,
        k_cache: 3,
        v_cache: 4,
        positions: 5,
        p: 6,
        ff: 7,
    }
);

/// Arguments of [`head_post`].
pub struct HeadPostArgs<'a> {
    /// Per token `[q | k | v]` (v absent when `k_is_v`), `stride` floats apart.
    pub qkv: &'a View,
    pub q_norm: &'a View,
    /// K's norm weight and the caches, for layers that own a KV cache.
    pub kv: Option<HeadPostKv<'a>>,
    pub positions: &'a View,
    pub tokens: u32,
    pub n_head: u32,
    pub head_dim: u32,
    pub stride: u32,
    pub n_rot: u32,
    pub base: f32,
    pub freq_scale: f32,
    pub freq_factors: Option<&'a View>,
    pub eps: f32,
    /// Cache rows per sequence when the cache holds several (a batch of sequences' decode
    /// steps): a token at cache row `p` has RoPE position `p % slot_rows`. 0: one sequence.
    pub slot_rows: u32,
}

/// The K/V side of [`head_post`].
pub struct HeadPostKv<'a> {
    pub k_norm: &'a View,
    pub k_cache: &'a View,
    pub v_cache: &'a View,
    pub n_kv: u32,
    /// V is the raw K projection (Gemma 4 layers without a V projection).
    pub k_is_v: bool,
    /// V gets an RMS norm without weight (Gemma 4).
    pub v_norm: bool,
}

/// The shapes [`head_post`] and the head work of [`attention_decode`] need: head dims, the
/// rows' width within their stride, and every weight's length.
pub(super) fn check_head_post(a: &HeadPostArgs<'_>) -> Result<(), GpuError> {
    if a.head_dim > MAX_HEAD_DIM || a.n_rot > a.head_dim || !a.n_rot.is_multiple_of(2) {
        return Err(shape(format!(
            "head_post: head_dim {} n_rot {}",
            a.head_dim, a.n_rot
        )));
    }
    let width = head_post_width(a);
    if a.stride < width {
        return Err(shape(format!("head_post: stride {} < {width}", a.stride)));
    }
    a.qkv.expect_len32(
        "head_post qkv",
        u64::from(a.tokens.max(1) - 1) * u64::from(a.stride) + u64::from(width),
    )?;
    a.q_norm
        .expect_len32("head_post q_norm", u64::from(a.head_dim))?;
    a.positions
        .expect_len32("head_post positions", u64::from(a.tokens))?;
    if let Some(kv) = &a.kv {
        kv.k_norm
            .expect_len32("head_post k_norm", u64::from(a.head_dim))?;
    }
    if let Some(ff) = a.freq_factors {
        ff.expect_len32("head_post freq factors", u64::from(a.n_rot / 2))?;
    }
    Ok(())
}

/// Floats of one token's `[q | k | v]` row (v absent when V is K, k and v without a cache).
pub(super) fn head_post_width(a: &HeadPostArgs<'_>) -> u32 {
    let kv =
        a.kv.as_ref()
            .map_or(0, |kv| kv.n_kv * if kv.k_is_v { 1 } else { 2 });
    (a.n_head + kv) * a.head_dim
}

/// Per-head Q/K(/V) norms, RoPE and the KV-cache store in one dispatch.
pub fn head_post(ctx: &GpuContext, a: &HeadPostArgs<'_>) -> Result<Dispatch, GpuError> {
    check_head_post(a)?;
    let n_kv = a.kv.as_ref().map_or(0, |kv| kv.n_kv);
    // Layers without their own cache still bind something in the K/V slots (never touched
    // with n_kv = 0): the read-only slot takes q_norm, the writable ones the context's unused
    // words.
    let (k_norm, kc, vc, capacity) = match &a.kv {
        Some(kv) => {
            let row = u64::from(kv.n_kv * a.head_dim);
            (
                kv.k_norm,
                kv.k_cache.clone(),
                kv.v_cache.clone(),
                (kv.k_cache.len32() / row) as u32,
            )
        }
        None => {
            let [k, v] = ctx.unused_storage();
            (a.q_norm, k, v, 0)
        }
    };
    let source = ShaderSource::new(
        "head_post",
        &[REDUCE_WGSL, ROPE_MATH_WGSL, HEAD_MATH_WGSL, HEAD_POST_WGSL],
    )
    .flag_if(a.freq_factors.is_some(), "FREQ_FACTORS")
    .flag_if(a.kv.as_ref().is_some_and(|kv| kv.k_is_v), "K_IS_V")
    .flag_if(a.kv.as_ref().is_some_and(|kv| kv.v_norm), "V_NORM");
    let params = Params::of(&HeadPostParams {
        n_head: a.n_head,
        n_kv,
        head_dim: a.head_dim,
        n_rot: a.n_rot,
        stride: a.stride,
        tokens: a.tokens,
        capacity,
        eps: a.eps,
        base: a.base,
        freq_scale: a.freq_scale,
        slot_rows: a.slot_rows,
    });
    let binds = HeadPostBindings {
        qkv: Bind::Storage(a.qkv),
        q_norm: Bind::Storage(a.q_norm),
        k_norm: Bind::Storage(k_norm),
        k_cache: Bind::Storage(&kc),
        v_cache: Bind::Storage(&vc),
        positions: Bind::Storage(a.positions),
        p: Bind::Params(params),
        ff: Bind::opt(a.freq_factors),
    };
    ctx.dispatch(
        "head_post",
        ctx.pipeline(&source),
        binds,
        [a.n_head + n_kv, a.tokens, 1],
    )
}
