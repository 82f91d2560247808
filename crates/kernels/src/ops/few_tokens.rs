//! Products of a stored K-quant weight with a few tokens (several sequences' decode steps):
//! the tokens' inputs rounded to 8-bit integers once ([`round_rows`]), then the matrix-vector
//! kernel taking up to [`FEW_TOKENS_PER_GROUP`] tokens a workgroup, each step's weights loaded
//! and unpacked once for all of them and dotted as integers with every token (as llama.cpp's
//! quantized matrix-vector products take up to 8 columns). A workgroup a token reads and
//! unpacks every weight once per token; the tiled kernel's 64-token tiles leave most of a
//! GPU idle at a few tokens.

use super::*;

const ROUND_ROWS_WGSL: &str = include_str!("../wgsl/round_rows.wgsl");

/// Most tokens one workgroup of a few-token product takes.
pub const FEW_TOKENS_PER_GROUP: u32 = 8;

kernel_bindings!(
    /// `round_rows.wgsl`.
    RoundRowsBindings { x: 0, q: 1, p: 2 }
);

/// The most tokens [`matmul`] takes through the few-token kernel on `ctx`'s device (0:
/// none): [`crate::ContextOptions::few_tokens`] where 8-bit products are allowed.
pub fn few_tokens_max(ctx: &GpuContext) -> u32 {
    if ctx.features.int8_activations {
        ctx.few_tokens
    } else {
        0
    }
}

/// Whether `w` is a weight the few-token kernel reads (Q4_K or Q6_K rows of whole 32s).
fn few_token_dtype(w: &GpuWeight) -> bool {
    matches!(w.dtype, GgmlType::Q4K | GgmlType::Q6K) && (w.cols as u32).is_multiple_of(32)
}

/// Floats of [`MatmulArgs::partials`] that the rounded inputs of `w`'s few-token products take
/// at up to `max_m` tokens (0 where it has none).
pub fn few_token_floats(ctx: &GpuContext, w: &GpuWeight, max_m: u32) -> u64 {
    let m = max_m.min(few_tokens_max(ctx));
    if m < 2 || !few_token_dtype(w) {
        return 0;
    }
    u64::from(m) * int8_vector_words(w.cols as u32)
}

/// Whether [`matmul`] takes `a` through the few-token kernel: 2 to [`few_tokens_max`] tokens
/// of a Q4_K or Q6_K weight into plain or gated rows, with room for their rounded inputs in
/// `a.partials`.
pub(super) fn takes_few_tokens(ctx: &GpuContext, w: &GpuWeight, a: &MatmulArgs<'_>) -> bool {
    let room = few_token_floats(ctx, w, a.m);
    (2..=few_tokens_max(ctx)).contains(&a.m)
        && room > 0
        && matches!(a.out, MatvecOut::Rows { .. } | MatvecOut::Geglu)
        && a.partials.is_some_and(|p| p.size >= room * 4)
}

/// `m` rows of `k` floats of `x` (`x_stride` apart) rounded to 8-bit integers per 32 values
/// into `q`, each row's [`int8_vector_words`] words from `m * q_stride`: what the few-token
/// kernel reads. `cpu::round_to_int8` is its reference.
pub fn round_rows(
    ctx: &GpuContext,
    x: &View,
    q: &View,
    m: u32,
    k: u32,
    x_stride: u32,
) -> Result<Dispatch, GpuError> {
    let q_stride = int8_vector_words(k) as u32;
    if !k.is_multiple_of(32) || !x_stride.is_multiple_of(4) || x_stride < k || m == 0 {
        return Err(shape(format!(
            "round_rows: {m} rows of {k} values (whole 32s), {x_stride} apart"
        )));
    }
    x.expect_len32(
        "round_rows x",
        u64::from(m - 1) * u64::from(x_stride) + u64::from(k),
    )?;
    q.expect_len32("round_rows q", u64::from(m) * u64::from(q_stride))?;
    let params = RoundRowsParams {
        k,
        m,
        x_stride,
        q_stride,
    };
    ctx.dispatch(
        "round_rows",
        ctx.pipeline(&ShaderSource::new("round_rows", &[ROUND_ROWS_WGSL])),
        RoundRowsBindings {
            x: Bind::Storage(x),
            q: Bind::Storage(q),
            p: Bind::Params(Params::of(&params)),
        },
        [(k / 32).div_ceil(64), m, 1],
    )
}

/// `a`'s tokens rounded into `a.partials`, then `w`'s product of them: a dispatch per weight
/// tile, groups of up to [`FEW_TOKENS_PER_GROUP`] tokens (as even as they divide).
pub(super) fn few_token_products(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let k = w.cols as u32;
    let room = a
        .partials
        .ok_or_else(|| shape(format!("{}: no room for rounded inputs", w.name)))?;
    let rounded = room.slice(0, few_token_floats(ctx, w, a.m) * 4)?;
    let mut ds = vec![round_rows(ctx, a.x, &rounded, a.m, k, a.x_stride)?];
    let mut tuning = MatvecTuning::rounded_input(ctx, w.dtype, k, w.rows);
    if a.out.is_geglu() {
        tuning.rpt = tuning.rpt.max(2);
    }
    let groups = a.m.div_ceil(FEW_TOKENS_PER_GROUP);
    let job = MatvecJob {
        m: a.m,
        x_stride: int8_vector_words(k) as u32,
        y_stride: a.y_stride,
        out_offset: a.y_offset,
        x_int8: true,
        tokens_per_group: a.m.div_ceil(groups),
        tuning: Some(tuning),
        ..MatvecJob::new(&rounded, a.y, a.out)
    };
    ds.extend(matvec_dispatches(ctx, w, &job)?);
    Ok(ds)
}
