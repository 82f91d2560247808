//! Argmax, top-k, penalties and the sampling kernels over logits.

use super::*;

kernel_bindings!(
    /// `argmax.wgsl` with PARTIAL.
    ArgmaxPartialBindings { x: 0, part: 1, p: 2 }
);

kernel_bindings!(
    /// `argmax.wgsl` with PARTIAL and ROWS.
    ArgmaxRowsPartialBindings { x: 0, part: 1, p: 2, draws: 3 }
);

kernel_bindings!(
    /// `argmax.wgsl`'s final stage.
    ArgmaxFinalBindings { result: 0, part: 1, p: 2 }
);

kernel_bindings!(
    /// `topk.wgsl` with PARTIAL.
    TopKPartialBindings { x: 0, cand: 1, p: 2 }
);

kernel_bindings!(
    /// `topk.wgsl`'s final stage.
    TopKFinalBindings { cand: 0, out: 1, p: 2 }
);

kernel_bindings!(
    /// `penalty.wgsl`.
    PenaltyBindings {
        tokens: 0,
        logits: 1,
        p: 2,
    }
);

kernel_bindings!(
    /// `sample.wgsl`: what `a` and `b` hold depends on the variant (DRAW: candidates and
    /// result; RING_PUSH: result and ring; PENALTY_RING: ring and logits; PICK: logits and
    /// out).
    SampleBindings {
        a: 0 = ["cand", "result", "ring", "logits"],
        b: 1 = ["result", "ring", "logits", "out"],
        p: 2,
    }
);

/// Gumbel-max sampling parameters: the argmax then samples softmax(logits / temperature).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gumbel {
    pub seed: u32,
    pub step: u32,
    pub temperature: f32,
}

impl Gumbel {
    /// The factor the logits are scaled by (a temperature of 0 as a tiny one).
    fn inv_temp(&self) -> f32 {
        1.0 / self.temperature.max(1e-6)
    }
}

/// The two dispatches of an argmax over `n` values; `result` receives (index, value bits).
pub struct Argmax {
    pub partial: Dispatch,
    pub finish: Dispatch,
}

impl Argmax {
    /// Scratch words the first stage needs for `n` values.
    pub fn scratch_words(n: u32) -> u64 {
        2 * u64::from(n.div_ceil(ARGMAX_CHUNK))
    }

    /// Changes the Gumbel step (and seed/temperature) without rebuilding: for decode loops.
    pub fn set_gumbel(&self, ctx: &GpuContext, n: u32, g: Gumbel) {
        let params = argmax_params(n, Some(g));
        self.partial.update_params(ctx, &params);
    }
}

fn argmax_params(n: u32, g: Option<Gumbel>) -> Params {
    let g = g.unwrap_or(Gumbel {
        seed: 0,
        step: 0,
        temperature: 1.0,
    });
    Params::of(&ArgmaxParams {
        n,
        parts: n.div_ceil(ARGMAX_CHUNK),
        seed: g.seed,
        step: g.step,
        inv_temp: g.inv_temp(),
    })
}

/// One row's draw in [`argmax_rows`] (`argmax.wgsl`'s `Draw`): the row's argmax, or a
/// Gumbel-max sample as [`argmax`] draws it with a [`Gumbel`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowDraw {
    pub seed: u32,
    pub step: u32,
    pub inv_temp: f32,
    /// 1: the Gumbel-max sample; 0: the plain argmax.
    pub gumbel: u32,
}

impl RowDraw {
    /// The plain argmax.
    pub fn greedy() -> Self {
        Self {
            seed: 0,
            step: 0,
            inv_temp: 1.0,
            gumbel: 0,
        }
    }

    /// The sample [`argmax`] draws with `g`.
    pub fn gumbel(g: Gumbel) -> Self {
        Self {
            seed: g.seed,
            step: g.step,
            inv_temp: g.inv_temp(),
            gumbel: 1,
        }
    }
}

/// Each of `rows` rows of `n` values of `x` (one after another): its argmax or Gumbel-max
/// sample as `draws` (`rows` [`RowDraw`]s) says, into `result` as [`argmax`] writes one (two
/// words a row: the index, the value's bits). `scratch`: [`Argmax::scratch_words`] a row.
/// Two dispatches whatever the rows: a batched decode step's sampling.
pub fn argmax_rows(
    ctx: &GpuContext,
    x: &View,
    n: u32,
    rows: u32,
    scratch: &View,
    result: &View,
    draws: &View,
) -> Result<Argmax, GpuError> {
    let rows64 = u64::from(rows);
    x.expect_len32("argmax rows x", u64::from(n) * rows64)?;
    scratch.expect_len32("argmax rows scratch", Argmax::scratch_words(n) * rows64)?;
    result.expect_len32("argmax rows result", 2 * rows64)?;
    draws.expect_len32("argmax rows draws", 4 * rows64)?;
    let params = argmax_params(n, None);
    let source = ShaderSource::new("argmax", &[ARGMAX_WGSL]).flag("ROWS");
    let partial = ctx.dispatch(
        "argmax_rows",
        ctx.pipeline(&source.clone().flag("PARTIAL")),
        ArgmaxRowsPartialBindings {
            x: Bind::Storage(x),
            part: Bind::Storage(scratch),
            p: Bind::Params(params.clone()),
            draws: Bind::Storage(draws),
        },
        [n.div_ceil(ARGMAX_CHUNK), rows, 1],
    )?;
    let finish = ctx.dispatch(
        "argmax_rows_final",
        ctx.pipeline(&source),
        ArgmaxFinalBindings {
            result: Bind::Storage(result),
            part: Bind::Storage(scratch),
            p: Bind::Params(params),
        },
        [rows, 1, 1],
    )?;
    Ok(Argmax { partial, finish })
}

