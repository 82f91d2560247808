//! The GPU forward: weights uploaded once, a session's KV cache and scratch allocated once at
//! their maximum shapes, and each step recorded as prepared dispatches into one command
//! encoder. Prefill runs all prompt positions through batched kernels; decode reuses one plan
//! built at session start; the sampled token is the only readback.

use std::cell::RefCell;
use std::sync::Arc;

use wgemma_gguf::{GgmlType, Gguf, RangeSource, TensorInfo, dequantize_to_vec};
use wgemma_kernels::ops::{self, AttentionArgs, Elementwise, MatmulArgs, NormOut, RopeArgs};
use wgemma_kernels::{Dispatch, GpuContext, GpuError, GpuWeight, Profiler, Recorder, View};

use crate::config::TextConfig;
use crate::sampling::{SamplingParams, Strategy, penalty_tokens};
use crate::tensors::{Model, ModelTensors};

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("the context is full: {need} positions needed, the session holds {capacity}")]
    ContextOverflow { need: usize, capacity: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("nothing to run: no tokens were given")]
    Empty,
    #[error("no logits yet: feed tokens first")]
    NoLogits,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Tensor(#[from] wgemma_gguf::TensorError),
    #[error(transparent)]
    Source(#[from] wgemma_gguf::SourceError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("tensor {name}: {reason}")]
    Unsupported { name: String, reason: String },
}

/// Bytes of weights uploaded so far, of the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    pub done: u64,
    pub total: u64,
}

/// The model's weights on the GPU.
pub struct GpuModel {
    pub cfg: TextConfig,
    pub ctx: Arc<GpuContext>,
    w: Model<GpuWeight, View>,
    out_scales: Vec<Option<f32>>,
}

enum Job<'a> {
    Matrix(&'a TensorInfo, GpuWeight),
    Vector(&'a TensorInfo, View),
}

impl GpuModel {
    /// Uploads the model's tensors, reading them through `src` one weight tile at a time, so
    /// memory on the CPU side peaks at one tile.
    pub async fn load<R: RangeSource + ?Sized>(
        ctx: Arc<GpuContext>,
        g: &Gguf,
        cfg: &TextConfig,
        src: &R,
        mut progress: impl FnMut(LoadProgress),
    ) -> Result<Self, LoadError> {
        let tensors = ModelTensors::resolve(g, cfg)?;
        let jobs = RefCell::new(Vec::new());
        let w = tensors.try_map(
            |t: &&TensorInfo| -> Result<GpuWeight, LoadError> {
                let gw = GpuWeight::allocate(&ctx, &t.name, t.dtype, t.row_len(), t.n_rows(), None)
                    .map_err(|e| LoadError::Unsupported {
                        name: t.name.clone(),
                        reason: e.to_string(),
                    })?;
                jobs.borrow_mut().push(Job::Matrix(t, gw.clone()));
                Ok(gw)
            },
            |t: &&TensorInfo| -> Result<View, LoadError> {
                let v = View::of(&ctx.storage(&t.name, t.n_elements() * 4));
                jobs.borrow_mut().push(Job::Vector(t, v.clone()));
                Ok(v)
            },
        )?;
        let jobs = jobs.into_inner();
        let total: u64 = jobs
            .iter()
            .map(|j| match j {
                Job::Matrix(t, _) | Job::Vector(t, _) => t.n_bytes,
            })
            .sum();
        let mut done = 0;
        let mut out_scale_values = std::collections::HashMap::new();
        for job in &jobs {
            match job {
                Job::Matrix(t, gw) => {
                    let start = g.tensor_range(t).start;
                    for i in 0..gw.tiles.len() {
                        let r = gw.tile_range(i);
                        let bytes = src.read_range(start + r.start, r.end - r.start).await?;
                        gw.write_tile(&ctx, i, &bytes)?;
                        done += r.end - r.start;
                        progress(LoadProgress { done, total });
                    }
                }
                Job::Vector(t, view) => {
                    let bytes = src.read_range(g.tensor_range(t).start, t.n_bytes).await?;
                    let values = match t.dtype {
                        GgmlType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(&bytes),
                        dt => dequantize_to_vec(dt, &bytes)?,
                    };
                    if t.name.ends_with("layer_output_scale.weight") {
                        out_scale_values.insert(t.name.clone(), values[0]);
                    }
                    ctx.write(&view.buffer, 0, bytemuck::cast_slice(&values));
                    done += t.n_bytes;
                    progress(LoadProgress { done, total });
                }
            }
        }
        let out_scales = tensors
            .layers
            .iter()
            .map(|l| {
                l.out_scale
                    .and_then(|t| out_scale_values.get(&t.name).copied())
            })
            .collect();
        ctx.check()?;
        Ok(Self {
            cfg: cfg.clone(),
            ctx,
            w,
            out_scales,
        })
    }

    /// Weight bytes one decode step reads: every matrix once (the output projection included),
    /// but only one row of the embedding when it is not also the output.
    pub fn bytes_per_token(&self) -> u64 {
        let total = std::cell::Cell::new(0);
        let _ = self.w.try_map(
            |m| {
                total.set(total.get() + m.rows * m.row_bytes);
                Ok::<_, ()>(())
            },
            |v| {
                total.set(total.get() + v.size);
                Ok::<_, ()>(())
            },
        );
        let embd = &self.w.token_embd;
        let gathered = if self.w.output.is_some() {
            embd.rows * embd.row_bytes - embd.row_bytes
        } else {
            0
        };
        total.get() - gathered
    }

    /// Bytes the weights hold on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        let total = std::cell::Cell::new(0);
        let _ = self.w.try_map(
            |m| {
                total.set(total.get() + m.gpu_bytes());
                Ok::<_, ()>(())
            },
            |v| {
                total.set(total.get() + v.size);
                Ok::<_, ()>(())
            },
        );
        total.get()
    }
}

