//! The entropy-bound sampler of a text-diffusion canvas (DiffusionGemma): a draw per row by
//! inverse CDF against given uniforms, then the acceptance of the lowest-entropy positions,
//! the renoising of the others and the stop rule, all on the GPU. Per-row statistics come
//! from [`row_stats`] at the same temperature.

use super::*;

const CANVAS_SAMPLE_WGSL: &str = include_str!("../wgsl/canvas_sample.wgsl");
const CANVAS_ACCEPT_WGSL: &str = include_str!("../wgsl/canvas_accept.wgsl");

/// The most canvas rows [`canvas_accept`] sorts in its one workgroup.
pub const MAX_CANVAS_ROWS: u32 = 1024;

kernel_bindings!(
    /// `canvas_sample.wgsl`.
    CanvasSampleBindings { x: 0, stats: 1, u: 2, out: 3, p: 4 }
);

kernel_bindings!(
    /// `canvas_accept.wgsl`.
    CanvasAcceptBindings {
        stats: 0,
        drawn: 1,
        renoise: 2,
        next: 3,
        accepted: 4,
        state: 5,
        status: 6,
        p: 7,
    }
);

/// Arguments of [`canvas_draw`]: `rows` rows of `n` logits, contiguous.
pub struct CanvasDraw<'a> {
    pub logits: &'a View,
    pub rows: u32,
    pub n: u32,
    pub temperature: f32,
    /// `row_stats` of the logits at `temperature` (4 floats a row).
    pub stats: &'a View,
    /// A uniform in [0, 1) per row.
    pub uniforms: &'a View,
    /// The drawn token per row (u32).
    pub out: &'a View,
}

/// Per row, the first index whose cumulative probability under softmax(logits / temperature)
/// exceeds the row's uniform.
pub fn canvas_draw(ctx: &GpuContext, a: &CanvasDraw<'_>) -> Result<Dispatch, GpuError> {
    if a.temperature.is_nan() || a.temperature <= 0.0 || a.n == 0 {
        return Err(shape(format!(
            "canvas_draw: {} logits a row at temperature {}",
            a.n, a.temperature
        )));
    }
    a.logits
        .expect_len32("canvas_draw logits", u64::from(a.rows) * u64::from(a.n))?;
    a.stats
        .expect_len32("canvas_draw stats", 4 * u64::from(a.rows))?;
    a.uniforms
        .expect_len32("canvas_draw uniforms", u64::from(a.rows))?;
    a.out.expect_len32("canvas_draw out", u64::from(a.rows))?;
    let params = Params::of(&CanvasSampleParams {
        rows: a.rows,
        n: a.n,
        x_stride: a.n,
        inv_temp: 1.0 / a.temperature,
    });
    let source = ShaderSource::new("canvas_sample", &[CANVAS_SAMPLE_WGSL]);
    ctx.dispatch(
        "canvas_draw",
        ctx.pipeline(&source),
        CanvasSampleBindings {
            x: Bind::Storage(a.logits),
            stats: Bind::Storage(a.stats),
            u: Bind::Storage(a.uniforms),
            out: Bind::Storage(a.out),
            p: Bind::Params(params),
        },
        grid(ctx, a.rows, 1),
    )
}

/// Arguments of [`canvas_accept`] for a canvas of `rows` positions.
pub struct CanvasAcceptArgs<'a> {
    pub rows: u32,
    /// `row_stats` of the step's logits (4 floats a row).
    pub stats: &'a View,
    /// [`canvas_draw`]'s tokens.
    pub drawn: &'a View,
    /// A token per row for the positions not accepted.
    pub renoise: &'a View,
    /// The next step's canvas (u32 a row).
    pub next: &'a View,
    /// 1 where accepted, else 0 (u32 a row).
    pub accepted: &'a View,
    /// `1 + rows` u32: steps the argmax canvas stayed the same, then the previous step's
    /// argmax canvas. A block starts with 0 and `u32::MAX`s.
    pub state: &'a View,
    /// 4 u32: accepted count, mean entropy (f32 bits), steps the same, done (0/1).
    pub status: &'a View,
    /// Accept while the entropy of the positions before stays within this.
    pub bound: f32,
    pub stability: u32,
    pub confidence: f32,
}

/// The acceptance, renoising and stop rule of one denoising step, in one workgroup.
pub fn canvas_accept(ctx: &GpuContext, a: &CanvasAcceptArgs<'_>) -> Result<Dispatch, GpuError> {
    if a.rows == 0 || a.rows > MAX_CANVAS_ROWS {
        return Err(shape(format!(
            "canvas_accept: {} rows (1..={MAX_CANVAS_ROWS})",
            a.rows
        )));
    }
    let rows = u64::from(a.rows);
    a.stats.expect_len32("canvas_accept stats", 4 * rows)?;
    for (what, v) in [
        ("drawn", a.drawn),
        ("renoise", a.renoise),
        ("next", a.next),
        ("accepted", a.accepted),
    ] {
        v.expect_len32(&format!("canvas_accept {what}"), rows)?;
    }
    a.state.expect_len32("canvas_accept state", 1 + rows)?;
    a.status.expect_len32("canvas_accept status", 4)?;
    let params = Params::of(&CanvasAcceptParams {
        rows: a.rows,
        bound: a.bound,
        stability: a.stability,
        confidence: a.confidence,
    });
    let source = ShaderSource::new("canvas_accept", &[CANVAS_ACCEPT_WGSL]);
    ctx.dispatch(
        "canvas_accept",
        ctx.pipeline(&source),
        CanvasAcceptBindings {
            stats: Bind::Storage(a.stats),
            drawn: Bind::Storage(a.drawn),
            renoise: Bind::Storage(a.renoise),
            next: Bind::Storage(a.next),
            accepted: Bind::Storage(a.accepted),
            state: Bind::Storage(a.state),
            status: Bind::Storage(a.status),
            p: Bind::Params(params),
        },
        [1, 1, 1],
    )
}
