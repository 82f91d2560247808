//! The matrix-vector kernel and the steps fused into it (residual and norm prologue, int8 inputs, expert mixes, attention merge).

use super::*;

/// What [`matvec`] writes.
#[derive(Clone, Copy, Debug)]
pub enum MatvecOut<'a> {
    /// `y[out_offset + r] = W[r] . x`, with `c * tanh(y / c)` when `softcap` > 0.
    Rows { softcap: f32 },
    /// The weight holds gate and up rows interleaved (2i, 2i+1): `y[out_offset + i] =
    /// gelu_tanh(gate_i . x) * (up_i . x)`.
    Geglu,
    /// `y[out_offset + r] = gelu_tanh(W[r] . x) * by[offset + r]`: a gate whose other factor
    /// is already computed (the per-layer input). One-token products, and tiled ones through
    /// [`matmul_clamped`] (`by` in y's layout, `offset` the output's).
    GeluTimes { by: &'a View, offset: u32 },
    /// [`MatvecOut::Geglu`] rounded to 8-bit integers per 32 values, laid out for
    /// [`matvec_int8_input`] ([`int8_vector_words`] words from y's start). One-token
    /// products whose workgroups each hold whole 32s ([`int8_activations_fit`]).
    GegluInt8,
}

impl MatvecOut<'_> {
    pub fn is_geglu(&self) -> bool {
        matches!(self, MatvecOut::Geglu | MatvecOut::GegluInt8)
    }
}

/// Which segment of an adapter's `x A^T` each output row of a product reads: one segment per
/// projection stacked in the weight, each `rank` values of `t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoraSegments {
    /// Consecutive ranges of rows: segment 0 from row 0, segment 1 from `starts[0]`, segment 2
    /// from `starts[1]` (`u32::MAX`: no such segment).
    Ranges([u32; 2]),
    /// Gate and up rows interleaved (2i, 2i+1): segment 0 the gate rows, segment 1 the up rows.
    Pairs,
}

impl LoraSegments {
    /// Segments of a weight of `rows` rows.
    pub fn count(&self, rows: u32) -> u32 {
        match self {
            LoraSegments::Pairs => 2,
            LoraSegments::Ranges(starts) => 1 + starts.iter().filter(|&&s| s < rows).count() as u32,
        }
    }

    /// Segment `s`'s rows of a weight of `rows` rows: `(first, count, step)`.
    pub fn rows(&self, s: u32, rows: u32) -> (u32, u32, u32) {
        match self {
            LoraSegments::Pairs => (s, rows / 2, 2),
            LoraSegments::Ranges(starts) => {
                let bounds = [0, starts[0].min(rows), starts[1].min(rows), rows];
                let first = bounds[s as usize];
                (first, bounds[s as usize + 1] - first, 1)
            }
        }
    }
}

/// An adapter's low-rank delta joined to a product's rows before their output is formed:
/// `row_r += t[segment(r)] . b[r]`, with `t = x A^T` computed before the product
/// (`segments` of `rank` values per token) and `b` `[W's rows, rank]` f32 (its scale in it).
#[derive(Clone, Copy, Debug)]
pub struct LoraDelta<'a> {
    pub t: &'a View,
    pub b: &'a View,
    pub rank: u32,
    pub segments: LoraSegments,
}

/// What a one-token product writes ([`MatvecOut`]), and an adapter's delta joined to its rows
/// first.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    pub out: MatvecOut<'a>,
    pub lora: Option<&'a LoraDelta<'a>>,
}

impl<'a> From<MatvecOut<'a>> for Epilogue<'a> {
    fn from(out: MatvecOut<'a>) -> Self {
        Self { out, lora: None }
    }
}

/// Words of a vector of `n` values rounded to 8-bit integers as [`MatvecOut::GegluInt8`]
/// writes it: n / 4 words of four integers, then per 16 values two f32 words (its 32's scale,
/// and the sum of its 16 integers times that scale).
pub fn int8_vector_words(n: u32) -> u64 {
    u64::from(n) / 4 + u64::from(n) / 8
}

/// Whether one token's gated product of `gate_up` (behind the residual step with `prologue`)
/// can write its activations rounded ([`MatvecOut::GegluInt8`]) for the `down` product to
/// read ([`matvec_int8_input`]): K-quant rows of whole 32s, and workgroups of the chosen
/// shape that each hold whole 32s of outputs in every tile.
pub fn int8_activations_fit(
    ctx: &GpuContext,
    gate_up: &GpuWeight,
    down: &GpuWeight,
    prologue: bool,
) -> bool {
    let ff = gate_up.rows / 2;
    let t = MatvecTuning::choose(
        ctx,
        gate_up.dtype,
        gate_up.cols as u32,
        gate_up.rows,
        true,
        prologue,
    );
    ctx.features.int8_activations
        && matches!(down.dtype, GgmlType::Q4K | GgmlType::Q6K)
        && down.cols == ff
        && ff.is_multiple_of(32)
        && whole_32s_per_group(gate_up, t.tpr, t.rpt)
}

