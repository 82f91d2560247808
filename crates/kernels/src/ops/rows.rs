//! Operations along each row (the last dimension) of a tensor of any layout: LayerNorm,
//! RMSNorm (with or without weight and bias), softmax, and per-row statistics of logits.

use super::layout::{Input, count, expect_vector};
use super::*;

const ROWS_WGSL: &str = include_str!("../wgsl/rows.wgsl");
const ROW_STATS_WGSL: &str = include_str!("../wgsl/row_stats.wgsl");

kernel_bindings!(
    /// `rows.wgsl`.
    RowsBindings { x: 0, y: 1, p: 2, w: 3, bias: 4, positions: 5 }
);

kernel_bindings!(
    /// `row_stats.wgsl`.
    RowStatsBindings { x: 0, out: 1, p: 2 }
);

/// What [`rows`] computes along each row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowOp {
    /// `(x - mean) / sqrt(var + eps)`
    LayerNorm { eps: f32 },
    /// `x / sqrt(mean(x²) + eps)`
    RmsNorm { eps: f32 },
    /// `softmax(x * scale)`
    Softmax { scale: f32 },
}

impl RowOp {
    /// The kernel's flag: RMSNorm is the variant without one.
    fn flag(self) -> Option<&'static str> {
        match self {
            Self::LayerNorm { .. } => Some("LAYER_NORM"),
            Self::RmsNorm { .. } => None,
            Self::Softmax { .. } => Some("SOFTMAX"),
        }
    }
}

/// Per-column factors after a norm: `y = norm(x) * weight + bias`, each optional (rows of
/// the norm's length, contiguous).
#[derive(Clone, Copy, Default)]
pub struct Affine<'a> {
    pub weight: Option<&'a Tensor>,
    pub bias: Option<&'a Tensor>,
}

/// Rows up to this long take a subgroup each where the device's subgroups have one size;
/// longer ones a workgroup.
pub const LANE_ROWS_MAX: u32 = 1024;

/// `op` along the last dimension of `x` into `y` (same shape; `x` may be `y` itself). A row
/// takes a subgroup (up to [`LANE_ROWS_MAX`] values, on devices whose subgroups have one
/// size) or a workgroup.
pub fn rows(
    ctx: &GpuContext,
    op: RowOp,
    affine: Affine<'_>,
    x: &Tensor,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    rows_with(ctx, op, affine, None, x, y)
}

/// Rotary embedding after a norm along rows (the rows being heads): the last dimension
/// splits into `axes` equal sections (the positions' second size), section `a` rotated by
/// the row's position on axis `a`, its first `n_rot` dimensions in pairs, by `position *
/// freq_scale * base^(-2i / n_rot)`. The row's position is that of its index over all but
/// the last two dimensions (`[tokens, heads, head_dim]`: the token).
pub struct RowRope<'a> {
    /// `[tokens, axes]` u32, contiguous.
    pub positions: &'a Tensor,
    pub n_rot: u32,
    pub pairs: RopePairs,
    pub base: f32,
    pub freq_scale: f32,
}

/// A norm along rows then [`RowRope`]'s rotation, into `y` of f32 or (devices with
/// `shader-f16`) f16: the per-head step between the q/k/v products and an attention. `x`
/// and `y` must not share a buffer (a rotation reads its partner's input).
pub fn rows_roped(
    ctx: &GpuContext,
    op: RowOp,
    affine: Affine<'_>,
    rope: &RowRope<'_>,
    x: &Tensor,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    rows_with(ctx, op, affine, Some(rope), x, y)
}

/// The rope's parameters (n_rot, section, axes, interleaved) after checking it against
/// `y`, whose leading dimensions hold the positions' tokens.
fn rope_params(rope: &RowRope<'_>, op: RowOp, y: &Tensor) -> Result<[u32; 4], GpuError> {
    if matches!(op, RowOp::Softmax { .. }) || y.rank() < 2 {
        return Err(shape(format!(
            "rows rope: rotates a norm's rows of a tensor of heads, not {op:?} over {:?}",
            y.dims()
        )));
    }
    let n = y.dim(-1);
    let tokens = y.numel() / u64::from(n.max(1)) / u64::from(y.dim(-2).max(1));
    let section = super::rope::rope_sections("rows rope", rope.positions, tokens, n, rope.n_rot)?;
    let interleaved = u32::from(rope.pairs == RopePairs::Interleaved);
    Ok([rope.n_rot, section, rope.positions.dim(1), interleaved])
}

