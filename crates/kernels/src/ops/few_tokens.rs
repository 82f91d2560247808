//! Products of a stored K-quant weight with a few tokens (several sequences' decode steps):
//! the matrix-vector kernel taking up to [`FEW_TOKENS_PER_GROUP`] tokens a workgroup. Each
//! workgroup rounds its tokens' inputs to 8-bit integers into its memory, then loads and
//! unpacks each step's weights once for all of them and dots them as integers with every
//! token (as llama.cpp's quantized matrix-vector products take up to 8 columns). A workgroup a
//! token reads and unpacks every weight once per token; the tiled kernel's 64-token tiles
//! leave most of a GPU idle at a few tokens.

use super::*;

/// Most tokens one workgroup of a few-token product takes.
pub const FEW_TOKENS_PER_GROUP: u32 = 8;

/// The fewest tokens the few-token kernel takes: at 2, one workgroup a token was faster (338
/// against 321 tok/s, E2B on the H200, benches/RESULTS.md, "thirtieth session").
pub const FEW_TOKENS_MIN: u32 = 3;

/// The most tokens [`matmul_few_tokens`] takes through the few-token kernel on `ctx`'s device
/// (0: none): [`crate::ContextOptions::few_tokens`] where 8-bit products are allowed.
pub fn few_tokens_max(ctx: &GpuContext) -> u32 {
    if ctx.features.int8_activations {
        ctx.few_tokens
    } else {
        0
    }
}

/// Tokens a workgroup of `dtype`'s few-token product of rows of `k` can round into its memory
/// (k bytes and k / 2 bytes of scales each, next to 5 KiB of reductions), at most
/// [`FEW_TOKENS_PER_GROUP`]; 0 for a dtype the kernel does not read (Q4_K and Q6_K only).
pub fn few_tokens_per_workgroup(ctx: &GpuContext, dtype: GgmlType, k: u32) -> u32 {
    if !matches!(dtype, GgmlType::Q4K | GgmlType::Q6K) || !k.is_multiple_of(32) {
        return 0;
    }
    let room = u64::from(ctx.limits.max_compute_workgroup_storage_size).saturating_sub(5 * 1024);
    (room / (u64::from(k) * 3 / 2)).min(u64::from(FEW_TOKENS_PER_GROUP)) as u32
}

/// Whether [`matmul_few_tokens`] takes `a` through the few-token kernel: [`FEW_TOKENS_MIN`]
/// to [`few_tokens_max`] tokens of a Q4_K or Q6_K weight whose workgroups hold at least 2
/// tokens' inputs, into plain or gated rows.
pub(super) fn takes_few_tokens(ctx: &GpuContext, w: &GpuWeight, a: &MatmulArgs<'_>) -> bool {
    (FEW_TOKENS_MIN..=few_tokens_max(ctx)).contains(&a.m)
        && few_tokens_per_workgroup(ctx, w.dtype, w.cols as u32) >= 2
        && matches!(a.out, MatvecOut::Rows { .. } | MatvecOut::Geglu)
}

/// The few-token kernel's shape: 16 lanes a row (a subgroup's shuffles sum them on GPUs,
/// no workgroup barrier per token; 64 lanes with a barrier per token measured far slower),
/// 2 rows a group, or 4 for rows by the ten thousand (an output head: fewer workgroups, each
/// rounding its tokens' inputs once; not tuned apart); a CPU adapter's lanes as its
/// one-token products take them. Each step's weights are fetched while the step before is
/// dotted with every token (E2B on the H200, two runs a side: 579, 554 tok/s at 4
/// sequences and 929, 932 at 8, against 498, 552 and 829, 847 fetched where used;
/// benches/RESULTS.md, "thirty-fourth session").
fn few_token_tuning(ctx: &GpuContext, rows: u64, gated: bool) -> MatvecTuning {
    if let Some((tpr, rpt)) = ctx.few_tuning {
        return MatvecTuning {
            tpr,
            rpt: if gated { rpt.max(2) } else { rpt },
            prefetch: true,
            int8_input: true,
        };
    }
    let tpr = match TuningClass::of(ctx) {
        TuningClass::Gpu => 16,
        TuningClass::CpuAdapter => ctx.features.subgroup_min_size.clamp(4, 16),
    };
    MatvecTuning {
        tpr,
        rpt: if rows >= 8192 { 4 } else { 2 },
        prefetch: true,
        int8_input: true,
    }
}

/// `w`'s product of `a`'s tokens: a dispatch per weight tile, groups of tokens as even as
/// they divide, each as many as a workgroup holds.
pub(super) fn few_token_products(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let k = w.cols as u32;
    let most = few_tokens_per_workgroup(ctx, w.dtype, k).max(1);
    let groups = a.m.div_ceil(most);
    let tuning = few_token_tuning(ctx, w.rows, a.out.is_geglu());
    let job = MatvecJob {
        m: a.m,
        x_stride: a.x_stride,
        y_stride: a.y_stride,
        out_offset: a.y_offset,
        tokens_per_group: a.m.div_ceil(groups),
        tuning: Some(tuning),
        ..MatvecJob::new(a.x, a.y, a.out)
    };
    matvec_dispatches(ctx, w, &job)
}