/// Whether every workgroup of `w`'s gated product at `tpr` lanes and `rpt` rows a group
/// holds whole 32s of outputs (at most 128, `Q8_OUT`'s workgroup buffer), in every tile: a
/// rounded output takes one scale per 32.
fn whole_32s_per_group(w: &GpuWeight, tpr: u32, rpt: u32) -> bool {
    let per = u64::from(256 / tpr * rpt / 2);
    per.is_multiple_of(32)
        && per <= 128
        && w.tiles.iter().all(|tile| {
            (tile.first_row / 2).is_multiple_of(per) && (tile.rows / 2).is_multiple_of(per)
        })
}

/// Arguments of [`residual_norm`].
#[derive(Clone, Copy)]
pub struct ResidualNorm<'a> {
    pub res: &'a View,
    pub delta: &'a View,
    pub post: &'a View,
    pub weight: &'a View,
    pub out: &'a View,
    pub rows: u32,
    pub dim: u32,
    pub scale: f32,
    pub eps: f32,
}

/// The step between two blocks of a layer, for `rows` rows of `dim`: the residual stream
/// becomes `(res + rmsnorm(delta) * post) * scale` in place, and `out = rmsnorm(res) * weight`
/// is the next block's input.
pub fn residual_norm(ctx: &GpuContext, a: &ResidualNorm<'_>) -> Result<Dispatch, GpuError> {
    let ResidualNorm {
        res,
        delta,
        post,
        weight,
        out,
        rows,
        dim,
        scale,
        eps,
    } = *a;
    check_norm_dim(dim)?;
    let n = u64::from(rows) * u64::from(dim);
    for (what, v, len) in [
        ("res", res, n),
        ("delta", delta, n),
        ("out", out, n),
        ("post", post, u64::from(dim)),
        ("weight", weight, u64::from(dim)),
    ] {
        v.expect_len32(&format!("residual_norm {what}"), len)?;
    }
    let source = ShaderSource::new("rms_norm", &[REDUCE_WGSL, NORM_WGSL])
        .flag("RESIDUAL_NORM")
        .flag("WEIGHT");
    let params = Params::of(&NormParams {
        dim,
        rows,
        eps,
        x_stride: dim,
        scale,
    });
    ctx.dispatch(
        "residual_norm",
        ctx.pipeline(&source),
        NormBindings {
            x: Bind::Storage(res),
            y: Bind::Storage(out),
            p: Bind::Params(params),
            nw: Bind::Storage(weight),
            delta: Bind::Storage(delta),
            post: Bind::Storage(post),
        },
        grid(ctx, rows, 1),
    )
}

/// Experts chosen per slot, for [`expert_matvec`].
#[derive(Clone, Copy)]
pub struct ExpertSlots<'a> {
    /// `slots` expert ids (the route kernel's `sel`).
    pub sel: &'a View,
    pub slots: u32,
    /// Rows of one expert in the stacked weight.
    pub rows_per_expert: u32,
    /// Slots per input row: slot s reads input row s / x_group.
    pub x_group: u32,
}

/// Whether [`MatvecTuning::int8_input`] serves `dtype` at rows of `k`: a K-quant whose input,
/// as integers (k bytes) and per-16-value scales and sums (k / 2 bytes), fits in a
/// workgroup's memory next to its reductions.
/// With `prologue`, the float input row computed in front of the product (k * 4 bytes) is
/// held there too.
pub fn int8_input_fits(ctx: &GpuContext, dtype: GgmlType, k: u32, prologue: bool) -> bool {
    let row = if prologue { u64::from(k) * 4 } else { 0 };
    matches!(dtype, GgmlType::Q4K | GgmlType::Q6K)
        && k.is_multiple_of(32)
        && u64::from(k) * 3 / 2 + row + 5 * 1024
            <= u64::from(ctx.limits.max_compute_workgroup_storage_size)
}

/// One use of the one-token kernel: `m` tokens (or expert slots) of `x`, `x_stride` apart,
/// into `y` from column `out_offset`, `y_stride` apart.
pub(super) struct MatvecJob<'a> {
    pub(super) x: &'a View,
    pub(super) y: &'a View,
    pub(super) m: u32,
    pub(super) x_stride: u32,
    pub(super) y_stride: u32,
    pub(super) out_offset: u32,
    pub(super) out: MatvecOut<'a>,
    pub(super) experts: Option<&'a ExpertSlots<'a>>,
    /// With `experts`: the slots' weights, for a product that sums each token's `x_group`
    /// slots into one row ([`expert_matvec_mixed`]).
    pub(super) mixed: Option<&'a View>,
    /// With `experts`: the slots' experts routed in the product ([`ExpertRoute`]).
    pub(super) route: Option<&'a ExpertRoute<'a>>,
    pub(super) tuning: Option<MatvecTuning>,
    /// The residual step computed in front of the product (x is then the stream).
    pub(super) residual: Option<&'a ResidualStep<'a>>,
    /// The attention merge computed in front of the product (x is then the split's scratch).
    pub(super) merge: Option<&'a AttentionMerge<'a>>,
    /// The input's norm computed in front of the product.
    pub(super) norm: Option<&'a InputNorm<'a>>,
    /// x is rounded to 8-bit integers ([`int8_vector_words`]).
    pub(super) x_int8: bool,
    /// Tokens a workgroup takes (`TOKENS`: it rounds their inputs into its memory, and each
    /// step's weights are loaded once for all of them). 1: a workgroup a token.
    pub(super) tokens_per_group: u32,
    /// An adapter's delta joined to the rows.
    pub(super) lora: Option<&'a LoraDelta<'a>>,
}

