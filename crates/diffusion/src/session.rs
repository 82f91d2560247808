//! A DiffusionGemma generation's state on the GPU: the prompt's KV cache (a text
//! [`GpuSession`] running the causal encoder), and the denoising step over the canvas. A step
//! is one pass: the self-conditioning block makes each canvas row's input, the layers run
//! (the session's canvas step), then the entropy-bound sampler draws, accepts and renoises,
//! leaving the next step's canvas on the GPU. The step's outcome (its argmax canvas, what it
//! accepted, the stop) is the only readback.

use std::collections::HashMap;
use std::sync::Arc;

use std::borrow::Cow;

use wgemma_kernels::graph::{Fusions, Graph, Lowering, Name, Node, PlanOp, Scratch, Val};
use wgemma_kernels::ops::{self, CanvasAcceptArgs, CanvasDraw};
use wgemma_kernels::{Dispatch, GpuError, GpuWeight, Profiler, Tensor, View};
use wgemma_text::{CanvasBuffers, CanvasWork, GpuSession, SessionOptions, SoftTokens};

use crate::config::EntropyBound;
use crate::gpu::{DiffusionError, GpuDiffusion};
use crate::sampler::SamplerRng;
use wgemma_text::forward::GateUp;

/// What feeds a denoising step's self-conditioning block.
#[derive(Clone, Copy, Debug)]
pub enum SelfConditioning<'a> {
    /// Nothing: a block's first step.
    None,
    /// The previous step's logits (still in the canvas buffer) over its temperature.
    Previous { temperature: f32 },
    /// Given logits (`[canvas, vocab]`, already over a temperature): for tests and replays.
    Given(&'a [f32]),
}

/// The self-conditioning block's activations for a canvas.
struct ScScratch {
    soft: View,
    normed: View,
    /// The gate's and up's products where they are two ([`GateUp::Separate`]).
    gate: View,
    up: View,
    act: View,
    sc: View,
    /// Partial sums of products split over k (the soft embeddings' k is the vocabulary).
    partials: View,
}

/// u32s between the regions of [`Sampling::out`]: binding offsets stay 256-byte aligned.
const REGION: u64 = 64;

/// The sampler's buffers. What a step leaves for the CPU lies in one buffer, copied at the
/// end of the step's pass into a mappable one kept for it and read at once: the status, the
/// state (steps the same, then the argmax canvas), the accepted flags and the next canvas
/// (which the next step's embedding reads in place).
struct Sampling {
    stats: View,
    uniforms: View,
    drawn: View,
    renoise: View,
    out: View,
    /// Mappable, as large as `out`.
    staging: View,
    status: View,
    state: View,
    accepted: View,
    next: View,
}

impl Sampling {
    fn new(model: &GpuDiffusion, rows: u64) -> Result<Self, GpuError> {
        let ctx = &model.text.ctx;
        let buf = |name: &str, words: u64| View::of(&ctx.storage(name, words * 4));
        let region = |words: u64| words.div_ceil(REGION) * REGION;
        let (status_at, state_at) = (0, region(4));
        let accepted_at = state_at + region(1 + rows);
        let next_at = accepted_at + region(rows);
        let out = buf("sampler out", next_at + region(rows));
        let staging = ctx.readback_buffer("sampler readback", out.size);
        let at = |words: u64, len: u64| out.slice(words * 4, len * 4);
        Ok(Self {
            stats: buf("canvas stats", 4 * rows),
            uniforms: buf("canvas uniforms", rows),
            drawn: buf("canvas drawn", rows),
            renoise: buf("canvas renoise", rows),
            status: at(status_at, 4)?,
            state: at(state_at, 1 + rows)?,
            accepted: at(accepted_at, rows)?,
            next: at(next_at, rows)?,
            staging: View::of(&staging),
            out,
        })
    }
}

/// Floats of the partial sums the self-conditioning block's products need over `rows` rows.
fn sc_partials(model: &GpuDiffusion, rows: u32) -> u64 {
    let ctx = &*model.text.ctx;
    let sc = &model.sc;
    let mut weights = vec![&sc.embd_t, &sc.down];
    match &sc.gate_up {
        GateUp::Interleaved(w) => weights.push(w),
        GateUp::Separate { gate, up } => weights.extend([gate, up]),
    }
    weights
        .into_iter()
        .map(|w| ops::matmul_partials_floats(ctx, w, rows))
        .max()
        .unwrap_or(0)
        .max(1)
}

