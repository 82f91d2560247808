//! Rotary position embedding, in place.

use super::*;

kernel_bindings!(
    /// `rope.wgsl` and `rope_axes.wgsl`.
    RopeBindings { x: 0, positions: 1, p: 2, ff: 3 }
);

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
    let binds = RopeBindings {
        x: Bind::Storage(a.x),
        positions: Bind::Storage(a.positions),
        p: Bind::Params(params),
        ff: Bind::opt(a.freq_factors),
    };
    ctx.dispatch("rope", ctx.pipeline(&source), binds, grid(ctx, rows, 1))
}

const ROPE_AXES_WGSL: &str = include_str!("../wgsl/rope_axes.wgsl");

/// How [`rope_axes`] pairs the dimensions it rotates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// `(i, i + n_rot / 2)`
    Neox,
    /// `(2i, 2i + 1)`
    Interleaved,
}

/// Arguments of [`rope_axes`].
pub struct RopeAxes<'a> {
    /// `[tokens, heads, head_dim]` (any layout), rotated in place.
    pub x: &'a Tensor,
    /// `[tokens, axes]` u32 positions: one axis is 1-D rope; with two, the first half of each
    /// head turns by axis 0 (the vision tower's column), the second by axis 1 (row).
    pub positions: &'a Tensor,
    /// Dimensions rotated in each section (at most the section's width `head_dim / axes`).
    pub n_rot: u32,
    pub pairs: RopePairs,
    pub base: f32,
    pub freq_scale: f32,
    /// Per-pair frequency divisors, `n_rot / 2` values.
    pub freq_factors: Option<&'a Tensor>,
}

/// The width of each section of a `head_dim`-wide head rotated by `positions`
/// (`[tokens, axes]` u32, contiguous from the start of their view: the kernels index them
/// from 0), after checking that `n_rot` (even, not 0) fits in one.
pub(super) fn rope_sections(
    what: &str,
    positions: &Tensor,
    tokens: u64,
    head_dim: u32,
    n_rot: u32,
) -> Result<u32, GpuError> {
    positions.expect_dtype(&format!("{what} positions"), crate::DType::U32)?;
    let axes = positions.dim(1);
    let section = head_dim.checked_div(axes).unwrap_or(0);
    let laid_out = positions.rank() == 2
        && positions.is_contiguous()
        && positions.offset() == 0
        && u64::from(positions.dim(0)) == tokens;
    if !laid_out {
        return Err(shape(format!(
            "{what} positions {:?}: [{tokens}, axes] u32, contiguous from their view's start",
            positions.dims()
        )));
    }
    if axes == 0
        || !head_dim.is_multiple_of(axes)
        || n_rot == 0
        || n_rot > section
        || !n_rot.is_multiple_of(2)
    {
        return Err(shape(format!(
            "{what}: n_rot {n_rot} in {axes} sections of a {head_dim}-wide head"
        )));
    }
    Ok(section)
}

/// Rotary embedding by one or more position axes.
pub fn rope_axes(ctx: &GpuContext, a: &RopeAxes<'_>) -> Result<Dispatch, GpuError> {
    a.x.expect_dtype("rope x", crate::DType::F32)?;
    if a.x.rank() != 3 {
        return Err(shape(format!("rope: x {:?} is not 3-D", a.x.dims())));
    }
    let [tokens, heads, head_dim] = [a.x.dim(0), a.x.dim(1), a.x.dim(2)];
    let axes = a.positions.dim(1);
    rope_sections("rope", a.positions, u64::from(tokens), head_dim, a.n_rot)?;
    if let Some(ff) = a.freq_factors {
        super::layout::expect_vector("rope freq factors", ff, a.n_rot / 2)?;
        if ff.offset() != 0 {
            return Err(shape("rope freq factors: must start at their view".into()));
        }
    }
    let pairs = super::layout::count(
        "rope",
        u64::from(tokens) * u64::from(heads) * u64::from(axes) * u64::from(a.n_rot / 2),
    )?;
    let l = a.x.layout4();
    let params = RopeAxesParams {
        pairs,
        heads,
        head_dim,
        axes,
        n_rot: a.n_rot,
        x0: l.strides[1],
        x1: l.strides[2],
        x2: l.strides[3],
        x_at: l.offset,
        base: a.base,
        freq_scale: a.freq_scale,
    };
    let source = ShaderSource::new("rope_axes", &[ROPE_MATH_WGSL, ROPE_AXES_WGSL])
        .flag_if(a.pairs == RopePairs::Interleaved, "INTERLEAVED")
        .flag_if(a.freq_factors.is_some(), "FREQ_FACTORS");
    ctx.dispatch(
        "rope_axes",
        ctx.pipeline(&source),
        RopeBindings {
            x: Bind::Storage(a.x.view()),
            positions: Bind::Storage(a.positions.view()),
            p: Bind::Params(Params::of(&params)),
            ff: Bind::opt(a.freq_factors.map(Tensor::view)),
        },
        grid(ctx, pairs.div_ceil(256), 1),
    )
}