impl<'a> MatvecJob<'a> {
    pub(super) fn new(x: &'a View, y: &'a View, out: MatvecOut<'a>) -> Self {
        Self {
            x,
            y,
            m: 1,
            x_stride: 0,
            y_stride: 0,
            out_offset: 0,
            out,
            experts: None,
            mixed: None,
            route: None,
            tuning: None,
            residual: None,
            merge: None,
            norm: None,
            x_int8: false,
            tokens_per_group: 1,
            lora: None,
        }
    }

    /// One token of `w`'s rows into `y` from `out_offset`, whose length is checked.
    pub(super) fn one_token(
        w: &GpuWeight,
        x: &'a View,
        y: &'a View,
        out_offset: u32,
        epilogue: Epilogue<'a>,
    ) -> Result<Self, GpuError> {
        let out = epilogue.out;
        let out_rows = match out {
            MatvecOut::GegluInt8 => int8_vector_words((w.rows / 2) as u32),
            _ if out.is_geglu() => w.rows / 2,
            _ => w.rows,
        };
        y.expect_len32(&w.name, u64::from(out_offset) + out_rows)?;
        Ok(Self {
            x_stride: w.cols as u32,
            out_offset,
            lora: epilogue.lora,
            ..Self::new(x, y, out)
        })
    }
}

kernel_bindings!(
    /// The buffers a matrix-vector product binds, by what they hold. Each variant of
    /// `matvec.wgsl` declares the ones its flags use.
    MatvecBindings {
        w: 0 = ["w", "w4"],
        /// The input (`xg` rounded to integers), or with `MERGE` the split attention's chunks.
        x: 1 = ["x", "xg", "part"],
        /// The output (`yq` rounded to integers).
        y: 2 = ["y", "yq"],
        p: 3,
        /// `EXPERTS`: each slot's expert.
        sel: 4,
        /// `RESIDUAL`: the block's output joining the stream (an experts' dense branch with
        /// `MOE_DELTA`), its post-norm weight, the updated stream.
        delta: 5,
        post: 6,
        /// `PRENORM`: the next block's norm weight (with `normed`, its normed input);
        /// `NORM_IN`: the input's norm weight.
        pre: 7,
        res_out: 8,
        normed: 9,
        /// `GELU_TIMES`: the factor.
        times: 10,
        /// `MERGE`: the token's position; `KV_STORE`: the caches.
        positions: 11,
        k_cache: 12 = ["kc"],
        v_cache: 13 = ["vc"],
        /// `MOE_DELTA`: the experts' outputs and the two post-norm weights.
        experts: 14,
        /// The experts' weights: written by `ROUTE_IN`, read by `EXPERTS_SUM` and
        /// `MOE_WEIGHTED`.
        expert_w: 15,
        dense_post: 16,
        experts_post: 17,
        /// `ROUTE_IN`: the router's logits and the per-expert scale.
        route_logits: 18,
        route_scale: 19,
        /// `LORA`: the adapter's `x A^T` and its B.
        lora_t: 20,
        lora_b: 21,
    }
);

impl<'a> MatvecBindings<'a> {
    pub(super) fn new(w: &'a View, x: &'a View, y: &'a View, params: Params) -> Self {
        Self {
            w: Bind::Storage(w),
            x: Bind::Storage(x),
            y: Bind::Storage(y),
            p: Bind::Params(params),
            sel: Bind::Skip,
            delta: Bind::Skip,
            post: Bind::Skip,
            pre: Bind::Skip,
            res_out: Bind::Skip,
            normed: Bind::Skip,
            times: Bind::Skip,
            positions: Bind::Skip,
            k_cache: Bind::Skip,
            v_cache: Bind::Skip,
            experts: Bind::Skip,
            expert_w: Bind::Skip,
            dense_post: Bind::Skip,
            experts_post: Bind::Skip,
            route_logits: Bind::Skip,
            route_scale: Bind::Skip,
            lora_t: Bind::Skip,
            lora_b: Bind::Skip,
        }
    }
}

/// What a matrix-vector job derives once for all its tiles.
struct MatvecPlan<'j, 'a> {
    job: &'j MatvecJob<'a>,
    k: u32,
    geglu: bool,
    /// A step runs in front of the product (residual, attention merge or norm).
    prologue: bool,
    /// The experts' output joined in the residual step.
    moe: Option<MoeMix<'a>>,
    tuning: MatvecTuning,
    /// The input rounded by every workgroup (not already rounded).
    rounds_input: bool,
    /// The gated output rounded to 8-bit integers.
    q8_out: bool,
    xs_words: u32,
}

/// The one-token kernel for `w` as `job` says: one dispatch per tile.
pub(super) fn matvec_dispatches(
    ctx: &GpuContext,
    w: &GpuWeight,
    job: &MatvecJob<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let plan = plan_matvec(ctx, w, job)?;
    check_prologue(ctx, w, &plan)?;
    let pipeline = ctx.pipeline(&matvec_source(ctx, w, &plan)?);
    let rows_per_group = 256 / plan.tuning.tpr * plan.tuning.rpt;
    let label = match (job.residual, job.merge, job.norm) {
        (Some(_), _, _) => "residual_matvec",
        (_, Some(_), _) => "merge_matvec",
        (_, _, Some(_)) => "normed_matvec",
        _ if job.tokens_per_group > 1 => "few_token_matvec",
        _ => "matvec",
    };
    w.tiles
        .iter()
        .enumerate()
        .map(|(ti, tile)| {
            let params = tile_params(w, &plan, ti, tile);
            let wv = View::of(&tile.buffer);
            let binds = tile_bindings(&wv, job, Params::of(&params));
            ctx.dispatch(
                label,
                pipeline.clone(),
                binds,
                grid(
                    ctx,
                    params.n.div_ceil(rows_per_group),
                    job.m.div_ceil(job.tokens_per_group),
                ),
            )
        })
        .collect()
}

