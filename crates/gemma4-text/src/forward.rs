//! The GPU forward.
//!
//! Weights are uploaded once; projections that share an input and a dtype (Q/K/V, gate/up) sit
//! side by side in one weight so one dispatch computes them. A session allocates its KV cache
//! and scratch once, at the largest shapes. Prefill runs all prompt positions through batched
//! kernels. Decode runs a plan built once per session from fused kernels (norms, residual adds
//! and activations folded into the matrix-vector products) and keeps the token on the GPU: the
//! embedding reads the token that the previous step sampled into `result`, so steps can be
//! queued back to back while the CPU reads earlier tokens back.

use std::collections::VecDeque;
use std::sync::Arc;

use wgemma_gguf::{GgmlType, Gguf, RangeSource, TensorInfo, dequantize_to_vec};
use wgemma_kernels::ops::{
    self, AttentionArgs, Elementwise, HeadPostArgs, HeadPostKv, MatmulArgs, MatvecOut, NormOut,
    SampleKernel,
};
use wgemma_kernels::{Dispatch, GpuContext, GpuError, GpuWeight, Profiler, Recorder, View, wgpu};

use crate::config::TextConfig;
use crate::sampling::{SamplingParams, Strategy};
use crate::tensors::ModelTensors;

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
    #[error("no sampled token to feed: start with a prompt")]
    NothingSampled,
    #[error("steps are still in flight: read their tokens first")]
    Busy,
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

/// A weight whose rows land at column `offset` of a shared output.
#[derive(Clone, Debug)]
struct Part {
    w: GpuWeight,
    offset: u32,
}

/// The gate and up projections of a feed-forward block.
enum GateUp {
    /// One weight with gate and up rows alternating, so one product yields the activation.
    Interleaved(GpuWeight),
    /// Different dtypes: two products and a separate activation.
    Separate { gate: GpuWeight, up: GpuWeight },
}

/// One decoder layer on the GPU.
struct Layer {
    attn_norm: View,
    /// `[q | k | v]` projections (k and v absent on shared-KV layers, v absent when V is K).
    qkv: Vec<Part>,
    qkv_width: u32,
    k_is_v: bool,
    q_norm: View,
    k_norm: Option<View>,
    o: GpuWeight,
    post_attn_norm: View,
    ffn_norm: View,
    gate_up: GateUp,
    down: GpuWeight,
    post_ffw_norm: View,
    out_scale: f32,
}

/// The model's weights on the GPU.
pub struct GpuModel {
    pub cfg: TextConfig,
    pub ctx: Arc<GpuContext>,
    token_embd: GpuWeight,
    output: Option<GpuWeight>,
    output_norm: View,
    rope_freqs: Option<View>,
    layers: Vec<Layer>,
}

/// What the loader copies where.
enum Job<'a> {
    /// Tensors stacked by rows into one weight.
    Matrix(Vec<&'a TensorInfo>, GpuWeight),
    /// Two tensors with their rows alternating (gate, up).
    Interleaved(&'a TensorInfo, &'a TensorInfo, GpuWeight),
    Vector(&'a TensorInfo, View),
}

/// Splits projections that share an input into runs of equal dtype, each one weight.
fn runs<'a>(tensors: &[&'a TensorInfo]) -> Vec<Vec<&'a TensorInfo>> {
    let mut out: Vec<Vec<&TensorInfo>> = Vec::new();
    for &t in tensors {
        match out.last_mut() {
            Some(run) if run[0].dtype == t.dtype => run.push(t),
            _ => out.push(vec![t]),
        }
    }
    out
}

struct Loader<'a, 'c> {
    ctx: &'c GpuContext,
    jobs: Vec<Job<'a>>,
}