fn rows_with(
    ctx: &GpuContext,
    op: RowOp,
    affine: Affine<'_>,
    rope: Option<&RowRope<'_>>,
    x: &Tensor,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    let half = y.dtype() == DType::F16;
    if !half || !ctx.features.shader_f16 {
        y.expect_dtype("rows y", DType::F32)?;
    }
    x.expect_dims("rows x", y.dims())?;
    if (half || rope.is_some()) && x.shares_buffer(y) {
        return Err(shape(
            "rows: a rotated or f16 output needs a buffer of its own".into(),
        ));
    }
    let xi = Input::of("rows x", x, y)?;
    let n = y.dim(-1);
    let rows = count("rows", y.numel() / u64::from(n.max(1)))?;
    if matches!(op, RowOp::Softmax { .. }) && (affine.weight.is_some() || affine.bias.is_some()) {
        return Err(shape("softmax takes no weight or bias".into()));
    }
    for (what, t) in [("rows weight", affine.weight), ("rows bias", affine.bias)] {
        if let Some(t) = t {
            expect_vector(what, t, n)?;
        }
    }
    let [n_rot, section, axes, interleaved] = match rope {
        Some(r) => rope_params(r, op, y)?,
        None => [0; 4],
    };
    let (eps, scale) = match op {
        RowOp::LayerNorm { eps } | RowOp::RmsNorm { eps } => (eps, 0.0),
        RowOp::Softmax { scale } => (0.0, scale),
    };
    let f = ctx.features;
    let lanes = (f.subgroups && f.subgroup_min_size == f.subgroup_max_size && n <= LANE_ROWS_MAX)
        .then_some(f.subgroup_min_size)
        .filter(|l| l.is_power_of_two() && *l <= 256);
    // A subgroup a row reduces with subgroup operations: no workgroup reductions to include.
    let mut parts = match lanes {
        Some(_) => vec![ROWS_WGSL],
        None => vec![REDUCE_WGSL, ROWS_WGSL],
    };
    if rope.is_some() {
        parts.insert(0, ROPE_MATH_WGSL);
    }
    let mut source = ShaderSource::new("rows", &parts)
        .flag_if(lanes.is_some(), "LANE_ROWS")
        .flag_if(xi.in_output(), "X_IN_Y")
        .flag_if(affine.weight.is_some(), "WEIGHT")
        .flag_if(affine.bias.is_some(), "BIAS")
        .flag_if(rope.is_some(), "ROPE")
        .flag_if(interleaved == 1, "INTERLEAVED")
        .flag_if(half, "Y_F16");
    if let Some(flag) = op.flag() {
        source = source.flag(flag);
    }
    let (xl, yl) = (xi.layout(y), y.layout4());
    let params = RowsParams {
        rows,
        n,
        r1: yl.dims[1],
        r2: yl.dims[2],
        x0: xl.strides[0],
        x1: xl.strides[1],
        x2: xl.strides[2],
        x3: xl.strides[3],
        x_at: xl.offset,
        y0: yl.strides[0],
        y1: yl.strides[1],
        y2: yl.strides[2],
        y3: yl.strides[3],
        y_at: yl.offset,
        w_at: affine.weight.map_or(0, Tensor::offset),
        bias_at: affine.bias.map_or(0, Tensor::offset),
        eps,
        scale,
        n_rot,
        section,
        axes,
        base: rope.map_or(0.0, |r| r.base),
        freq_scale: rope.map_or(0.0, |r| r.freq_scale),
    };
    let binds = RowsBindings {
        x: xi.bind(),
        y: Bind::Storage(y.view()),
        p: Bind::Params(Params::of(&params)),
        w: Bind::opt(affine.weight.map(Tensor::view)),
        bias: Bind::opt(affine.bias.map(Tensor::view)),
        positions: Bind::opt(rope.map(|r| r.positions.view())),
    };
    let groups = lanes.map_or(rows, |l| rows.div_ceil(256 / l));
    ctx.dispatch("rows", ctx.pipeline(&source), binds, grid(ctx, groups, 1))
}

/// Per row of `logits` (`[rows, n]`, any layout): `out[r] = (argmax as u32 bits, max,
/// log-sum-exp, entropy)` of `softmax(logits[r] / temperature)`; `out` holds `4 * rows` f32.
/// What an entropy-bound sampler needs of every row at once.
pub fn row_stats(
    ctx: &GpuContext,
    logits: &Tensor,
    temperature: f32,
    out: &Tensor,
) -> Result<Dispatch, GpuError> {
    logits.expect_dtype("row_stats logits", DType::F32)?;
    if logits.rank() != 2 || temperature.is_nan() || temperature <= 0.0 {
        return Err(shape(format!(
            "row_stats: logits {:?} at temperature {temperature}: 2-D logits and a positive temperature",
            logits.dims()
        )));
    }
    let rows = logits.dim(0);
    expect_vector("row_stats out", out, rows * 4)?;
    let l = logits.layout4();
    let params = RowStatsParams {
        rows,
        n: logits.dim(1),
        x0: l.strides[2],
        x1: l.strides[3],
        x_at: l.offset,
        out_at: out.offset(),
        inv_temp: 1.0 / temperature,
    };
    let source = ShaderSource::new("row_stats", &[REDUCE_WGSL, ROW_STATS_WGSL]);
    ctx.dispatch(
        "row_stats",
        ctx.pipeline(&source),
        RowStatsBindings {
            x: Bind::Storage(logits.view()),
            out: Bind::Storage(out.view()),
            p: Bind::Params(Params::of(&params)),
        },
        grid(ctx, rows, 1),
    )
}