/// Index of the largest of the first `n` values of `x` (or a Gumbel-max sample).
pub fn argmax(
    ctx: &GpuContext,
    x: &View,
    n: u32,
    scratch: &View,
    result: &View,
    gumbel: Option<Gumbel>,
) -> Result<Argmax, GpuError> {
    x.expect_len32("argmax x", u64::from(n))?;
    scratch.expect_len32("argmax scratch", Argmax::scratch_words(n))?;
    result.expect_len32("argmax result", 2)?;
    let params = argmax_params(n, gumbel);
    let partial = ctx.dispatch(
        "argmax",
        ctx.pipeline(
            &ShaderSource::new("argmax", &[ARGMAX_WGSL])
                .flag("PARTIAL")
                .flag_if(gumbel.is_some(), "GUMBEL"),
        ),
        ArgmaxPartialBindings {
            x: Bind::Storage(x),
            part: Bind::Storage(scratch),
            p: Bind::Params(params.clone()),
        },
        [n.div_ceil(ARGMAX_CHUNK), 1, 1],
    )?;
    let finish = ctx.dispatch(
        "argmax_final",
        ctx.pipeline(&ShaderSource::new("argmax", &[ARGMAX_WGSL])),
        ArgmaxFinalBindings {
            result: Bind::Storage(result),
            part: Bind::Storage(scratch),
            p: Bind::Params(params),
        },
        [1, 1, 1],
    )?;
    Ok(Argmax { partial, finish })
}

/// The two dispatches of a top-k; `out` receives k (index, value bits) pairs, best first.
pub struct TopK {
    pub partial: Dispatch,
    pub finish: Dispatch,
}

impl TopK {
    /// Scratch words the first stage needs.
    pub fn scratch_words(n: u32, k: u32) -> u64 {
        2 * u64::from(n.div_ceil(TOPK_CHUNK)) * u64::from(k)
    }
}

/// The `k` largest of the first `n` values of `x`, sorted.
pub fn top_k(
    ctx: &GpuContext,
    x: &View,
    n: u32,
    k: u32,
    scratch: &View,
    out: &View,
) -> Result<TopK, GpuError> {
    x.expect_len32("top_k x", u64::from(n))?;
    let rows = TopKRows {
        n,
        rows: 1,
        row_stride: n,
        x_at: 0,
    };
    top_k_dispatches(ctx, x, rows, k, scratch, out)
}

/// The `k` largest of each row of `logits` (`[rows, n]`, rows of any stride, values
/// contiguous), sorted: `out[row]` holds k (index, value bits) pairs, best first. What a
/// sampler over many rows (a diffusion canvas) needs.
pub fn top_k_rows(
    ctx: &GpuContext,
    logits: &Tensor,
    k: u32,
    scratch: &View,
    out: &View,
) -> Result<TopK, GpuError> {
    logits.expect_dtype("top_k logits", DType::F32)?;
    if logits.rank() != 2 || (logits.dim(1) > 1 && logits.strides()[1] != 1) {
        return Err(shape(format!(
            "top_k logits: {:?} (strides {:?}): 2-D, each row's values contiguous",
            logits.dims(),
            logits.strides()
        )));
    }
    let rows = TopKRows {
        n: logits.dim(1),
        rows: logits.dim(0),
        row_stride: logits.strides()[0],
        x_at: logits.offset(),
    };
    top_k_dispatches(ctx, logits.view(), rows, k, scratch, out)
}

/// The rows a top-k reads: `rows` of `n` values, `row_stride` apart from `x_at`.
#[derive(Clone, Copy)]
struct TopKRows {
    n: u32,
    rows: u32,
    row_stride: u32,
    x_at: u32,
}