impl<'a> Loader<'a, '_> {
    fn matrix(&mut self, parts: Vec<&'a TensorInfo>) -> Result<GpuWeight, LoadError> {
        let first = parts[0];
        let rows = parts.iter().map(|t| t.n_rows()).sum();
        let name = parts
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join("+");
        let w = GpuWeight::allocate(self.ctx, &name, first.dtype, first.row_len(), rows, None)
            .map_err(|e| LoadError::Unsupported {
                name: name.clone(),
                reason: e.to_string(),
            })?;
        self.jobs.push(Job::Matrix(parts, w.clone()));
        Ok(w)
    }

    fn gate_up(&mut self, gate: &'a TensorInfo, up: &'a TensorInfo) -> Result<GateUp, LoadError> {
        if gate.dtype != up.dtype {
            return Ok(GateUp::Separate {
                gate: self.matrix(vec![gate])?,
                up: self.matrix(vec![up])?,
            });
        }
        let name = format!("{}+{}", gate.name, up.name);
        let w = GpuWeight::allocate(
            self.ctx,
            &name,
            gate.dtype,
            gate.row_len(),
            2 * gate.n_rows(),
            None,
        )
        .map_err(|e| LoadError::Unsupported {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        self.jobs.push(Job::Interleaved(gate, up, w.clone()));
        Ok(GateUp::Interleaved(w))
    }

    fn vector(&mut self, t: &'a TensorInfo) -> View {
        let v = View::of(&self.ctx.storage(&t.name, t.n_elements() * 4));
        self.jobs.push(Job::Vector(t, v.clone()));
        v
    }

    /// Projections side by side: one part per run of equal dtype, with its output column.
    fn parts(&mut self, tensors: &[&'a TensorInfo]) -> Result<(Vec<Part>, u32), LoadError> {
        let mut offset = 0;
        let mut parts = Vec::new();
        for run in runs(tensors) {
            let w = self.matrix(run)?;
            let rows = w.rows as u32;
            parts.push(Part { w, offset });
            offset += rows;
        }
        Ok((parts, offset))
    }
}

/// Reads rows `rows` (even bounds) of two tensors interleaved row by row: two range reads,
/// then the rows alternate in memory.
async fn interleaved_rows<R: RangeSource + ?Sized>(
    g: &Gguf,
    src: &R,
    a: &TensorInfo,
    b: &TensorInfo,
    rows: std::ops::Range<u64>,
) -> Result<Vec<u8>, LoadError> {
    let (lo, hi) = (rows.start / 2, rows.end / 2);
    let rb = a.row_bytes();
    let read = |t: &TensorInfo| src.read_range(g.tensor_range(t).start + lo * rb, (hi - lo) * rb);
    let (ra, rbytes) = (read(a).await?, read(b).await?);
    let mut out = Vec::with_capacity(ra.len() * 2);
    for (x, y) in ra
        .chunks_exact(rb as usize)
        .zip(rbytes.chunks_exact(rb as usize))
    {
        out.extend_from_slice(x);
        out.extend_from_slice(y);
    }
    Ok(out)
}

/// Reads rows `rows` of the stacked `parts` (the bytes of a weight tile).
async fn stacked_rows<R: RangeSource + ?Sized>(
    g: &Gguf,
    src: &R,
    parts: &[&TensorInfo],
    rows: std::ops::Range<u64>,
) -> Result<Vec<u8>, LoadError> {
    let mut out = Vec::new();
    let mut first = 0;
    for t in parts {
        let (lo, hi) = (rows.start.max(first), rows.end.min(first + t.n_rows()));
        if lo < hi {
            let start = g.tensor_range(t).start + (lo - first) * t.row_bytes();
            out.extend(src.read_range(start, (hi - lo) * t.row_bytes()).await?);
        }
        first += t.n_rows();
    }
    Ok(out)
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
        let t = ModelTensors::resolve(g, cfg)?;
        let mut ld = Loader {
            ctx: &ctx,
            jobs: Vec::new(),
        };
        let token_embd = ld.matrix(vec![t.token_embd])?;
        let output = t.output.map(|o| ld.matrix(vec![o])).transpose()?;
        let output_norm = ld.vector(t.output_norm);
        let rope_freqs = t.rope_freqs.map(|r| ld.vector(r));
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for lt in &t.layers {
            let mut qkv_tensors = vec![lt.q];
            qkv_tensors.extend(lt.k);
            qkv_tensors.extend(lt.v);
            let (qkv, qkv_width) = ld.parts(&qkv_tensors)?;
            let gate_up = ld.gate_up(lt.gate, lt.up)?;
            let out_scale = match lt.out_scale {
                Some(s) => {
                    let bytes = src.read_range(g.tensor_range(s).start, s.n_bytes).await?;
                    dequantize_to_vec(s.dtype, &bytes)?
                        .first()
                        .copied()
                        .unwrap_or(1.0)
                }
                None => 1.0,
            };
            layers.push(Layer {
                attn_norm: ld.vector(lt.attn_norm),
                qkv,
                qkv_width,
                k_is_v: lt.k.is_some() && lt.v.is_none(),
                q_norm: ld.vector(lt.q_norm),
                k_norm: lt.k_norm.map(|k| ld.vector(k)),
                o: ld.matrix(vec![lt.o])?,
                post_attn_norm: ld.vector(lt.post_attn_norm),
                ffn_norm: ld.vector(lt.ffn_norm),
                gate_up,
                down: ld.matrix(vec![lt.down])?,
                post_ffw_norm: ld.vector(lt.post_ffw_norm),
                out_scale,
            });
        }
        let total: u64 = ld
            .jobs
            .iter()
            .map(|j| match j {
                Job::Matrix(parts, _) => parts.iter().map(|t| t.n_bytes).sum(),
                Job::Interleaved(a, b, _) => a.n_bytes + b.n_bytes,
                Job::Vector(t, _) => t.n_bytes,
            })
            .sum();
        let mut done = 0;
        for job in &ld.jobs {
            match job {
                Job::Matrix(parts, w) => {
                    for i in 0..w.tiles.len() {
                        let tile = &w.tiles[i];
                        let bytes =
                            stacked_rows(g, src, parts, tile.first_row..tile.first_row + tile.rows)
                                .await?;
                        w.write_tile(&ctx, i, &bytes)?;
                        done += bytes.len() as u64;
                        progress(LoadProgress { done, total });
                    }
                }
                Job::Interleaved(a, b, w) => {
                    for i in 0..w.tiles.len() {
                        let tile = &w.tiles[i];
                        let bytes = interleaved_rows(
                            g,
                            src,
                            a,
                            b,
                            tile.first_row..tile.first_row + tile.rows,
                        )
                        .await?;
                        w.write_tile(&ctx, i, &bytes)?;
                        done += bytes.len() as u64;
                        progress(LoadProgress { done, total });
                    }
                }
                Job::Vector(t, view) => {
                    let bytes = src.read_range(g.tensor_range(t).start, t.n_bytes).await?;
                    let values = match t.dtype {
                        GgmlType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(&bytes),
                        dt => dequantize_to_vec(dt, &bytes)?,
                    };
                    ctx.write(&view.buffer, 0, bytemuck::cast_slice(&values));
                    done += t.n_bytes;
                    progress(LoadProgress { done, total });
                }
            }
        }
        ctx.check()?;
        Ok(Self {
            cfg: cfg.clone(),
            ctx: ctx.clone(),
            token_embd,
            output,
            output_norm,
            rope_freqs,
            layers,
        })
    }

    fn matrices(&self) -> impl Iterator<Item = &GpuWeight> {
        let layers = self.layers.iter().flat_map(|l| {
            let gate_up = match &l.gate_up {
                GateUp::Interleaved(w) => vec![w],
                GateUp::Separate { gate, up } => vec![gate, up],
            };
            l.qkv
                .iter()
                .map(|p| &p.w)
                .chain(gate_up)
                .chain([&l.o, &l.down])
        });
        std::iter::once(&self.token_embd)
            .chain(&self.output)
            .chain(layers)
    }

    /// Weight bytes one decode step reads: every matrix once (the output projection included),
    /// but only one row of the embedding when it is not also the output.
    pub fn bytes_per_token(&self) -> u64 {
        let all: u64 = self.matrices().map(|w| w.rows * w.row_bytes).sum();
        let e = &self.token_embd;
        match self.output {
            Some(_) => all - e.rows * e.row_bytes + e.row_bytes,
            None => all,
        }
    }

    /// Bytes the weights hold on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        let vectors: u64 = self
            .layers
            .iter()
            .flat_map(|l| {
                [
                    &l.attn_norm,
                    &l.q_norm,
                    &l.post_attn_norm,
                    &l.ffn_norm,
                    &l.post_ffw_norm,
                ]
                .into_iter()
                .chain(&l.k_norm)
            })
            .chain([&self.output_norm])
            .chain(&self.rope_freqs)
            .map(|v| v.size)
            .sum();
        self.matrices().map(GpuWeight::gpu_bytes).sum::<u64>() + vectors
    }

    fn output_matrix(&self) -> &GpuWeight {
        self.output.as_ref().unwrap_or(&self.token_embd)
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

/// Activations, allocated once at the largest batch. `x` is the residual stream, `xn` the
/// normed input of the next block.
struct Scratch {
    x: View,
    xn: View,
    qkv: View,
    attn: View,
    attn_part: View,
    o: View,
    gate_up: View,
    up: View,
    act: View,
    down: View,
    last_n: View,
    logits: View,
    ids: View,
    positions: View,
    argmax_scratch: View,
    result: View,
    topk_scratch: View,
    topk_out: View,
    ring: View,
}

/// The sampling dispatches for one strategy, built on first use and reused every step.
struct SamplerPlan {
    strategy: Strategy,
    penalties: bool,
    ring_push: Dispatch,
    penalty: Dispatch,
    argmax: Option<ops::Argmax>,
    top_k: Option<ops::TopK>,
    draw: Option<Dispatch>,
}

/// Where the logits of a batched step go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LogitsFor {
    None,
    Last,
    All,
}

/// A step whose sampled token is on its way back.
struct InFlight {
    slot: usize,
    submission: wgpu::SubmissionIndex,
    mapped: futures::channel::oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>,
}

/// Steps that may be queued before the oldest token must be read back.
pub const MAX_IN_FLIGHT: usize = 4;

/// A conversation's state on the GPU: KV cache, scratch, and the prepared decode step.
pub struct GpuSession {
    model: Arc<GpuModel>,
    capacity: usize,
    max_batch: usize,
    kv: Vec<Option<(View, View)>>,
    s: Scratch,
    decode: Vec<Op>,
    sampler: Option<SamplerPlan>,
    /// Tokens of the cache positions whose token the CPU knows, in order.
    history: Vec<u32>,
    /// Positions fed with sampled tokens not read back yet (the last ones).
    fed_unknown: usize,
    /// A sampled token read back but not fed yet.
    known_unfed: Option<u32>,
    /// Whether `result` holds a sampled token not fed yet.
    has_sample: bool,
    readback: Vec<wgpu::Buffer>,
    in_flight: VecDeque<InFlight>,
    next_slot: usize,
    has_logits: bool,
}

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
        let max =
            |f: &dyn Fn(&Layer) -> u32| u64::from(model.layers.iter().map(f).max().unwrap_or(0));
        let max_qkv = max(&|l| l.qkv_width);
        let max_q = cfg
            .layers
            .iter()
            .map(|l| cfg.n_head * l.head_dim)
            .max()
            .unwrap_or(0) as u64;
        let max_ff = cfg.layers.iter().map(|l| l.n_ff).max().unwrap_or(0) as u64;
        let max_hd = cfg.layers.iter().map(|l| l.head_dim).max().unwrap_or(0) as u32;
        let vocab = cfg.n_vocab as u64;
        let s = Scratch {
            x: buf("x", b * d),
            xn: buf("xn", b * d),
            qkv: buf("qkv", b * max_qkv),
            attn: buf("attn", b * max_q),
            attn_part: buf(
                "attn_part",
                ops::DecodeAttention::scratch_floats(cfg.n_head as u32, max_hd, capacity as u32),
            ),
            o: buf("o", b * d),
            gate_up: buf("gate_up", b * 2 * max_ff),
            up: buf("up", b * max_ff),
            act: buf("act", b * max_ff),
            down: buf("down", b * d),
            last_n: buf("last_n", d),
            logits: buf("logits", vocab),
            ids: buf("ids", b),
            positions: buf("positions", b),
            argmax_scratch: buf("argmax_scratch", ops::Argmax::scratch_words(vocab as u32)),
            result: buf("result", 2),
            topk_scratch: buf(
                "topk_scratch",
                ops::TopK::scratch_words(vocab as u32, ops::TOPK_MAX),
            ),
            topk_out: buf("topk_out", 2 * u64::from(ops::TOPK_MAX)),
            ring: buf("ring", 1 + u64::from(ops::RING_CAP)),
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
        let readback = (0..MAX_IN_FLIGHT)
            .map(|_| {
                ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("token readback"),
                    size: 8,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
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
            fed_unknown: 0,
            known_unfed: None,
            has_sample: false,
            readback,
            in_flight: VecDeque::new(),
            next_slot: 0,
            has_logits: false,
        };
        session.decode = session.plan(1, &session.s.result, LogitsFor::Last, None)?;
        ctx.check()?;
        Ok(session)
    }

    /// Positions in the cache.
    pub fn position(&self) -> usize {
        self.history.len() + self.fed_unknown
    }

    /// The tokens in the cache whose ids are known, in order (all of them once no step is in
    /// flight).
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Steps queued whose tokens are not read back yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bytes this session holds on the GPU (KV cache and scratch; weights are the model's).
    pub fn gpu_bytes(&self) -> u64 {
        let s = &self.s;
        let scratch: u64 = [
            &s.x,
            &s.xn,
            &s.qkv,
            &s.attn,
            &s.attn_part,
            &s.o,
            &s.gate_up,
            &s.up,
            &s.act,
            &s.down,
            &s.last_n,
            &s.logits,
            &s.ids,
            &s.positions,
            &s.argmax_scratch,
            &s.result,
            &s.topk_scratch,
            &s.topk_out,
            &s.ring,
        ]
        .iter()
        .map(|v| v.size)
        .sum();
        let kv: u64 = self.kv.iter().flatten().map(|(k, v)| k.size + v.size).sum();
        scratch + kv
    }

    /// Forgets everything after the first `pos` tokens (their cache slots are overwritten
    /// when new tokens arrive and are never read before then). Steps in flight must have been
    /// read first.
    pub fn rewind(&mut self, pos: usize) -> Result<(), ForwardError> {
        if !self.in_flight.is_empty() {
            return Err(ForwardError::Busy);
        }
        self.history.truncate(pos);
        self.fed_unknown = 0;
        self.known_unfed = None;
        self.has_sample = false;
        self.has_logits = false;
        Ok(())
    }

    fn head_post_args<'a>(&'a self, il: usize, m: u32) -> HeadPostArgs<'a> {
        let (cfg, l) = (&self.model.cfg, &self.model.layers[il]);
        let lc = &cfg.layers[il];
        let kv = match (&l.k_norm, &self.kv[il]) {
            (Some(k_norm), Some((kc, vc))) => Some(HeadPostKv {
                k_norm,
                k_cache: kc,
                v_cache: vc,
                n_kv: lc.n_kv_head as u32,
                k_is_v: l.k_is_v,
                v_norm: cfg.v_norm,
            }),
            _ => None,
        };
        HeadPostArgs {
            qkv: &self.s.qkv,
            q_norm: &l.q_norm,
            kv,
            positions: &self.s.positions,
            tokens: m,
            n_head: cfg.n_head as u32,
            head_dim: lc.head_dim as u32,
            stride: l.qkv_width,
            n_rot: lc.n_rot as u32,
            base: lc.rope_base,
            freq_scale: lc.rope_freq_scale,
            freq_factors: if lc.rope_freq_factors {
                self.model.rope_freqs.as_ref()
            } else {
                None
            },
            eps: cfg.eps,
        }
    }

    fn attention_args<'a>(&'a self, il: usize, m: u32) -> Result<AttentionArgs<'a>, GpuError> {
        let cfg = &self.model.cfg;
        let lc = &cfg.layers[il];
        let (kc, vc) = self.kv[lc.kv_source].as_ref().ok_or_else(|| {
            GpuError::Shape(format!(
                "layer {il} reads layer {}'s missing cache",
                lc.kv_source
            ))
        })?;
        Ok(AttentionArgs {
            q: &self.s.qkv,
            k_cache: kc,
            v_cache: vc,
            positions: &self.s.positions,
            out: &self.s.attn,
            tokens: m,
            n_head: cfg.n_head as u32,
            n_kv_head: lc.n_kv_head as u32,
            head_dim: lc.head_dim as u32,
            window: if lc.sliding {
                cfg.sliding_window as u32
            } else {
                0
            },
            scale: cfg.attn_scale,
            softcap: 0.0,
            q_stride: self.model.layers[il].qkv_width,
        })
    }

    /// The ops of one step over `m` tokens whose ids are in `ids`. One token takes the
    /// matrix-vector and split-attention kernels (the decode step); more take the batched
    /// ones. Between the blocks of each layer a single pass does the residual add and the next
    /// block's norm. `all_logits` receives every row's logits when `logits` is
    /// [`LogitsFor::All`].
    fn plan(
        &self,
        m: u32,
        ids: &View,
        logits: LogitsFor,
        all_logits: Option<&View>,
    ) -> Result<Vec<Op>, GpuError> {
        let model = &*self.model;
        let (ctx, cfg, s) = (&*model.ctx, &model.cfg, &self.s);
        let d = cfg.n_embd as u32;
        let eps = cfg.eps;
        let single = m == 1;
        let mut ops: Vec<Op> = Vec::new();
        // y[:, y_offset..] = x W^T over m tokens.
        let product =
            |w: &GpuWeight, x: &View, y: &View, y_stride: u32, y_offset: u32, softcap: f32| {
                if single {
                    ops::matvec(ctx, w, x, y, y_offset, MatvecOut::Rows { softcap })
                } else {
                    ops::matmul(
                        ctx,
                        w,
                        &MatmulArgs {
                            x,
                            y,
                            m,
                            x_stride: w.cols as u32,
                            y_stride,
                            softcap,
                            y_offset,
                        },
                    )
                }
            };
        let mut run = |ds: Vec<Dispatch>| ops.extend(ds.into_iter().map(Op::Run));
        run(ops::embed(
            ctx,
            &model.token_embd,
            ids,
            &s.x,
            m,
            cfg.embed_scale,
        )?);
        // The block before the current one, whose output still has to join the residual
        // stream: (delta, post-norm weight, scale).
        let mut pending: Option<(&View, &View, f32)> = None;
        let into_block = |pending: Option<(&View, &View, f32)>,
                          weight: &View|
         -> Result<Dispatch, GpuError> {
            match pending {
                None => ops::rms_norm(ctx, &s.x, NormOut::To(&s.xn), Some(weight), m, d, d, eps),
                Some((delta, post, scale)) => {
                    ops::residual_norm(ctx, &s.x, delta, post, weight, &s.xn, m, d, scale, eps)
                }
            }
        };
        for (il, l) in model.layers.iter().enumerate() {
            let ff = cfg.layers[il].n_ff as u32;
            run(vec![into_block(pending, &l.attn_norm)?]);
            for p in &l.qkv {
                run(product(&p.w, &s.xn, &s.qkv, l.qkv_width, p.offset, 0.0)?);
            }
            run(vec![ops::head_post(ctx, &self.head_post_args(il, m))?]);
            let att = self.attention_args(il, m)?;
            if single {
                let a = ops::attention_decode(ctx, &att, 0, &s.attn_part)?;
                run(vec![a.split, a.combine]);
            } else {
                run(vec![ops::attention(ctx, &att)?]);
            }
            run(product(&l.o, &s.attn, &s.o, d, 0, 0.0)?);
            run(vec![into_block(
                Some((&s.o, &l.post_attn_norm, 1.0)),
                &l.ffn_norm,
            )?]);
            match &l.gate_up {
                GateUp::Interleaved(w) if single => {
                    run(ops::matvec(ctx, w, &s.xn, &s.act, 0, MatvecOut::Geglu)?);
                }
                GateUp::Interleaved(w) => {
                    run(product(w, &s.xn, &s.gate_up, 2 * ff, 0, 0.0)?);
                    run(vec![ops::elementwise(
                        ctx,
                        Elementwise::Geglu {
                            gate: &s.gate_up,
                            up: &s.gate_up,
                            cols: ff,
                            gate_stride: 2 * ff,
                            up_stride: 2 * ff,
                            interleaved: true,
                        },
                        &s.act,
                        m * ff,
                    )?]);
                }
                GateUp::Separate { gate, up } => {
                    run(product(gate, &s.xn, &s.gate_up, ff, 0, 0.0)?);
                    run(product(up, &s.xn, &s.up, ff, 0, 0.0)?);
                    run(vec![ops::elementwise(
                        ctx,
                        Elementwise::Geglu {
                            gate: &s.gate_up,
                            up: &s.up,
                            cols: ff,
                            gate_stride: ff,
                            up_stride: ff,
                            interleaved: false,
                        },
                        &s.act,
                        m * ff,
                    )?]);
                }
            }
            run(product(&l.down, &s.act, &s.down, d, 0, 0.0)?);
            pending = Some((&s.down, &l.post_ffw_norm, l.out_scale));
        }
        let softcap = cfg.final_softcap.unwrap_or(0.0);
        let vocab = cfg.n_vocab as u32;
        if logits != LogitsFor::None {
            run(vec![into_block(pending, &model.output_norm)?]);
        }
        match logits {
            LogitsFor::None => {}
            LogitsFor::Last => {
                let src = if single {
                    &s.xn
                } else {
                    let bytes = u64::from(d) * 4;
                    ops.push(Op::Copy {
                        from: s.xn.slice(u64::from(m - 1) * bytes, bytes)?,
                        to: s.last_n.clone(),
                        bytes,
                    });
                    &s.last_n
                };
                let head = ops::matvec(
                    ctx,
                    model.output_matrix(),
                    src,
                    &s.logits,
                    0,
                    MatvecOut::Rows { softcap },
                )?;
                ops.extend(head.into_iter().map(Op::Run));
            }
            LogitsFor::All => {
                let out =
                    all_logits.ok_or_else(|| GpuError::Shape("no buffer for all logits".into()))?;
                let all = ops::matmul(
                    ctx,
                    model.output_matrix(),
                    &MatmulArgs {
                        x: &s.xn,
                        y: out,
                        m,
                        x_stride: d,
                        y_stride: vocab,
                        softcap,
                        y_offset: 0,
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
        let need = self.position() + tokens.len();
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
        let start = self.position() as u32;
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

    /// Records `tokens` through the model, leaving the last one's logits; chunks before the
    /// last are submitted on their own (ids and positions are rewritten between them).
    fn feed_into(&mut self, rec: &mut Recorder<'_>, tokens: &[u32]) -> Result<(), ForwardError> {
        self.check_tokens(tokens)?;
        if !self.in_flight.is_empty() {
            return Err(ForwardError::Busy);
        }
        self.settle_sample();
        let chunks: Vec<&[u32]> = tokens.chunks(self.max_batch).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            if last && chunk.len() == 1 {
                // One token: the fused decode step, which reads its token from `result`.
                let ctx = &self.model.ctx;
                ctx.write(&self.s.result.buffer, 0, bytemuck::bytes_of(&chunk[0]));
                self.stage(chunk);
                Self::record(rec, &self.decode);
            } else {
                let logits = if last {
                    LogitsFor::Last
                } else {
                    LogitsFor::None
                };
                let ops = self.plan(chunk.len() as u32, &self.s.ids, logits, None)?;
                self.stage(chunk);
                if last {
                    Self::record(rec, &ops);
                } else {
                    let mut r = Recorder::new(&self.model.ctx, "prefill");
                    Self::record(&mut r, &ops);
                    r.submit();
                }
            }
            self.history.extend_from_slice(chunk);
        }
        self.write_ring();
        self.has_logits = true;
        Ok(())
    }

    /// A sampled token that was never fed is dropped when tokens are fed explicitly.
    fn settle_sample(&mut self) {
        self.has_sample = false;
        self.known_unfed = None;
    }

    /// The recent-token ring the penalties read: the last tokens of the history.
    fn write_ring(&self) {
        let cap = ops::RING_CAP as usize;
        let recent = &self.history[self.history.len().saturating_sub(cap)..];
        let mut ring = vec![0u32; 1 + cap];
        ring[0] = recent.len() as u32;
        ring[1..1 + recent.len()].copy_from_slice(recent);
        self.model
            .ctx
            .write(&self.s.ring.buffer, 0, bytemuck::cast_slice(&ring));
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

    /// Starts generation: feeds `tokens` and queues the sampling of the next token.
    pub fn begin(
        &mut self,
        tokens: &[u32],
        p: &SamplingParams,
        step: u32,
    ) -> Result<(), ForwardError> {
        let _span = tracing::info_span!("prefill", tokens = tokens.len()).entered();
        let ctx = self.model.ctx.clone();
        let mut rec = Recorder::new(&ctx, "begin");
        self.feed_into(&mut rec, tokens)?;
        self.record_sampling(&mut rec, p, step, false)?;
        self.submit_step(rec);
        Ok(())
    }

    /// Queues one decode step: feeds the last sampled token (still on the GPU) and samples
    /// the next. Does not wait: read tokens back with [`GpuSession::next_token`].
    pub fn advance(&mut self, p: &SamplingParams, step: u32) -> Result<(), ForwardError> {
        if !self.has_sample {
            return Err(ForwardError::NothingSampled);
        }
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            return Err(ForwardError::Busy);
        }
        let need = self.position() + 1;
        if need > self.capacity {
            return Err(ForwardError::ContextOverflow {
                need,
                capacity: self.capacity,
            });
        }
        let ctx = self.model.ctx.clone();
        let pos = self.position() as u32;
        ctx.write(
            &self.s.positions.buffer,
            self.s.positions.offset,
            bytemuck::bytes_of(&pos),
        );
        let mut rec = Recorder::new(&ctx, "decode");
        Self::record(&mut rec, &self.decode);
        self.record_sampling(&mut rec, p, step, true)?;
        // The token fed here joins the history when its id is known.
        match self.known_unfed.take() {
            Some(t) => self.history.push(t),
            None => self.fed_unknown += 1,
        }
        self.has_logits = true;
        self.submit_step(rec);
        Ok(())
    }

    /// Copies `result` to the next readback slot, submits, and starts mapping it.
    fn submit_step(&mut self, mut rec: Recorder<'_>) {
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % MAX_IN_FLIGHT;
        let staging = View::of(&self.readback[slot]);
        rec.copy(
            &self.s.result.slice(0, 8).expect("result holds two words"),
            &staging,
            8,
        );
        let submission = rec.submit();
        let (tx, rx) = futures::channel::oneshot::channel();
        self.readback[slot]
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        self.in_flight.push_back(InFlight {
            slot,
            submission,
            mapped: rx,
        });
        self.has_sample = true;
    }

    /// Waits for the oldest queued step and returns the token it sampled.
    pub async fn next_token(&mut self) -> Result<u32, ForwardError> {
        let f = self
            .in_flight
            .pop_front()
            .ok_or(ForwardError::NothingSampled)?;
        let ctx = self.model.ctx.clone();
        #[cfg(not(target_arch = "wasm32"))]
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(f.submission),
                timeout: None,
            })
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        #[cfg(target_arch = "wasm32")]
        let _ = f.submission;
        let mapped = f
            .mapped
            .await
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        ctx.check()?;
        mapped.map_err(|e| GpuError::Readback(e.to_string()))?;
        let buf = &self.readback[f.slot];
        let token = {
            let view = buf
                .slice(..)
                .get_mapped_range()
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            u32::from_le_bytes([view[0], view[1], view[2], view[3]])
        };
        buf.unmap();
        if self.fed_unknown > 0 {
            self.history.push(token);
            self.fed_unknown -= 1;
        } else {
            self.known_unfed = Some(token);
        }
        Ok(token)
    }

    /// Reads every queued step back (their tokens are in the history or pending after this).
    pub async fn drain(&mut self) -> Result<(), ForwardError> {
        while !self.in_flight.is_empty() {
            self.next_token().await?;
        }
        Ok(())
    }

    /// Feeds `tokens` and samples the next token, waiting for it.
    pub async fn feed_and_sample(
        &mut self,
        tokens: &[u32],
        p: &SamplingParams,
        step: u32,
    ) -> Result<u32, ForwardError> {
        self.begin(tokens, p, step)?;
        self.next_token().await
    }

    /// Samples the next token from the logits left by the last feed.
    pub async fn sample(&mut self, p: &SamplingParams, step: u32) -> Result<u32, ForwardError> {
        if !self.has_logits {
            return Err(ForwardError::NoLogits);
        }
        if !self.in_flight.is_empty() {
            return Err(ForwardError::Busy);
        }
        let ctx = self.model.ctx.clone();
        let mut rec = Recorder::new(&ctx, "sample");
        self.record_sampling(&mut rec, p, step, false)?;
        self.submit_step(rec);
        self.next_token().await
    }

    /// Records the sampling of the logits into `result[0]`. `feeds_result` says whether the
    /// step's input token came from `result` (then it joins the penalty ring first).
    fn record_sampling(
        &mut self,
        rec: &mut Recorder<'_>,
        p: &SamplingParams,
        step: u32,
        feeds_result: bool,
    ) -> Result<(), ForwardError> {
        let ctx = self.model.ctx.clone();
        let vocab = self.model.cfg.n_vocab as u32;
        let strategy = p.strategy();
        let penalties = p.penalties();
        let needs_new = self
            .sampler
            .as_ref()
            .is_none_or(|sp| sp.strategy != strategy || sp.penalties != penalties.is_some());
        if needs_new {
            self.sampler = Some(self.sampler_plan(strategy, penalties.is_some())?);
        }
        let sp = self.sampler.as_ref().expect("just built");
        let gp = p.gpu_params(step, vocab);
        if sp.penalties {
            sp.penalty.update_params(&ctx, &gp.params());
            if feeds_result {
                rec.run(&sp.ring_push);
            }
            rec.run(&sp.penalty);
        }
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
        if let (Some(t), Some(d)) = (&sp.top_k, &sp.draw) {
            d.update_params(&ctx, &gp.params());
            rec.run(&t.partial);
            rec.run(&t.finish);
            rec.run(d);
        }
        // Penalties rewrite the logits in place: they are no longer the raw ones.
        if sp.penalties {
            self.has_logits = false;
        }
        Ok(())
    }

    fn sampler_plan(&self, strategy: Strategy, penalties: bool) -> Result<SamplerPlan, GpuError> {
        let ctx = &self.model.ctx;
        let s = &self.s;
        let vocab = self.model.cfg.n_vocab as u32;
        let gp = SamplingParams::default().gpu_params(0, vocab);
        let k = match strategy {
            Strategy::TopK(k) => k,
            _ => 1,
        };
        let gp = ops::SampleParams { k, ..gp };
        let gumbel = (strategy == Strategy::Gumbel).then_some(ops::Gumbel {
            seed: 0,
            step: 0,
            temperature: 1.0,
        });
        let (argmax, top_k, draw) = match strategy {
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
                Some(ops::sample_kernel(
                    ctx,
                    SampleKernel::Draw,
                    &s.topk_out,
                    &s.result,
                    &gp,
                )?),
            ),
        };
        Ok(SamplerPlan {
            strategy,
            penalties,
            ring_push: ops::sample_kernel(ctx, SampleKernel::RingPush, &s.result, &s.ring, &gp)?,
            penalty: ops::sample_kernel(ctx, SampleKernel::PenaltyRing, &s.ring, &s.logits, &gp)?,
            argmax,
            top_k,
            draw,
        })
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
        if !self.in_flight.is_empty() {
            return Err(ForwardError::Busy);
        }
        self.settle_sample();
        let ctx = self.model.ctx.clone();
        let vocab = self.model.cfg.n_vocab;
        // Rows of logits per pass: bounded so the buffer stays small.
        let rows = self.max_batch.min(16);
        let all = View::of(&ctx.storage("all_logits", (rows * vocab * 4) as u64));
        let mut out = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(rows) {
            let ops = self.plan(chunk.len() as u32, &self.s.ids, LogitsFor::All, Some(&all))?;
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