/// The job's derived facts and tuning, after the checks that need no prologue.
fn plan_matvec<'j, 'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    job: &'j MatvecJob<'a>,
) -> Result<MatvecPlan<'j, 'a>, GpuError> {
    let k = w.cols as u32;
    let geglu = job.out.is_geglu();
    if geglu && !whole_pairs(w) {
        return Err(shape(format!(
            "{}: a gated output needs whole gate/up row pairs per tile",
            w.name
        )));
    }
    let steps = [
        job.residual.is_some(),
        job.merge.is_some(),
        job.norm.is_some(),
    ];
    if steps.iter().filter(|&&p| p).count() > 1 {
        return Err(shape(format!(
            "{}: one prologue per product (residual step, attention merge or norm)",
            w.name
        )));
    }
    let prologue = steps.contains(&true);
    let moe = job.residual.and_then(|r| match r.delta {
        Delta::Moe(mix) => Some(mix),
        Delta::Row(_) => None,
    });
    let tuning = matvec_tuning(ctx, w, job, prologue)?;
    let x_int8 = job.x_int8;
    let rounds_input = tuning.int8_input && !x_int8;
    if rounds_input && job.tokens_per_group < 2 && !int8_input_fits(ctx, w.dtype, k, prologue) {
        return Err(shape(format!(
            "{}: 8-bit inputs are for a Q4_K or Q6_K product whose rows fit in workgroup memory",
            w.name
        )));
    }
    if x_int8
        && (prologue
            || job.experts.is_some()
            || job.m != 1
            || !matches!(w.dtype, GgmlType::Q4K | GgmlType::Q6K)
            || !k.is_multiple_of(32))
    {
        return Err(shape(format!(
            "{}: a rounded input is for one token's Q4_K or Q6_K product of rows of whole 32s",
            w.name
        )));
    }
    if x_int8 {
        job.x
            .expect_len32(&format!("{} rounded input", w.name), int8_vector_words(k))?;
    }
    let few = job.tokens_per_group;
    if few > 1
        && (!rounds_input
            || prologue
            || job.experts.is_some()
            || job.lora.is_some()
            || few > few_tokens_per_workgroup(ctx, w.dtype, k)
            || !matches!(job.out, MatvecOut::Rows { .. } | MatvecOut::Geglu))
    {
        return Err(shape(format!(
            "{}: {few} tokens a workgroup round their inputs into its memory (at most {}) for plain or gated rows",
            w.name,
            few_tokens_per_workgroup(ctx, w.dtype, k)
        )));
    }
    // Every entry point has checked y's length against the output it names.
    let q8_out = matches!(job.out, MatvecOut::GegluInt8);
    if q8_out
        && (job.experts.is_some()
            || job.m != 1
            || job.out_offset != 0
            || !whole_32s_per_group(w, tuning.tpr, tuning.rpt))
    {
        return Err(shape(format!(
            "{}: a rounded gated output is for one token's dense product from column 0, each workgroup holding whole 32s of outputs",
            w.name
        )));
    }
    if let Some(l) = job.lora {
        check_lora(w, job, l)?;
    }
    let xs_words = if x_int8 {
        k / 4
    } else if q8_out {
        (w.rows / 2) as u32 / 4
    } else {
        0
    };
    Ok(MatvecPlan {
        job,
        k,
        geglu,
        prologue,
        moe,
        tuning,
        rounds_input,
        q8_out,
        xs_words,
    })
}

/// The job's tuning: the one it names (checked), else [`MatvecTuning`]'s choice.
fn matvec_tuning(
    ctx: &GpuContext,
    w: &GpuWeight,
    job: &MatvecJob<'_>,
    prologue: bool,
) -> Result<MatvecTuning, GpuError> {
    let k = w.cols as u32;
    let geglu = job.out.is_geglu();
    // Slots a product's rows take, and a row's length as the steps see it: a mixed
    // product's slots' rows end to end.
    let (row_slots, row_len) = match (job.mixed, job.experts) {
        (Some(_), Some(e)) => (e.x_group, k * e.x_group),
        _ => (1, k),
    };
    match job.tuning {
        Some(t) if [4, 8, 16, 32, 64, 128, 256].contains(&t.tpr) && [1, 2, 4].contains(&t.rpt) => {
            if geglu && t.rpt < 2 {
                return Err(shape(format!(
                    "{}: a gated output needs 2 rows per group",
                    w.name
                )));
            }
            Ok(t)
        }
        Some(t) => Err(shape(format!("{}: matvec tuning {t:?}", w.name))),
        None => {
            let rows = job.experts.map_or(w.rows, |e| {
                u64::from(e.rows_per_expert) * u64::from(e.slots / row_slots)
            });
            if job.x_int8 {
                return Ok(MatvecTuning::rounded_input(ctx, w.dtype, k, rows));
            }
            let t = MatvecTuning::choose(ctx, w.dtype, row_len, rows, geglu, prologue);
            let experts_down = job.experts.is_some() && !prologue && !geglu;
            Ok(if experts_down {
                MatvecTuning::for_experts_down(ctx, t, job.mixed.is_some())
            } else {
                t
            })
        }
    }
}