/// Sizes of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Positions the KV cache holds (prompt and generated tokens together).
    pub context: usize,
    /// Prompt tokens per prefill pass; longer prompts run in several passes.
    pub max_batch: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            context: 4096,
            max_batch: 256,
        }
    }
}

/// One recorded operation of a step.
#[derive(Clone, Debug)]
enum Op {
    Run(Dispatch),
    Copy { from: View, to: View, bytes: u64 },
}

/// The activations of a step, allocated once at the largest batch.
struct Scratch {
    x: View,
    xn: View,
    q: View,
    k_raw: View,
    k: View,
    v: View,
    attn: View,
    o: View,
    gate: View,
    up: View,
    act: View,
    down: View,
    last: View,
    last_n: View,
    logits: View,
    ids: View,
    positions: View,
    argmax_scratch: View,
    result: View,
    topk_scratch: View,
    topk_out: View,
    penalty_tokens: View,
}

/// The sampling dispatches for one strategy, built on first use.
struct SamplerPlan {
    strategy: Strategy,
    penalty: Option<Dispatch>,
    argmax: Option<ops::Argmax>,
    top_k: Option<ops::TopK>,
}

/// Where the logits of a step go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LogitsFor {
    None,
    Last,
    All,
}

/// A conversation's state on the GPU: KV cache, scratch, and the prepared decode step.
pub struct GpuSession {
    model: Arc<GpuModel>,
    capacity: usize,
    max_batch: usize,
    kv: Vec<Option<(View, View)>>,
    s: Scratch,
    decode: Vec<Op>,
    sampler: Option<SamplerPlan>,
    history: Vec<u32>,
    has_logits: bool,
}

const PENALTY_MAX_TOKENS: usize = 1024;

