//! Rotary position embedding, in place.

use super::*;

/// Arguments of [`rope`].
pub struct RopeArgs<'a> {
    /// `[tokens, heads, head_dim]`, rotated in place.
    pub x: &'a View,
    /// One position per token.
    pub positions: &'a View,
    pub tokens: u32,
    pub heads: u32,
    pub head_dim: u32,
    /// Rotated dimensions (pairs `i`, `i + n_rot/2`); the rest pass through.
    pub n_rot: u32,
    pub base: f32,
    pub freq_scale: f32,
    /// Per-pair frequency divisors (`rope_freqs`), `n_rot / 2` values.
    pub freq_factors: Option<&'a View>,
}

/// NeoX rotary position embedding.
pub fn rope(ctx: &GpuContext, a: &RopeArgs<'_>) -> Result<Dispatch, GpuError> {
    if a.n_rot > a.head_dim || !a.n_rot.is_multiple_of(2) {
        return Err(shape(format!(
            "rope: n_rot {} for head_dim {}",
            a.n_rot, a.head_dim
        )));
    }
    let rows = a.tokens * a.heads;
    a.x.expect_len32("rope x", u64::from(rows) * u64::from(a.head_dim))?;
    a.positions
        .expect_len32("rope positions", u64::from(a.tokens))?;
    if let Some(ff) = a.freq_factors {
        ff.expect_len32("rope freq factors", u64::from(a.n_rot / 2))?;
    }
    let source = ShaderSource::new("rope", &[ROPE_MATH_WGSL, ROPE_WGSL])
        .flag_if(a.freq_factors.is_some(), "FREQ_FACTORS");
    let params = Params::of(&RopeParams {
        heads: a.heads,
        head_dim: a.head_dim,
        n_rot: a.n_rot,
        rows,
        base: a.base,
        freq_scale: a.freq_scale,
    });
    let mut binds = vec![
        Bind::Storage(a.x),
        Bind::Storage(a.positions),
        Bind::Params(params),
    ];
    if let Some(ff) = a.freq_factors {
        binds.push(Bind::Storage(ff));
    }
    ctx.dispatch("rope", ctx.pipeline(&source), &binds, grid(ctx, rows, 1))
}
