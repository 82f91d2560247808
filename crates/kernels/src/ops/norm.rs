//! RMS normalisation of rows.

use super::*;

/// Longest row the norm kernels take: each of a workgroup's 256 threads holds 24 values in
/// registers (Gemma's widest residual stream is 5376).
pub const MAX_NORM_DIM: u32 = 256 * 24;

pub(super) fn check_norm_dim(dim: u32) -> Result<(), GpuError> {
    if dim == 0 || dim > MAX_NORM_DIM {
        return Err(shape(format!(
            "norm over rows of {dim} (1..={MAX_NORM_DIM})"
        )));
    }
    Ok(())
}

/// How [`rms_norm`] writes its result.
pub enum NormOut<'a> {
    /// `y = norm(x) * w`
    To(&'a View),
    /// `x = norm(x) * w`
    InPlace,
    /// `res += norm(x) * w` (a post-norm and the residual add in one pass)
    AddTo(&'a View),
}

/// Arguments of [`rms_norm`]: `rows` rows of `dim` values of `x`, `x_stride` apart, with an
/// optional per-element weight.
pub struct RmsNorm<'a> {
    pub x: &'a View,
    pub out: NormOut<'a>,
    pub weight: Option<&'a View>,
    pub rows: u32,
    pub dim: u32,
    pub x_stride: u32,
    pub eps: f32,
}

/// RMS normalisation of rows, as [`RmsNorm`] says.
pub fn rms_norm(ctx: &GpuContext, a: RmsNorm<'_>) -> Result<Dispatch, GpuError> {
    let RmsNorm {
        x,
        out,
        weight,
        rows,
        dim,
        x_stride,
        eps,
    } = a;
    check_norm_dim(dim)?;
    x.expect_len32(
        "rms_norm x",
        u64::from(rows.max(1) - 1) * u64::from(x_stride) + u64::from(dim),
    )?;
    if let Some(w) = weight {
        w.expect_len32("rms_norm weight", u64::from(dim))?;
    }
    let (inplace, residual, y) = match &out {
        NormOut::To(y) => (false, false, Some(*y)),
        NormOut::InPlace => (true, false, None),
        NormOut::AddTo(y) => (false, true, Some(*y)),
    };
    if let Some(y) = y {
        y.expect_len32("rms_norm out", u64::from(rows) * u64::from(dim))?;
    }
    let source = ShaderSource::new("rms_norm", &[REDUCE_WGSL, NORM_WGSL])
        .flag_if(inplace, "INPLACE")
        .flag_if(residual, "RESIDUAL")
        .flag_if(weight.is_some(), "WEIGHT");
    let params = Params::of(&NormParams {
        dim,
        rows,
        eps,
        x_stride,
        scale: 1.0,
    });
    let binds = NormBindings {
        x: Bind::Storage(x),
        y: Bind::opt(y),
        p: Bind::Params(params),
        nw: Bind::opt(weight),
        delta: Bind::Skip,
        post: Bind::Skip,
    };
    ctx.dispatch("rms_norm", ctx.pipeline(&source), binds, grid(ctx, rows, 1))
}

kernel_bindings!(
    /// `norm.wgsl` (`delta` and `post`: the residual step of [`residual_norm`]).
    NormBindings { x: 0, y: 1, p: 2, nw: 3, delta: 4, post: 5 }
);