impl GpuSession {
    /// Allocates the KV cache and scratch and prepares the decode step.
    pub fn new(model: Arc<GpuModel>, opts: SessionOptions) -> Result<Self, ForwardError> {
        let _span = tracing::info_span!("session_new", context = opts.context).entered();
        let ctx = &model.ctx;
        let cfg = &model.cfg;
        let capacity = opts.context.clamp(1, cfg.context_length.max(1));
        let b = opts.max_batch.clamp(1, capacity) as u64;
        let buf = |name: &str, floats: u64| View::of(&ctx.storage(name, floats * 4));
        let d = cfg.n_embd as u64;
        let max_q = cfg
            .layers
            .iter()
            .map(|l| cfg.n_head * l.head_dim)
            .max()
            .unwrap_or(0) as u64;
        let max_kv = cfg
            .layers
            .iter()
            .map(|l| l.n_kv_head * l.head_dim)
            .max()
            .unwrap_or(0) as u64;
        let max_ff = cfg.layers.iter().map(|l| l.n_ff).max().unwrap_or(0) as u64;
        let vocab = cfg.n_vocab as u64;
        let max_k = ops::TOPK_MAX;
        let s = Scratch {
            x: buf("x", b * d),
            xn: buf("xn", b * d),
            q: buf("q", b * max_q),
            k_raw: buf("k_raw", b * max_kv),
            k: buf("k", b * max_kv),
            v: buf("v", b * max_kv),
            attn: buf("attn", b * max_q),
            o: buf("o", b * d),
            gate: buf("gate", b * max_ff),
            up: buf("up", b * max_ff),
            act: buf("act", b * max_ff),
            down: buf("down", b * d),
            last: buf("last", d),
            last_n: buf("last_n", d),
            logits: buf("logits", vocab),
            ids: buf("ids", b),
            positions: buf("positions", b),
            argmax_scratch: buf("argmax_scratch", ops::Argmax::scratch_words(vocab as u32)),
            result: buf("result", 2),
            topk_scratch: buf(
                "topk_scratch",
                ops::TopK::scratch_words(vocab as u32, max_k),
            ),
            topk_out: buf("topk_out", 2 * u64::from(max_k)),
            penalty_tokens: buf("penalty_tokens", 2 * PENALTY_MAX_TOKENS as u64),
        };
        let kv = cfg
            .layers
            .iter()
            .enumerate()
            .map(|(il, l)| {
                l.owns_kv(il).then(|| {
                    let n = capacity as u64 * (l.n_kv_head * l.head_dim) as u64;
                    (buf("k_cache", n), buf("v_cache", n))
                })
            })
            .collect();
        let mut session = Self {
            model: model.clone(),
            capacity,
            max_batch: b as usize,
            kv,
            s,
            decode: Vec::new(),
            sampler: None,
            history: Vec::new(),
            has_logits: false,
        };
        session.decode = session.plan(1, LogitsFor::Last, None)?;
        ctx.check()?;
        Ok(session)
    }

    /// Positions in the cache.
    pub fn position(&self) -> usize {
        self.history.len()
    }

    /// The tokens in the cache, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes this session holds on the GPU (KV cache and scratch; weights are the model's).
    pub fn gpu_bytes(&self) -> u64 {
        let s = &self.s;
        let scratch: u64 = [
            &s.x,
            &s.xn,
            &s.q,
            &s.k_raw,
            &s.k,
            &s.v,
            &s.attn,
            &s.o,
            &s.gate,
            &s.up,
            &s.act,
            &s.down,
            &s.last,
            &s.last_n,
            &s.logits,
            &s.ids,
            &s.positions,
            &s.argmax_scratch,
            &s.result,
            &s.topk_scratch,
            &s.topk_out,
            &s.penalty_tokens,
        ]
        .iter()
        .map(|v| v.size)
        .sum();
        let kv: u64 = self.kv.iter().flatten().map(|(k, v)| k.size + v.size).sum();
        scratch + kv
    }

    /// Forgets everything after the first `pos` tokens (their cache slots are overwritten
    /// when new tokens arrive and are never read before then).
    pub fn rewind(&mut self, pos: usize) {
        self.history.truncate(pos);
        self.has_logits = false;
    }