/// One denoising step as the sampler saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutcome {
    /// The step's temperature.
    pub temperature: f32,
    /// The argmax canvas: the block's text if this is its last step (the draft otherwise).
    pub argmax: Vec<u32>,
    /// The positions whose draw was accepted (the lowest entropies, within the bound).
    pub accepted: Vec<bool>,
    /// The next step's canvas: drawn where accepted, renoised elsewhere.
    pub next: Vec<u32>,
    /// Mean entropy of the positions' distributions at the step's temperature.
    pub mean_entropy: f32,
    /// Steps running whose argmax canvas equalled the one before.
    pub same: u32,
    /// The block is done: stable and confident.
    pub done: bool,
}

/// A DiffusionGemma generation's state on the GPU.
pub struct DiffusionSession {
    model: Arc<GpuDiffusion>,
    session: GpuSession,
    canvas: CanvasBuffers,
    scratch: ScScratch,
    sampling: Sampling,
    /// The dispatches before a canvas step: without self-conditioning, and with it per
    /// temperature (their parameters differ), built on first use.
    plain: Vec<Dispatch>,
    conditioned: HashMap<u32, Vec<Dispatch>>,
    /// The sampler's dispatches after a step, per temperature and rule.
    samplers: HashMap<[u32; 4], Vec<Dispatch>>,
}

impl DiffusionSession {
    /// A session of `context` positions (the prompt, the blocks and one canvas), with the
    /// model's canvas.
    pub fn new(model: Arc<GpuDiffusion>, context: usize) -> Result<Self, DiffusionError> {
        let rows = model.cfg.canvas_length;
        Self::with_canvas(model, context, rows)
    }

    /// [`DiffusionSession::new`] with blocks of `rows` tokens (the model was trained on its
    /// own canvas length; others work, less well).
    pub fn with_canvas(
        model: Arc<GpuDiffusion>,
        context: usize,
        rows: usize,
    ) -> Result<Self, DiffusionError> {
        Self::with_chunk(model, context, rows, 512)
    }

    /// [`DiffusionSession::with_canvas`] whose prompt steps take at least `chunk` tokens (at
    /// most the context): an image, whose tokens see each other, is never cut by a step, so a
    /// prompt with images needs steps as long as the longest.
    pub fn with_chunk(
        model: Arc<GpuDiffusion>,
        context: usize,
        rows: usize,
        chunk: usize,
    ) -> Result<Self, DiffusionError> {
        if rows == 0 || rows > ops::MAX_CANVAS_ROWS as usize || rows > context {
            return Err(DiffusionError::Input(format!(
                "a canvas of {rows} tokens (1 to {}, within the context of {context})",
                ops::MAX_CANVAS_ROWS
            )));
        }
        let opts = SessionOptions {
            context,
            max_batch: rows.max(chunk.min(context)),
        };
        let mut session = GpuSession::new(model.text.clone(), opts)?;
        let canvas = session.prepare_canvas(rows)?;
        let ctx = &model.text.ctx;
        let c = &model.cfg.text;
        let ff = model.sc.down.cols;
        let buf = |name: &str, floats: u64| View::of(&ctx.storage(name, floats * 4));
        let (r, d) = (rows as u64, c.n_embd as u64);
        let two = matches!(model.sc.gate_up, GateUp::Separate { .. });
        let scratch = ScScratch {
            soft: buf("sc soft", r * d),
            normed: buf("sc normed", r * d),
            gate: buf("sc gate", if two { r * ff } else { 1 }),
            up: buf("sc up", if two { r * ff } else { 1 }),
            act: buf("sc act", r * ff),
            sc: buf("sc out", r * d),
            partials: buf("sc partials", sc_partials(&model, rows as u32)),
        };
        let sampling = Sampling::new(&model, r)?;
        let mut s = Self {
            model,
            session,
            canvas,
            scratch,
            sampling,
            plain: Vec::new(),
            conditioned: HashMap::new(),
            samplers: HashMap::new(),
        };
        s.plain = s.input_dispatches(None)?;
        Ok(s)
    }

    /// The model.
    pub fn model(&self) -> &Arc<GpuDiffusion> {
        &self.model
    }

    /// Positions in the cache (the prompt and the blocks committed so far).
    pub fn position(&self) -> usize {
        self.session.position()
    }

    /// Tokens in a block.
    pub fn canvas_rows(&self) -> usize {
        self.canvas.rows
    }

    /// Positions the session holds.
    pub fn capacity(&self) -> usize {
        self.session.capacity()
    }

    /// Reads `tokens` into the cache with the causal encoder (the prompt, or a finished
    /// block).
    pub async fn encode(&mut self, tokens: &[u32]) -> Result<(), DiffusionError> {
        self.encode_with(tokens, &[]).await
    }