/// An adapter's delta: dense rows, gate/up pairs for a gated output, and `t` and `b` long
/// enough for every row and token.
fn check_lora(w: &GpuWeight, job: &MatvecJob<'_>, l: &LoraDelta<'_>) -> Result<(), GpuError> {
    let rows = w.rows as u32;
    let pairs = l.segments == LoraSegments::Pairs;
    if job.experts.is_some() || l.rank == 0 || pairs != job.out.is_geglu() {
        return Err(shape(format!(
            "{}: an adapter's delta joins a dense product, its gate/up pairs where the output is gated",
            w.name
        )));
    }
    let t_stride = l.segments.count(rows) * l.rank;
    l.t.expect_len32(
        &format!("{} adapter t", w.name),
        u64::from(job.m) * u64::from(t_stride),
    )?;
    l.b.expect_len32(&format!("{} adapter b", w.name), w.rows * u64::from(l.rank))
}

/// The checks of the step in front of the product and of a GELU-times output.
fn check_prologue(
    ctx: &GpuContext,
    w: &GpuWeight,
    plan: &MatvecPlan<'_, '_>,
) -> Result<(), GpuError> {
    let (job, k) = (plan.job, plan.k);
    if let Some(mg) = job.merge {
        let a = mg.attention;
        if job.experts.is_some()
            || job.m != 1
            || k != a.n_head * a.head_dim
            || a.n_head > 64
            || !matvec_input_fits(ctx, k)
        {
            return Err(shape(format!(
                "{}: an attention merge runs in front of a one-token dense product whose input row (the {} heads' output) fits in workgroup memory",
                w.name, a.n_head
            )));
        }
    }
    if let Some(r) = job.residual {
        check_residual(ctx, w, job, r)?;
    }
    if let Some(nm) = job.norm {
        if job.x_stride != k || !matvec_input_fits(ctx, k) {
            return Err(shape(format!(
                "{}: a norm runs in front of a product whose input rows are whole and fit in workgroup memory",
                w.name
            )));
        }
        nm.weight
            .expect_len32(&format!("{} input norm", w.name), u64::from(k))?;
    }
    if let MatvecOut::GeluTimes { by, offset } = job.out {
        // Behind an experts' output it would bind one storage buffer more than
        // `moe_delta_fits` counts.
        if job.experts.is_some() || job.m != 1 || plan.moe.is_some() {
            return Err(shape(format!(
                "{}: a GELU-times output is for one token's dense product, not behind an experts' output",
                w.name
            )));
        }
        by.expect_len32(&w.name, u64::from(offset) + w.rows)?;
    }
    Ok(())
}

/// The residual step's checks: where it can run, and every buffer it reads or writes.
fn check_residual(
    ctx: &GpuContext,
    w: &GpuWeight,
    job: &MatvecJob<'_>,
    r: &ResidualStep<'_>,
) -> Result<(), GpuError> {
    let (k, m) = (w.cols as u32, job.m);
    if job.experts.is_some() || job.x_stride != k || !matvec_input_fits(ctx, k) {
        return Err(shape(format!(
            "{}: the residual step runs in front of a dense product whose input row fits in workgroup memory",
            w.name
        )));
    }
    let n = u64::from(m) * u64::from(k);
    let mut views = vec![
        ("stream", r.res, n),
        ("stream out", r.res_out, n),
        ("post", r.post, u64::from(k)),
    ];
    match r.delta {
        Delta::Row(delta) => views.push(("delta", delta, n)),
        Delta::Moe(mix) => {
            if m != 1 || mix.tokens != 1 || mix.dim != k || mix.eps != r.eps {
                return Err(shape(format!(
                    "{}: an experts' output joins one token's stream of its width, with the step's eps",
                    w.name
                )));
            }
            if !moe_delta_fits(ctx) {
                return Err(shape(format!(
                    "{}: the device binds {} storage buffers, an experts' output in front of a product {}",
                    w.name,
                    ctx.limits.max_storage_buffers_per_shader_stage,
                    moe_delta_buffers()
                )));
            }
            let kd = u64::from(k);
            views.extend([
                ("dense branch", mix.dense, kd),
                ("expert outputs", mix.experts, u64::from(mix.k) * kd),
                ("dense post-norm", mix.dense_post, kd),
                ("experts' post-norm", mix.experts_post, kd),
            ]);
            views.extend(
                mix.weight
                    .map(|wv| ("expert weights", wv, u64::from(mix.k))),
            );
        }
    }
    if let Some((pre, normed)) = r.next_norm {
        views.extend([("pre", pre, u64::from(k)), ("normed", normed, n)]);
    }
    for (what, v, len) in views {
        v.expect_len32(&format!("{} residual {what}", w.name), len)?;
    }
    Ok(())
}