fn top_k_dispatches(
    ctx: &GpuContext,
    x: &View,
    r: TopKRows,
    k: u32,
    scratch: &View,
    out: &View,
) -> Result<TopK, GpuError> {
    if k == 0 || k > TOPK_MAX {
        return Err(shape(format!("top_k: k = {k} (1..={TOPK_MAX})")));
    }
    let rows = u64::from(r.rows);
    scratch.expect_len32("top_k scratch", rows * TopK::scratch_words(r.n, k))?;
    out.expect_len32("top_k out", rows * 2 * u64::from(k))?;
    let parts = r.n.div_ceil(TOPK_CHUNK);
    if parts * k > 16 * 256 {
        return Err(shape(format!(
            "top_k: {} values give too many candidates for k = {k}",
            r.n
        )));
    }
    let params = |n| {
        Params::of(&TopKParams {
            n,
            k,
            row_stride: r.row_stride,
            x_at: r.x_at,
        })
    };
    let partial = ctx.dispatch(
        "top_k",
        ctx.pipeline(&ShaderSource::new("top_k", &[TOPK_WGSL]).flag("PARTIAL")),
        TopKPartialBindings {
            x: Bind::Storage(x),
            cand: Bind::Storage(scratch),
            p: Bind::Params(params(r.n)),
        },
        [parts, r.rows, 1],
    )?;
    let finish = ctx.dispatch(
        "top_k_final",
        ctx.pipeline(&ShaderSource::new("top_k", &[TOPK_WGSL])),
        TopKFinalBindings {
            cand: Bind::Storage(scratch),
            out: Bind::Storage(out),
            p: Bind::Params(params(parts * k)),
        },
        [1, r.rows, 1],
    )?;
    Ok(TopK { partial, finish })
}

/// Penalty settings of [`penalties`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PenaltyParams {
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
}

/// Applies repetition/frequency/presence penalties to the logits of the `count` tokens listed in
/// `tokens` as (id, occurrences) pairs.
pub fn penalties(
    ctx: &GpuContext,
    tokens: &View,
    count: u32,
    logits: &View,
    vocab: u32,
    p: PenaltyParams,
) -> Result<Dispatch, GpuError> {
    tokens.expect_len32("penalty tokens", 2 * u64::from(count))?;
    logits.expect_len32("penalty logits", u64::from(vocab))?;
    ctx.dispatch(
        "penalties",
        ctx.pipeline(&ShaderSource::new("penalties", &[PENALTY_WGSL])),
        PenaltyBindings {
            tokens: Bind::Storage(tokens),
            logits: Bind::Storage(logits),
            p: Bind::Params(penalty_params(count, vocab, p)),
        },
        [count.max(1).div_ceil(64), 1, 1],
    )
}

/// The parameter block of [`penalties`], for updating a prepared dispatch.
pub fn penalty_params(count: u32, vocab: u32, p: PenaltyParams) -> Params {
    Params::of(&PenaltyKernelParams {
        n: count,
        vocab,
        repeat: p.repeat,
        frequency: p.frequency,
        presence: p.presence,
    })
}

/// Capacity of the recent-token ring the penalties read (words: one count, then tokens).
pub const RING_CAP: u32 = 1024;

/// Settings of the GPU sampling kernels; rewritten each step (the step feeds the random
/// stream).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleParams {
    pub k: u32,
    pub seed: u32,
    pub step: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub last_n: u32,
    pub penalties: PenaltyParams,
    pub vocab: u32,
}

impl SampleParams {
    pub fn params(&self) -> Params {
        Params::of(&SampleKernelParams {
            k: self.k,
            seed: self.seed,
            step: self.step,
            last_n: self.last_n.min(RING_CAP),
            temperature: self.temperature,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat: self.penalties.repeat,
            frequency: self.penalties.frequency,
            presence: self.penalties.presence,
            vocab: self.vocab,
            cap: RING_CAP,
        })
    }
}

/// Which of the sampling kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKernel {
    /// Draw from top-k candidates into `result[0]`.
    Draw,
    /// Append `result[0]` to the ring.
    RingPush,
    /// Penalise the logits of the ring's recent tokens.
    PenaltyRing,
    /// The logit of token `out[0]` into `out[1]`.
    Pick,
}

/// One of the GPU sampling kernels. `a` and `b` are, for `Draw`: the top-k output and the
/// result; for `RingPush`: the result and the ring; for `PenaltyRing`: the ring and the logits;
/// for `Pick`: the logits and the output (token in, its logit out).
pub fn sample_kernel(
    ctx: &GpuContext,
    kind: SampleKernel,
    a: &View,
    b: &View,
    p: &SampleParams,
) -> Result<Dispatch, GpuError> {
    let (flag, label) = match kind {
        SampleKernel::Draw => {
            if p.k == 0 || p.k > TOPK_MAX {
                return Err(shape(format!("draw: k = {}", p.k)));
            }
            a.expect_len32("draw candidates", 2 * u64::from(p.k))?;
            ("DRAW", "sample_draw")
        }
        SampleKernel::RingPush => {
            b.expect_len32("ring", 1 + u64::from(RING_CAP))?;
            ("RING_PUSH", "ring_push")
        }
        SampleKernel::PenaltyRing => {
            a.expect_len32("ring", 1 + u64::from(RING_CAP))?;
            b.expect_len32("logits", u64::from(p.vocab))?;
            ("PENALTY_RING", "penalty_ring")
        }
        SampleKernel::Pick => {
            a.expect_len32("logits", u64::from(p.vocab))?;
            b.expect_len32("pick output", 2)?;
            ("PICK", "pick_logit")
        }
    };
    ctx.dispatch(
        label,
        ctx.pipeline(&ShaderSource::new("sample", &[SAMPLE_WGSL]).flag(flag)),
        SampleBindings {
            a: Bind::Storage(a),
            b: Bind::Storage(b),
            p: Bind::Params(p.params()),
        },
        [1, 1, 1],
    )
}