    /// The ops of one step over `m` tokens. `all_logits` receives every row's logits when
    /// `logits` is [`LogitsFor::All`].
    fn plan(
        &self,
        m: u32,
        logits: LogitsFor,
        all_logits: Option<&View>,
    ) -> Result<Vec<Op>, GpuError> {
        let model = &*self.model;
        let (ctx, cfg, w, s) = (&*model.ctx, &model.cfg, &model.w, &self.s);
        let d = cfg.n_embd as u32;
        let eps = cfg.eps;
        let mut ops: Vec<Op> = Vec::new();
        let mut run = |ds: Vec<Dispatch>| ops.extend(ds.into_iter().map(Op::Run));
        let mm = |wt: &GpuWeight, x: &View, y: &View, softcap: f32| {
            ops::matmul(
                ctx,
                wt,
                &MatmulArgs {
                    x,
                    y,
                    m,
                    x_stride: wt.cols as u32,
                    y_stride: wt.rows as u32,
                    softcap,
                },
            )
        };
        run(ops::embed(
            ctx,
            &w.token_embd,
            &s.ids,
            &s.x,
            m,
            cfg.embed_scale,
        )?);
        for (il, (lw, lc)) in w.layers.iter().zip(&cfg.layers).enumerate() {
            let hd = lc.head_dim as u32;
            let (nh, nkv) = (cfg.n_head as u32, lc.n_kv_head as u32);
            run(vec![ops::rms_norm(
                ctx,
                &s.x,
                NormOut::To(&s.xn),
                Some(&lw.attn_norm),
                m,
                d,
                d,
                eps,
            )?]);
            run(mm(&lw.q, &s.xn, &s.q, 0.0)?);
            run(vec![ops::rms_norm(
                ctx,
                &s.q,
                NormOut::InPlace,
                Some(&lw.q_norm),
                m * nh,
                hd,
                hd,
                eps,
            )?]);
            let ff = if lc.rope_freq_factors {
                w.rope_freqs.as_ref()
            } else {
                None
            };
            let rope = |x: &View, heads: u32| {
                ops::rope(
                    ctx,
                    &RopeArgs {
                        x,
                        positions: &s.positions,
                        tokens: m,
                        heads,
                        head_dim: hd,
                        n_rot: lc.n_rot as u32,
                        base: lc.rope_base,
                        freq_scale: lc.rope_freq_scale,
                        freq_factors: ff,
                    },
                )
            };
            run(vec![rope(&s.q, nh)?]);
            if let (Some(wk), Some(k_norm), Some((kc, vc))) = (&lw.k, &lw.k_norm, &self.kv[il]) {
                let kv_row = nkv * hd;
                run(mm(wk, &s.xn, &s.k_raw, 0.0)?);
                run(vec![ops::rms_norm(
                    ctx,
                    &s.k_raw,
                    NormOut::To(&s.k),
                    Some(k_norm),
                    m * nkv,
                    hd,
                    hd,
                    eps,
                )?]);
                // Gemma 4 layers without a V projection use the raw K projection as V.
                let v_src = match &lw.v {
                    Some(wv) => {
                        run(mm(wv, &s.xn, &s.v, 0.0)?);
                        &s.v
                    }
                    None => &s.k_raw,
                };
                if cfg.v_norm {
                    run(vec![ops::rms_norm(
                        ctx,
                        v_src,
                        NormOut::InPlace,
                        None,
                        m * nkv,
                        hd,
                        hd,
                        eps,
                    )?]);
                }
                run(vec![rope(&s.k, nkv)?]);
                run(vec![
                    ops::kv_store(ctx, &s.k, kc, &s.positions, kv_row, m, kv_row)?,
                    ops::kv_store(ctx, v_src, vc, &s.positions, kv_row, m, kv_row)?,
                ]);
            }
            let (kc, vc) = self.kv[lc.kv_source].as_ref().ok_or_else(|| {
                GpuError::Shape(format!(
                    "layer {il} reads layer {}'s missing cache",
                    lc.kv_source
                ))
            })?;
            run(vec![ops::attention(
                ctx,
                &AttentionArgs {
                    q: &s.q,
                    k_cache: kc,
                    v_cache: vc,
                    positions: &s.positions,
                    out: &s.attn,
                    tokens: m,
                    n_head: nh,
                    n_kv_head: nkv,
                    head_dim: hd,
                    window: if lc.sliding {
                        cfg.sliding_window as u32
                    } else {
                        0
                    },
                    scale: cfg.attn_scale,
                    softcap: 0.0,
                },
            )?]);
            run(mm(&lw.o, &s.attn, &s.o, 0.0)?);
            run(vec![
                ops::rms_norm(
                    ctx,
                    &s.o,
                    NormOut::AddTo(&s.x),
                    Some(&lw.post_attn_norm),
                    m,
                    d,
                    d,
                    eps,
                )?,
                ops::rms_norm(
                    ctx,
                    &s.x,
                    NormOut::To(&s.xn),
                    Some(&lw.ffn_norm),
                    m,
                    d,
                    d,
                    eps,
                )?,
            ]);
            run(mm(&lw.gate, &s.xn, &s.gate, 0.0)?);
            run(mm(&lw.up, &s.xn, &s.up, 0.0)?);
            let ff_n = lc.n_ff as u32;
            run(vec![ops::elementwise(
                ctx,
                Elementwise::Geglu {
                    gate: &s.gate,
                    up: &s.up,
                    cols: ff_n,
                    gate_stride: ff_n,
                    up_stride: ff_n,
                },
                &s.act,
                m * ff_n,
            )?]);
            run(mm(&lw.down, &s.act, &s.down, 0.0)?);
            run(vec![ops::rms_norm(
                ctx,
                &s.down,
                NormOut::AddTo(&s.x),
                Some(&lw.post_ffw_norm),
                m,
                d,
                d,
                eps,
            )?]);
            if let Some(scale) = model.out_scales[il] {
                run(vec![ops::elementwise(
                    ctx,
                    Elementwise::Scale(scale),
                    &s.x,
                    m * d,
                )?]);
            }
        }
        let softcap = cfg.final_softcap.unwrap_or(0.0);
        let out_w = w.output_matrix();
        match logits {
            LogitsFor::None => {}
            LogitsFor::Last => {
                let src = if m == 1 {
                    &s.x
                } else {
                    let bytes = u64::from(d) * 4;
                    ops.push(Op::Copy {
                        from: s.x.slice(u64::from(m - 1) * bytes, bytes)?,
                        to: s.last.clone(),
                        bytes,
                    });
                    &s.last
                };
                ops.push(Op::Run(ops::rms_norm(
                    ctx,
                    src,
                    NormOut::To(&s.last_n),
                    Some(&w.output_norm),
                    1,
                    d,
                    d,
                    eps,
                )?));
                let single = ops::matmul(
                    ctx,
                    out_w,
                    &MatmulArgs {
                        x: &s.last_n,
                        y: &s.logits,
                        m: 1,
                        x_stride: d,
                        y_stride: cfg.n_vocab as u32,
                        softcap,
                    },
                )?;
                ops.extend(single.into_iter().map(Op::Run));
            }
            LogitsFor::All => {
                let out =
                    all_logits.ok_or_else(|| GpuError::Shape("no buffer for all logits".into()))?;
                ops.push(Op::Run(ops::rms_norm(
                    ctx,
                    &s.x,
                    NormOut::To(&s.xn),
                    Some(&w.output_norm),
                    m,
                    d,
                    d,
                    eps,
                )?));
                let all = ops::matmul(
                    ctx,
                    out_w,
                    &MatmulArgs {
                        x: &s.xn,
                        y: out,
                        m,
                        x_stride: d,
                        y_stride: cfg.n_vocab as u32,
                        softcap,
                    },
                )?;
                ops.extend(all.into_iter().map(Op::Run));
            }
        }
        Ok(ops)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ForwardError> {
        if tokens.is_empty() {
            return Err(ForwardError::Empty);
        }
        let vocab = self.model.cfg.n_vocab;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ForwardError::BadToken { id, vocab });
        }
        let need = self.history.len() + tokens.len();
        if need > self.capacity {
            return Err(ForwardError::ContextOverflow {
                need,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Writes the ids and positions of a chunk that starts at the current position.
    fn stage(&self, chunk: &[u32]) {
        let ctx = &self.model.ctx;
        let start = self.history.len() as u32;
        let positions: Vec<u32> = (start..start + chunk.len() as u32).collect();
        ctx.write(
            &self.s.ids.buffer,
            self.s.ids.offset,
            bytemuck::cast_slice(chunk),
        );
        ctx.write(
            &self.s.positions.buffer,
            self.s.positions.offset,
            bytemuck::cast_slice(&positions),
        );
    }

    fn record(rec: &mut Recorder<'_>, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Run(d) => rec.run(d),
                Op::Copy { from, to, bytes } => rec.copy(from, to, *bytes),
            }
        }
    }

    /// Runs `tokens` through the model and records (without submitting) nothing past the
    /// last chunk's logits; earlier chunks are submitted as they are recorded.
    fn feed_into(&mut self, rec: &mut Recorder<'_>, tokens: &[u32]) -> Result<(), ForwardError> {
        self.check_tokens(tokens)?;
        let chunks: Vec<&[u32]> = tokens.chunks(self.max_batch).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            if !last {
                // Earlier chunks go in their own submission: ids and positions are rewritten
                // for the next chunk, and queue writes land before the next submission only.
                let ops = self.plan(chunk.len() as u32, LogitsFor::None, None)?;
                self.stage(chunk);
                let mut r = Recorder::new(&self.model.ctx, "prefill");
                Self::record(&mut r, &ops);
                r.submit();
            } else {
                self.stage(chunk);
                if chunk.len() == 1 {
                    Self::record(rec, &self.decode);
                } else {
                    let ops = self.plan(chunk.len() as u32, LogitsFor::Last, None)?;
                    Self::record(rec, &ops);
                }
            }
            self.history.extend_from_slice(chunk);
        }
        self.has_logits = true;
        Ok(())
    }