/// The kernel variant a plan runs.
fn matvec_source(
    ctx: &GpuContext,
    w: &GpuWeight,
    plan: &MatvecPlan<'_, '_>,
) -> Result<ShaderSource, GpuError> {
    let job = plan.job;
    let (k, moe, t) = (plan.k, plan.moe, plan.tuning);
    let subgroups = ctx.features.subgroups;
    let mut parts = vec![ACTIVATIONS_WGSL, BYTES_WGSL, DTYPES_WGSL, MATVEC_WGSL];
    if plan.prologue || job.route.is_some() {
        parts.push(REDUCE_WGSL);
    }
    if job.route.is_some() {
        parts.push(ROUTE_WGSL);
    }
    if job.merge.is_some() {
        parts.push(ATTN_MERGE_WGSL);
    }
    let mut source = ShaderSource::new("matvec", &parts)
        .flag(dtype_flag(w.dtype)?)
        .flag_if(plan.geglu, "GEGLU_OUT")
        .flag_if(!subgroups, "NO_SUBGROUPS")
        .flag_if(job.experts.is_some(), "EXPERTS")
        .flag_if(job.mixed.is_some(), "EXPERTS_SUM")
        .flag_if(job.route.is_some(), "ROUTE_IN")
        .flag_if(job.residual.is_some(), "RESIDUAL")
        .flag_if(
            job.residual.is_some_and(|r| r.next_norm.is_some()),
            "PRENORM",
        )
        .flag_if(job.norm.is_some(), "NORM_IN")
        .flag_if(moe.is_some(), "MOE_DELTA")
        .flag_if(moe.is_some_and(|mix| mix.weight.is_some()), "MOE_WEIGHTED")
        .flag_if(matches!(job.out, MatvecOut::GeluTimes { .. }), "GELU_TIMES")
        .flag_if(t.int8_input || job.x_int8, "INT8_X")
        .flag_if(job.x_int8, "XQ_IN")
        .flag_if(plan.q8_out, "Q8_OUT")
        .flag_if(job.merge.is_some(), "MERGE")
        .flag_if(job.merge.is_some_and(|mg| mg.store_kv), "KV_STORE")
        .flag_if(job.lora.is_some(), "LORA")
        .flag_if(job.tokens_per_group > 1, "TOKENS")
        .constant("TPR", f64::from(t.tpr))
        .constant("RPT", f64::from(t.rpt))
        // A mixed product's lanes step across its slots' segments, which the prefetch's
        // one-row stride does not follow.
        .constant(
            "PREFETCH",
            f64::from(u8::from(t.prefetch && job.mixed.is_none())),
        );
    if plan.prologue {
        source = source
            .constant("XV", f64::from(k / 4))
            .constant("RV", f64::from(k.div_ceil(1024)));
    }
    if let Some(mix) = moe {
        source = source.constant("MOE_K", f64::from(mix.k));
    }
    if job.tokens_per_group > 1 {
        source = source.constant("MT", f64::from(job.tokens_per_group));
    }
    if plan.rounds_input {
        let tokens = job.tokens_per_group;
        source = source
            .constant("XQ", f64::from(tokens * k / 4))
            .constant("XC", f64::from(tokens * k / 16));
        if tokens > 1 {
            source = source.constant("XQ4", f64::from(tokens * k / 16));
        }
    }
    if subgroups {
        source = source.constant("SG", f64::from(ctx.features.subgroup_min_size.clamp(4, 64)));
    }
    Ok(source)
}

/// The parameter block of tile `ti`.
fn tile_params(
    w: &GpuWeight,
    plan: &MatvecPlan<'_, '_>,
    ti: usize,
    tile: &crate::WeightTile,
) -> MatvecParams {
    let job = plan.job;
    let (rows, first, first_expert, experts_here, x_group) = match job.experts {
        // Every slot's output starts at its own row 0; the tile's experts say which
        // slots work here.
        Some(e) => {
            let per = u64::from(e.rows_per_expert);
            let first_expert = (tile.first_row / per) as u32;
            (
                e.rows_per_expert,
                0,
                first_expert,
                (tile.rows / per) as u32,
                e.x_group,
            )
        }
        None => {
            let first = if plan.geglu {
                tile.first_row / 2
            } else {
                tile.first_row
            };
            (tile.rows as u32, first as u32, 0, 0, 1)
        }
    };
    let softcap = match job.out {
        MatvecOut::Rows { softcap } => softcap,
        MatvecOut::Geglu | MatvecOut::GegluInt8 | MatvecOut::GeluTimes { .. } => 0.0,
    };
    let mut params = MatvecParams {
        k: plan.k,
        n: rows,
        row_bytes: w.row_bytes as u32,
        out_offset: job.out_offset + first,
        m: job.m,
        x_stride: job.x_stride,
        y_stride: job.y_stride,
        softcap,
        first_expert,
        experts_here,
        x_group,
        eps: job
            .residual
            .map_or(job.norm.map_or(0.0, |nm| nm.eps), |r| r.eps),
        scale: job.residual.map_or(1.0, |r| r.scale),
        times_offset: match job.out {
            MatvecOut::GeluTimes { offset, .. } => offset + first,
            _ => 0,
        },
        xs_words: plan.xs_words,
        accumulate: u32::from(job.mixed.is_some() && ti > 0),
        n_expert: job.route.map_or(0, |r| r.n_expert),
        has_scale: u32::from(job.route.is_some_and(|r| r.expert_scale.is_some())),
        ..MatvecParams::default()
    };
    if let Some(l) = job.lora {
        let (starts, pairs) = match l.segments {
            LoraSegments::Ranges(starts) => (starts, 0),
            LoraSegments::Pairs => ([u32::MAX; 2], 1),
        };
        params.lora_rank = l.rank;
        params.lora_t_stride = l.segments.count(w.rows as u32) * l.rank;
        [params.lora_seg1, params.lora_seg2] = starts;
        params.lora_pairs = pairs;
        params.lora_first_row = tile.first_row as u32;
    }
    if let Some(mg) = job.merge {
        let (a, capacity) = (mg.attention, mg.capacity);
        params.n_head = a.n_head;
        params.n_kv_head = a.n_kv_head;
        params.head_dim = a.head_dim;
        params.window = a.window;
        params.max_chunks = mg.max_chunks;
        params.capacity = capacity;
    }
    params
}