    /// [`DiffusionSession::encode`] with `soft` tokens (an image's, from its tower) in place
    /// of the placeholders they cover; an image's tokens see the whole image.
    pub async fn encode_with(
        &mut self,
        tokens: &[u32],
        soft: &[SoftTokens],
    ) -> Result<(), DiffusionError> {
        let span = tracing::info_span!("encode", tokens = tokens.len(), media = soft.len());
        let _e = span.enter();
        self.session.feed_with(tokens, soft).await?;
        Ok(())
    }

    /// Forgets everything after the first `pos` positions.
    pub fn rewind(&mut self, pos: usize) -> Result<(), DiffusionError> {
        Ok(self.session.rewind(pos)?)
    }

    /// The dispatches that write the canvas rows' input from the canvas in the sampler's
    /// `next`: the scaled embeddings, plus (at temperature `t`) the self-conditioning signal of
    /// the logits in the canvas buffer, then the norm; a graph lowered without fusions.
    fn input_dispatches(&self, t: Option<f32>) -> Result<Vec<Dispatch>, GpuError> {
        let (m, ctx) = (&self.model, &*self.model.text.ctx);
        let c = &m.cfg.text;
        let d = c.n_embd as u32;
        let mut g: Graph<'_, ()> = Graph::new(self.canvas.rows as u32);
        let input = &self.canvas.input;
        let embedded = g.rows_in(name("canvas_embed"), input, d, d, 0);
        g.push(Node::Embed {
            table: Cow::Borrowed(m.text.token_embd()),
            ids: &self.sampling.next,
            scale: c.embed_scale,
            onto: None,
            out: embedded,
        });
        let x = match t {
            Some(t) => self.self_conditioning(&mut g, embedded, t),
            None => embedded,
        };
        let normed = g.rows_in(name("canvas_input"), input, d, d, 0);
        g.push(Node::Norm {
            x,
            weight: None,
            eps: c.eps,
            dim: d,
            out: normed,
        });
        let lowering = Lowering {
            fusions: Fusions::NONE,
            scratch: Scratch::for_products(&self.scratch.partials),
            taps: Vec::new(),
        };
        lowering
            .lower(ctx, &g)?
            .ops
            .into_iter()
            .map(|op| match op {
                PlanOp::Run(d) => Ok(d),
                _ => Err(GpuError::Shape(
                    "the canvas input's plan holds more than dispatches".into(),
                )),
            })
            .collect()
    }