    /// Feeds `tokens` (prompt or generated) and leaves the last one's logits on the GPU.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<(), ForwardError> {
        self.feed_profiled(tokens, None)
    }

    /// [`GpuSession::feed`], timing each dispatch of the last chunk with `profiler`.
    pub fn feed_profiled(
        &mut self,
        tokens: &[u32],
        profiler: Option<&mut Profiler>,
    ) -> Result<(), ForwardError> {
        let _span = tracing::debug_span!("feed", tokens = tokens.len()).entered();
        let ctx = self.model.ctx.clone();
        let mut rec = match profiler {
            Some(p) => Recorder::profiled(&ctx, "feed", p),
            None => Recorder::new(&ctx, "feed"),
        };
        let r = self.feed_into(&mut rec, tokens);
        rec.submit();
        r?;
        ctx.check()?;
        Ok(())
    }

    /// Feeds `tokens` and samples the next token in the same submission.
    pub async fn feed_and_sample(
        &mut self,
        tokens: &[u32],
        p: &SamplingParams,
        step: u32,
    ) -> Result<u32, ForwardError> {
        let ctx = self.model.ctx.clone();
        let mut rec = Recorder::new(&ctx, "step");
        self.feed_into(&mut rec, tokens)?;
        self.record_sampling(&mut rec, p, step)?;
        rec.submit();
        self.finish_sampling(p, step).await
    }

    /// Samples the next token from the logits left by the last feed.
    pub async fn sample(&mut self, p: &SamplingParams, step: u32) -> Result<u32, ForwardError> {
        if !self.has_logits {
            return Err(ForwardError::NoLogits);
        }
        let ctx = self.model.ctx.clone();
        let mut rec = Recorder::new(&ctx, "sample");
        self.record_sampling(&mut rec, p, step)?;
        rec.submit();
        self.finish_sampling(p, step).await
    }

    fn record_sampling(
        &mut self,
        rec: &mut Recorder<'_>,
        p: &SamplingParams,
        step: u32,
    ) -> Result<(), ForwardError> {
        let ctx = self.model.ctx.clone();
        let vocab = self.model.cfg.n_vocab as u32;
        let strategy = p.strategy();
        if self
            .sampler
            .as_ref()
            .is_none_or(|sp| sp.strategy != strategy)
        {
            self.sampler = Some(self.sampler_plan(strategy)?);
        }
        let sp = self.sampler.as_ref().expect("just built");
        if let Some(pen) = p.penalties() {
            let mut toks = penalty_tokens(&self.history, p.penalty_last_n);
            toks.truncate(PENALTY_MAX_TOKENS);
            let flat: Vec<u32> = toks.iter().flat_map(|&(a, b)| [a, b]).collect();
            let d = match &sp.penalty {
                Some(d) => d.clone(),
                None => {
                    let d = ops::penalties(
                        &ctx,
                        &self.s.penalty_tokens,
                        PENALTY_MAX_TOKENS as u32,
                        &self.s.logits,
                        vocab,
                        pen,
                    )?;
                    self.sampler.as_mut().expect("just built").penalty = Some(d.clone());
                    d
                }
            };
            if !flat.is_empty() {
                ctx.write(
                    &self.s.penalty_tokens.buffer,
                    0,
                    bytemuck::cast_slice(&flat),
                );
                d.update_params(&ctx, &ops::penalty_params(toks.len() as u32, vocab, pen));
                rec.run_grid(&d, [(toks.len() as u32).div_ceil(64), 1, 1]);
            }
        }
        let sp = self.sampler.as_ref().expect("just built");
        if let Some(a) = &sp.argmax {
            if strategy == Strategy::Gumbel {
                a.set_gumbel(
                    &ctx,
                    vocab,
                    ops::Gumbel {
                        seed: p.seed32(),
                        step,
                        temperature: p.temperature,
                    },
                );
            }
            rec.run(&a.partial);
            rec.run(&a.finish);
        }
        if let Some(t) = &sp.top_k {
            rec.run(&t.partial);
            rec.run(&t.finish);
        }
        Ok(())
    }

    fn sampler_plan(&self, strategy: Strategy) -> Result<SamplerPlan, GpuError> {
        let ctx = &self.model.ctx;
        let s = &self.s;
        let vocab = self.model.cfg.n_vocab as u32;
        let gumbel = (strategy == Strategy::Gumbel).then_some(ops::Gumbel {
            seed: 0,
            step: 0,
            temperature: 1.0,
        });
        let (argmax, top_k) = match strategy {
            Strategy::Greedy | Strategy::Gumbel => (
                Some(ops::argmax(
                    ctx,
                    &s.logits,
                    vocab,
                    &s.argmax_scratch,
                    &s.result,
                    gumbel,
                )?),
                None,
            ),
            Strategy::TopK(k) => (
                None,
                Some(ops::top_k(
                    ctx,
                    &s.logits,
                    vocab,
                    k,
                    &s.topk_scratch,
                    &s.topk_out,
                )?),
            ),
        };
        Ok(SamplerPlan {
            strategy,
            penalty: None,
            argmax,
            top_k,
        })
    }

    async fn finish_sampling(
        &mut self,
        p: &SamplingParams,
        step: u32,
    ) -> Result<u32, ForwardError> {
        let ctx = self.model.ctx.clone();
        let token = match p.strategy() {
            Strategy::Greedy | Strategy::Gumbel => ctx.read_u32(&self.s.result).await?[0],
            Strategy::TopK(k) => {
                let words = ctx
                    .read_u32(&self.s.topk_out.slice(0, u64::from(k) * 8)?)
                    .await?;
                let cands: Vec<(u32, f32)> = words
                    .chunks_exact(2)
                    .map(|c| (c[0], f32::from_bits(c[1])))
                    .filter(|c| (c.0 as usize) < self.model.cfg.n_vocab)
                    .collect();
                crate::sampling::draw(&cands, p, p.uniform(step)).unwrap_or(0)
            }
        };
        // Penalties changed the logits in place: they are no longer the raw ones.
        if p.penalties().is_some() {
            self.has_logits = false;
        }
        Ok(token)
    }

    /// Reads the logits of the last fed token back (for tests and tools).
    pub async fn logits(&self) -> Result<Vec<f32>, ForwardError> {
        if !self.has_logits {
            return Err(ForwardError::NoLogits);
        }
        Ok(self.model.ctx.read_f32(&self.s.logits).await?)
    }

    /// Teacher forcing: feeds `tokens` and returns, after each, the argmax token and its
    /// logit (what the model predicts next).
    pub async fn score(&mut self, tokens: &[u32]) -> Result<Vec<(u32, f32)>, ForwardError> {
        self.check_tokens(tokens)?;
        let ctx = self.model.ctx.clone();
        let vocab = self.model.cfg.n_vocab;
        // Rows of logits per pass: bounded so the buffer stays small.
        let rows = self.max_batch.min(16);
        let all = View::of(&ctx.storage("all_logits", (rows * vocab * 4) as u64));
        let mut out = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(rows) {
            let ops = self.plan(chunk.len() as u32, LogitsFor::All, Some(&all))?;
            self.stage(chunk);
            let mut rec = Recorder::new(&ctx, "score");
            Self::record(&mut rec, &ops);
            rec.submit();
            self.history.extend_from_slice(chunk);
            let logits = ctx
                .read_f32(&all.slice(0, (chunk.len() * vocab * 4) as u64)?)
                .await?;
            out.extend(logits.chunks_exact(vocab).map(wgemma_kernels::cpu::argmax));
        }
        self.has_logits = false;
        Ok(out)
    }
}