/// The buffers a tile's dispatch binds.
fn tile_bindings<'a>(wv: &'a View, job: &MatvecJob<'a>, params: Params) -> MatvecBindings<'a> {
    let mut b = MatvecBindings::new(wv, job.x, job.y, params);
    b.sel = Bind::opt(job.experts.map(|e| e.sel));
    if let Some(r) = job.route {
        b.route_logits = Bind::Storage(r.logits);
        // Without a scale the shader reads none; the binding still needs a buffer.
        b.route_scale = Bind::Storage(r.expert_scale.unwrap_or(r.logits));
        b.expert_w = Bind::Storage(r.weight);
    }
    if let Some(mg) = job.merge {
        b.x = Bind::Storage(mg.scratch);
        b.positions = Bind::Storage(mg.attention.positions);
        if mg.store_kv {
            b.k_cache = Bind::Storage(mg.attention.k_cache);
            b.v_cache = Bind::Storage(mg.attention.v_cache);
        }
    }
    if let Some(r) = job.residual {
        match r.delta {
            Delta::Row(delta) => b.delta = Bind::Storage(delta),
            Delta::Moe(mix) => {
                b.delta = Bind::Storage(mix.dense);
                b.experts = Bind::Storage(mix.experts);
                if let Some(wv) = mix.weight {
                    b.expert_w = Bind::Storage(wv);
                }
                b.dense_post = Bind::Storage(mix.dense_post);
                b.experts_post = Bind::Storage(mix.experts_post);
            }
        }
        b.post = Bind::Storage(r.post);
        b.res_out = Bind::Storage(r.res_out);
        if let Some((pre, normed)) = r.next_norm {
            b.pre = Bind::Storage(pre);
            b.normed = Bind::Storage(normed);
        }
    }
    if let Some(nm) = job.norm {
        b.pre = Bind::Storage(nm.weight);
    }
    if let Some(wv) = job.mixed {
        b.expert_w = Bind::Storage(wv);
    }
    if let MatvecOut::GeluTimes { by, .. } = job.out {
        b.times = Bind::Storage(by);
    }
    if let Some(l) = job.lora {
        b.lora_t = Bind::Storage(l.t);
        b.lora_b = Bind::Storage(l.b);
    }
    b
}

/// Whether a matrix-vector workgroup can hold an input row of `k` values in its memory, next
/// to its reductions' (at most 5 KiB without subgroups), and its threads the row's vec4s in
/// registers (k at most 8192): the condition of [`matvec_after_residual`].
pub fn matvec_input_fits(ctx: &GpuContext, k: u32) -> bool {
    k.is_multiple_of(4)
        && k <= 8192
        && u64::from(k) * 4 + 5 * 1024 <= u64::from(ctx.limits.max_compute_workgroup_storage_size)
}

/// A block's output as it joins the residual stream.
#[derive(Clone, Copy)]
pub enum Delta<'a> {
    /// The output row.
    Row(&'a View),
    /// A mixture-of-experts FFN's output, computed where it is used, as [`moe_mix`] computes
    /// it (one token); for devices that bind enough buffers ([`moe_delta_fits`]).
    Moe(MoeMix<'a>),
}

/// Storage buffers a product with a residual step whose delta is [`Delta::Moe`] binds at most
/// (weighted, with the next norm): counted in its WGSL.
pub(super) fn moe_delta_buffers() -> u32 {
    static COUNT: OnceLock<u32> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let flags = ["RESIDUAL", "PRENORM", "MOE_DELTA", "MOE_WEIGHTED"];
        matvec_storage_buffers(&[REDUCE_WGSL], &flags)
    })
}

/// Storage buffers the matrix-vector variant (of Q4_K weights) with `flags` declares, with
/// the snippets `extra` besides its own.
pub(super) fn matvec_storage_buffers(extra: &[&'static str], flags: &[&str]) -> u32 {
    let mut parts = vec![ACTIVATIONS_WGSL, BYTES_WGSL, DTYPES_WGSL, MATVEC_WGSL];
    parts.extend(extra);
    let source = ShaderSource::new("matvec", &parts).flag("DT_Q4_K");
    flags
        .iter()
        .fold(source, |source, f| source.flag(*f))
        .storage_bindings()
}

/// Whether the device binds enough storage buffers for a [`Delta::Moe`] residual step (12;
/// browsers commonly offer 8 or 10).
pub fn moe_delta_fits(ctx: &GpuContext) -> bool {
    ctx.limits.max_storage_buffers_per_shader_stage >= moe_delta_buffers()
}

/// The step between two blocks of a layer, for [`matvec_after_residual`]: the stream becomes
/// `res_out = (res + norm(delta) * post) * scale`; the product's input is `res_out` itself or,
/// with `next_norm`, the next block's input `norm(res_out) * pre`, also written to `normed`.
pub struct ResidualStep<'a> {
    pub res: &'a View,
    pub delta: Delta<'a>,
    pub post: &'a View,
    pub scale: f32,
    pub eps: f32,
    /// The updated stream: a buffer other than `res` (the product's workgroups all read `res`).
    pub res_out: &'a View,
    /// `(pre, normed)`.
    pub next_norm: Option<(&'a View, &'a View)>,
}