    /// The self-conditioning block on `g`: `x` plus `down(gelu(gate(n)) * up(n))`, `n` the
    /// pre-norm of `softmax(z / t) E sqrt(d)` for the logits z in the canvas buffer. Returns
    /// the sum (where `x` is).
    fn self_conditioning<'a>(&'a self, g: &mut Graph<'a, ()>, x: Val, t: f32) -> Val {
        let (m, s) = (&self.model, &self.scratch);
        let c = &m.cfg.text;
        let (d, vocab) = (c.n_embd as u32, c.n_vocab as u32);
        let logits = &self.canvas.logits;
        let z = g.rows_in(name("sc_logits"), logits, vocab, vocab, 0);
        let probs = g.rows_in(name("sc_probs"), logits, vocab, vocab, 0);
        g.push(Node::Softmax {
            x: z,
            scale: 1.0 / t,
            out: probs,
        });
        let soft = g.rows_in(name("sc_soft"), &s.soft, d, d, 0);
        g.push(linear(&m.sc.embd_t, probs, soft));
        // RMSNorm of `x sqrt(d)` is that of x with eps / d: the soft embeddings' scale is free.
        let normed = g.rows_in(name("sc_normed"), &s.normed, d, d, 0);
        g.push(Node::Norm {
            x: soft,
            weight: Some(&m.sc.pre_norm),
            eps: c.eps / d as f32,
            dim: d,
            out: normed,
        });
        let ff = m.sc.down.cols as u32;
        let act = g.rows_in(name("sc_act"), &s.act, ff, ff, 0);
        match &m.sc.gate_up {
            GateUp::Interleaved(w) => g.push(Node::Linear {
                w,
                x: normed,
                gated: true,
                lora: None,
                out: act,
            }),
            GateUp::Separate { gate, up } => {
                let gv = g.rows_in(name("sc_gate"), &s.gate, ff, ff, 0);
                let uv = g.rows_in(name("sc_up"), &s.up, ff, ff, 0);
                g.push(linear(gate, normed, gv));
                g.push(linear(up, normed, uv));
                g.push(Node::Gated {
                    gate: gv,
                    up: uv,
                    out: act,
                });
            }
        }
        let sc = g.rows_in(name("sc_out"), &s.sc, d, d, 0);
        g.push(linear(&m.sc.down, act, sc));
        let sum = g.rows_in(name("canvas_conditioned"), &self.canvas.input, d, d, 0);
        g.push(Node::Add {
            a: x,
            b: sc,
            out: sum,
        });
        sum
    }

    /// The sampler's dispatches after a step at temperature `t` under `rule`.
    fn sampler_dispatches(&self, t: f32, rule: &EntropyBound) -> Result<Vec<Dispatch>, GpuError> {
        let ctx = &*self.model.text.ctx;
        let (rows, vocab) = (self.canvas.rows as u32, self.model.cfg.text.n_vocab as u32);
        let s = &self.sampling;
        let logits = Tensor::new(&self.canvas.logits, &[rows, vocab])?;
        let stats = Tensor::new(&s.stats, &[4 * rows])?;
        let draw = CanvasDraw {
            logits: &self.canvas.logits,
            rows,
            n: vocab,
            temperature: t,
            stats: &s.stats,
            uniforms: &s.uniforms,
            out: &s.drawn,
        };
        let accept = CanvasAcceptArgs {
            rows,
            stats: &s.stats,
            drawn: &s.drawn,
            renoise: &s.renoise,
            next: &s.next,
            accepted: &s.accepted,
            state: &s.state,
            status: &s.status,
            bound: rule.entropy_bound,
            stability: rule.stability_threshold,
            confidence: rule.confidence_threshold,
        };
        Ok(vec![
            ops::row_stats(ctx, &logits, t, &stats)?,
            ops::canvas_draw(ctx, &draw)?,
            ops::canvas_accept(ctx, &accept)?,
        ])
    }

    fn check_canvas(&self, canvas: &[u32]) -> Result<(), DiffusionError> {
        let (rows, vocab) = (self.canvas.rows, self.model.cfg.text.n_vocab);
        if canvas.len() != rows {
            return Err(DiffusionError::Input(format!(
                "a canvas of {} tokens (the model's is {rows})",
                canvas.len()
            )));
        }
        match canvas.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(DiffusionError::Input(format!(
                "canvas token {t} of {vocab}"
            ))),
            None => Ok(()),
        }
    }

    /// Starts a block at `canvas`: the next step reads it, with no previous argmax canvas.
    pub fn start_block(&mut self, canvas: &[u32]) -> Result<(), DiffusionError> {
        self.check_canvas(canvas)?;
        let ctx = &self.model.text.ctx;
        let s = &self.sampling;
        ctx.write(&s.next.buffer, s.next.offset, bytemuck::cast_slice(canvas));
        let fresh: Vec<u32> = std::iter::once(0)
            .chain(canvas.iter().map(|_| u32::MAX))
            .collect();
        ctx.write(
            &s.state.buffer,
            s.state.offset,
            bytemuck::cast_slice(&fresh),
        );
        Ok(())
    }

    /// The dispatches before a step with `sc`, built on first use.
    fn before(&mut self, sc: SelfConditioning<'_>) -> Result<Vec<Dispatch>, DiffusionError> {
        let c = &self.model.cfg.text;
        let rows = self.canvas.rows;
        let t = match sc {
            SelfConditioning::None => return Ok(self.plain.clone()),
            SelfConditioning::Previous { temperature } => temperature,
            SelfConditioning::Given(z) => {
                if z.len() != rows * c.n_vocab {
                    return Err(DiffusionError::Input(format!(
                        "{} self-conditioning logits for {rows} rows of {}",
                        z.len(),
                        c.n_vocab
                    )));
                }
                let l = &self.canvas.logits;
                self.model
                    .text
                    .ctx
                    .write(&l.buffer, l.offset, bytemuck::cast_slice(z));
                1.0
            }
        };
        if !(t.is_finite() && t > 0.0) {
            return Err(DiffusionError::Input(format!(
                "self-conditioning temperature {t}"
            )));
        }
        if !self.conditioned.contains_key(&t.to_bits()) {
            let d = self.input_dispatches(Some(t))?;
            self.conditioned.insert(t.to_bits(), d);
        }
        Ok(self.conditioned[&t.to_bits()].clone())
    }

    /// One denoising step over `canvas` (no sampling): its logits stay in the canvas buffer
    /// ([`DiffusionSession::logits`]).
    pub async fn denoise(
        &mut self,
        canvas: &[u32],
        sc: SelfConditioning<'_>,
    ) -> Result<(), DiffusionError> {
        let span = tracing::debug_span!("denoise", canvas = canvas.len());
        let _e = span.enter();
        self.start_block(canvas)?;
        let before = self.before(sc)?;
        let work = CanvasWork {
            before: &before,
            ..CanvasWork::default()
        };
        self.session.canvas_step(work, None).await?;
        Ok(())
    }

    /// Step `k` (from 0) of the block started with [`DiffusionSession::start_block`]: the
    /// layers over the current canvas (self-conditioned on step `k - 1`'s logits), then the
    /// sampler under `rule`, drawing its uniforms and renoise tokens from `rng`.
    pub async fn step(
        &mut self,
        k: u32,
        rule: &EntropyBound,
        rng: &mut dyn SamplerRng,
    ) -> Result<StepOutcome, DiffusionError> {
        self.step_profiled(k, rule, rng, None).await
    }

    /// [`DiffusionSession::step`], each dispatch timed by `profiler` when given.
    pub async fn step_profiled(
        &mut self,
        k: u32,
        rule: &EntropyBound,
        rng: &mut dyn SamplerRng,
        profiler: Option<&mut Profiler>,
    ) -> Result<StepOutcome, DiffusionError> {
        let span = tracing::debug_span!("denoise_step", step = k);
        let _e = span.enter();
        let rows = self.canvas.rows;
        let vocab = self.model.cfg.text.n_vocab as u32;
        let mut uniforms = vec![0f32; rows];
        let mut renoise = vec![0u32; rows];
        rng.uniforms(&mut uniforms)?;
        rng.renoise(&mut renoise, vocab)?;
        if renoise.iter().any(|&t| t >= vocab) {
            return Err(DiffusionError::Input(format!(
                "a renoise token past {vocab}"
            )));
        }
        let ctx = self.model.text.ctx.clone();
        let s = &self.sampling;
        ctx.write(
            &s.uniforms.buffer,
            s.uniforms.offset,
            bytemuck::cast_slice(&uniforms),
        );
        ctx.write(
            &s.renoise.buffer,
            s.renoise.offset,
            bytemuck::cast_slice(&renoise),
        );
        let t = rule.temperature(k);
        let sc = match k {
            0 => SelfConditioning::None,
            _ => SelfConditioning::Previous {
                temperature: rule.temperature(k - 1),
            },
        };
        let before = self.before(sc)?;
        let key = [
            t.to_bits(),
            rule.entropy_bound.to_bits(),
            rule.stability_threshold,
            rule.confidence_threshold.to_bits(),
        ];
        if !self.samplers.contains_key(&key) {
            let d = self.sampler_dispatches(t, rule)?;
            self.samplers.insert(key, d);
        }
        let after = self.samplers[&key].clone();
        let s = &self.sampling;
        let work = CanvasWork {
            before: &before,
            after: &after,
            read_back: Some((&s.out, &s.staging)),
        };
        self.session.canvas_step(work, profiler).await?;
        self.outcome(t).await
    }

    /// What the last step left, from the buffer its pass copied it into.
    async fn outcome(&self, temperature: f32) -> Result<StepOutcome, DiffusionError> {
        let (rows, s) = (self.canvas.rows, &self.sampling);
        let bytes = self
            .model
            .text
            .ctx
            .map_and_copy(&s.staging.buffer, s.out.size)
            .await?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        let region = |view: &View, len: usize| {
            let at = ((view.offset - s.out.offset) / 4) as usize;
            words[at..at + len].to_vec()
        };
        let status = region(&s.status, 4);
        let state = region(&s.state, 1 + rows);
        Ok(StepOutcome {
            temperature,
            argmax: state[1..].to_vec(),
            accepted: region(&s.accepted, rows).iter().map(|&a| a == 1).collect(),
            next: region(&s.next, rows),
            mean_entropy: f32::from_bits(status[1]),
            same: status[2],
            done: status[3] == 1,
        })
    }

    /// The last step's logits, `[canvas, vocab]` row-major.
    pub async fn logits(&self) -> Result<Vec<f32>, DiffusionError> {
        Ok(self.model.text.ctx.read_f32(&self.canvas.logits).await?)
    }
}

/// A step-level value name of the canvas input's graph.
fn name(name: &'static str) -> Name {
    Name { name, layer: None }
}

/// `out = x W^T`, no adapter.
fn linear<'a>(w: &'a GpuWeight, x: Val, out: Val) -> Node<'a, ()> {
    Node::Linear {
        w,
        x,
        gated: false,
        lora: None,
        out,
    }
}