/// The residual step and the one-token product of its result in one dispatch per weight tile:
/// each workgroup computes the step into its own memory (the step's cost is a few vectors of
/// reads from cache; a dispatch of its own costs a whole GPU round trip), and the first writes
/// `res_out` (and `normed`). [`residual_norm`] (or a norm added to the stream) followed by
/// [`matvec`], with one wait fewer.
pub fn matvec_after_residual<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    step: &ResidualStep<'a>,
    y: &'a View,
    out_offset: u32,
    out: impl Into<Epilogue<'a>>,
) -> Result<Vec<Dispatch>, GpuError> {
    matvec_after_residual_tuned(ctx, w, step, y, out_offset, out, None)
}

/// [`matvec_after_residual`] with a given tuning (`None`: the one [`MatvecTuning::choose`]
/// picks), for tests and kernel tuning.
pub fn matvec_after_residual_tuned<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    step: &ResidualStep<'a>,
    y: &'a View,
    out_offset: u32,
    out: impl Into<Epilogue<'a>>,
    tuning: Option<MatvecTuning>,
) -> Result<Vec<Dispatch>, GpuError> {
    let job = MatvecJob {
        residual: Some(step),
        tuning,
        ..MatvecJob::one_token(w, step.res, y, out_offset, out.into())?
    };
    matvec_dispatches(ctx, w, &job)
}

/// The decode matrix-vector product of one token: `y[out_offset + r] = W[r] . x` (or the gated
/// activation of interleaved gate/up rows), one dispatch per weight tile.
pub fn matvec<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &'a View,
    y: &'a View,
    out_offset: u32,
    out: impl Into<Epilogue<'a>>,
) -> Result<Vec<Dispatch>, GpuError> {
    x.expect_len32(&w.name, w.cols)?;
    let job = MatvecJob::one_token(w, x, y, out_offset, out.into())?;
    matvec_dispatches(ctx, w, &job)
}

/// The norm of a product's input, `norm(x) * weight`, for [`matvec_normed`] and
/// [`expert_matvec`].
#[derive(Clone, Copy)]
pub struct InputNorm<'a> {
    pub weight: &'a View,
    pub eps: f32,
}

/// [`rms_norm`] of one token's `x` followed by [`matvec`] of the result in one dispatch per
/// weight tile: every workgroup normalises the row into its own memory, where the two
/// dispatches would cost a wait between them. For rows that fit ([`matvec_input_fits`]).
pub fn matvec_normed<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &'a View,
    norm: &InputNorm<'a>,
    y: &'a View,
    out_offset: u32,
    out: impl Into<Epilogue<'a>>,
) -> Result<Vec<Dispatch>, GpuError> {
    x.expect_len32(&w.name, w.cols)?;
    let job = MatvecJob {
        norm: Some(norm),
        ..MatvecJob::one_token(w, x, y, out_offset, out.into())?
    };
    matvec_dispatches(ctx, w, &job)
}

/// [`matvec`] of an input rounded to 8-bit integers by the product before it
/// ([`MatvecOut::GegluInt8`]): every workgroup reads a quarter of the bytes of a float input,
/// and none rounds it again. For the FFN's down product, whose long input row each of its
/// many workgroups reads ([`MatvecTuning::rounded_input`] has what it measured).
pub fn matvec_int8_input<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    xq: &'a View,
    y: &'a View,
    out_offset: u32,
    out: impl Into<Epilogue<'a>>,
) -> Result<Vec<Dispatch>, GpuError> {
    let job = MatvecJob {
        x_int8: true,
        ..MatvecJob::one_token(w, xq, y, out_offset, out.into())?
    };
    matvec_dispatches(ctx, w, &job)
}

/// The one-token kernel over `tokens` rows of `x`, into consecutive rows of `y`, with a given
/// tuning (`None`: the one [`MatvecTuning::choose`] picks), for tests and kernel tuning.
pub fn matvec_tuned(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &View,
    y: &View,
    tokens: u32,
    out: MatvecOut<'_>,
    tuning: Option<MatvecTuning>,
) -> Result<Vec<Dispatch>, GpuError> {
    let out_rows = if out.is_geglu() { w.rows / 2 } else { w.rows };
    x.expect_len32(&w.name, w.cols * u64::from(tokens))?;
    y.expect_len32(&w.name, out_rows * u64::from(tokens))?;
    let job = MatvecJob {
        m: tokens,
        x_stride: w.cols as u32,
        y_stride: out_rows as u32,
        tuning,
        ..MatvecJob::new(x, y, out)
    };
    matvec_dispatches(ctx, w, &job)
}
