//! A conversation on the GPU: the KV cache and scratch, allocated once at their largest
//! shapes, and the recorded steps. Prefill runs all prompt positions through batched kernels;
//! decode runs a plan built once per session and keeps the token on the GPU: the embedding
//! reads the token the previous step sampled into `result`, so steps can be queued back to
//! back while the CPU reads earlier tokens back.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::Instrument;

use wgemma_kernels::ops::{self, AttentionArgs, HeadPostArgs, HeadPostKv, SampleKernel};
use wgemma_kernels::{Dispatch, GpuContext, GpuError, Profiler, Recorder, View, wgpu};

use super::lora::{JoinedLora, PreparedLora};
use super::model::{GpuModel, HostExperts, PleRows, PleTable};
use crate::config::TextConfig;
use crate::sampling::{SamplingParams, Strategy};

mod arena;
mod batch;
mod canvas;
mod graph;
mod kv;
mod logprobs;
mod queue;

pub(super) use arena::ArenaSlot;
use arena::{Activations, Arena};
pub use batch::{BatchDecoder, BatchRow, KvPool};
use canvas::CanvasPlan;
pub use canvas::{CanvasBuffers, CanvasWork};
use graph::DecoderGraph;
use kv::KvCache;
use logprobs::LogprobPlan;
pub use logprobs::{MAX_TOP_LOGPROBS, TokenLogprobs};
pub use queue::MAX_IN_FLIGHT;
use queue::{Ledger, Sampled, StepQueue};
pub use wgemma_kernels::graph::Fusions;
use wgemma_kernels::graph::PlanOp;

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
    #[error("the prompt was stopped part way (the cache holds what was read)")]
    Interrupted,
    #[error(
        "the model's output is not a number (NaN or infinite logits): its weights are damaged or do not fit this architecture"
    )]
    NonFiniteLogits,
    #[error("steps are still in flight: read their tokens first")]
    Busy,
    #[error("reading per-layer embedding rows: {0}")]
    Rows(#[from] wgemma_gguf::SourceError),
    #[error(
        "the per-layer embedding rows of token {0} were not fetched: call fetch_rows before feeding it"
    )]
    RowsNotFetched(u32),
    #[error("soft tokens: {0}")]
    SoftTokens(String),
    #[error("trace: {0}")]
    Trace(String),
    #[error(transparent)]
    Lora(#[from] crate::lora::LoraError),
    #[error("log-probabilities were not asked for: call set_logprobs before the step")]
    NoLogprobs,
    #[error("the KV pool's {slots} slots are all in use")]
    PoolFull { slots: usize },
    #[error("batched decode: {0}")]
    Batch(String),
    #[error("cannot take another session's cache prefix: {0}")]
    Prefix(String),
}

/// Watches a prompt of several passes: after each pass but the last has run on the GPU, it
/// is told the tokens read and the total, and may stop there ([`ForwardError::Interrupted`];
/// the cache keeps the passes done).
pub type PrefillWatch = Box<dyn FnMut(usize, usize) -> std::ops::ControlFlow<()> + Send + Sync>;

/// Soft tokens: rows of the model's width (f32, in a buffer of the session's GPU context)
/// that take the place of the token embeddings at `rows.size / (4 * n_embd)` positions,
/// starting `at` tokens into what is fed (whose ids there are placeholders, such as the
/// image token). An encoder's output as it is: not scaled by `sqrt(n_embd)` as token
/// embeddings are; per-layer embeddings read the padding token's row at those positions.
#[derive(Clone, Debug)]
pub struct SoftTokens {
    pub at: usize,
    pub rows: View,
    /// The span is an image's: its tokens see each other where the model attends so
    /// ([`TextConfig::bidirectional_images`]); audio is always causal.
    pub bidirectional: bool,
}

/// A value of a step, as [`GpuSession::trace`] read it: `rows` rows of `cols`.
#[derive(Clone, Debug)]
pub struct Traced {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub values: Vec<f32>,
}

/// The rows of a span that fall into one chunk: `rows` go to the chunk's row `row`.
#[derive(Clone, Debug)]
struct SoftCopy {
    row: u32,
    rows: View,
}

/// Sizes of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Positions the KV cache holds (prompt and generated tokens together).
    pub context: usize,
    /// Prompt tokens per prefill pass; longer prompts run in several passes. Each pass pays
    /// every layer's dispatches once, so larger is faster, at the price of activations scratch
    /// that grows with it.
    pub max_batch: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            context: 4096,
            max_batch: 512,
        }
    }
}

/// What a step's rows start from: token ids (`ids`, staged), and soft tokens' rows copied over
/// some of their embeddings.
#[derive(Clone, Copy)]
struct StepInput<'a> {
    ids: &'a View,
    soft: &'a [SoftCopy],
    /// Which keys the rows see.
    reach: KeyReach,
}

/// Which keys a step's rows see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyReach {
    /// Themselves and the rows before, within the window on sliding layers.
    Causal,
    /// On sliding layers, also ahead to the staged last key (bidirectional spans: an image).
    Spans,
    /// DiffusionGemma's canvas: every layer up to the staged last key (the whole canvas), and
    /// sliding layers from the staged first key (a fixed stretch of the prompt).
    Canvas,
    /// DiffusionGemma's prompt with images: every layer up to the staged last key, and
    /// sliding layers from the staged first key (an image's rows see the whole image).
    Blocks,
}

impl<'a> StepInput<'a> {
    fn ids(ids: &'a View) -> Self {
        Self {
            ids,
            soft: &[],
            reach: KeyReach::Causal,
        }
    }
}

/// One recorded operation of a step: a dispatch, a copy, or one of the session's own.
type Op = PlanOp<HostOp>;

/// The session's own steps within a plan.
#[derive(Clone, Debug)]
enum HostOp {
    /// A streamed layer's experts into the weights expert layers share: what is recorded
    /// before is submitted first. With `routed` (the router's choice and its slots), natively
    /// only the chosen experts, read back once that is done.
    Upload {
        host: Arc<HostExperts>,
        routed: Option<(View, u32)>,
    },
    /// Where a step starts to read the per-layer table rows of its tokens: a decode step
    /// whose token is still on its way to the CPU submits what comes before right away.
    TokenRows,
}

/// A session's own buffers besides the KV cache: one row's activations for its decode steps,
/// and what outlives a step (the logits, the sampled token, the penalty ring).
struct Scratch {
    /// The decode step's activations (batched steps use the model's [`Arena`]).
    own: Activations,
    /// The other home of a decode step's stream: a product fused with the residual step reads
    /// the stream from one and writes the update to the other.
    x_alt: View,
    attn_part: View,
    /// One token's activations rounded to 8-bit integers for the down product
    /// (`ops::MatvecOut::GegluInt8`).
    act_q: View,
    last_n: View,
    logits: View,
    argmax_scratch: View,
    result: View,
    topk_scratch: View,
    topk_out: View,
    ring: View,
}

impl Scratch {
    fn bytes(&self) -> u64 {
        let own: u64 = [
            &self.x_alt,
            &self.attn_part,
            &self.act_q,
            &self.last_n,
            &self.logits,
            &self.argmax_scratch,
            &self.result,
            &self.topk_scratch,
            &self.topk_out,
            &self.ring,
        ]
        .iter()
        .map(|v| v.size)
        .sum();
        own + self.own.bytes()
    }
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

/// A conversation's state on the GPU: KV cache, scratch, and the prepared decode step.
pub struct GpuSession {
    model: Arc<GpuModel>,
    capacity: usize,
    max_batch: usize,
    /// Rows of each sequence's slot when the cache holds several ([`BatchDecoder`]); 0: one.
    slot_rows: usize,
    kv: KvCache,
    s: Scratch,
    /// Batched steps' activations, shared with the model's other sessions.
    arena: Arc<Arena>,
    decode: Vec<Op>,
    sampler: Option<SamplerPlan>,
    /// The tokens in the cache and the newest sampled one, as the CPU knows them.
    ledger: Ledger,
    /// The steps queued on the GPU whose tokens are on their way back.
    queue: StepQueue,
    /// Whether `logits` holds the last fed position's logits.
    has_logits: bool,
    /// Told of each finished pass of a long prompt ([`GpuSession::watch_prefill`]).
    watch: Option<PrefillWatch>,
    /// Per-layer embedding rows fetched ahead of the steps that feed their tokens (models
    /// whose rows come from an asynchronous source).
    fetched: HashMap<u32, Vec<u8>>,
    /// Bytes of streamed experts copied to the GPU so far.
    streamed: AtomicU64,
    /// Natively, for models that stream their experts: where a short step's router choice
    /// (fewer slots than experts) is copied to be read back.
    router_readback: Option<wgpu::Buffer>,
    /// The fusions the steps use.
    fusions: Fusions,
    /// The adapters the steps apply, each with its scale (none of scale 0).
    adapters: Vec<(Arc<PreparedLora>, f32)>,
    /// Those adapters joined per product, and room for their deltas.
    lora: Option<LoraBuffers>,
    /// The log-probabilities each step records, when asked for.
    logprobs: Option<LogprobPlan>,
    /// DiffusionGemma's canvas step, once prepared.
    canvas: Option<CanvasPlan>,
}

/// A session's adapters joined, and its buffers for their deltas
/// (`wgemma_kernels::graph::LoraScratch`).
pub(super) struct LoraBuffers {
    pub(super) joined: JoinedLora,
    pub(super) t: View,
    pub(super) raw: View,
}

fn dispatch_line(d: &Dispatch) -> String {
    let [x, y, z] = d.workgroups;
    format!("{} {x}x{y}x{z}", d.kernel)
}

fn op_line(op: &Op) -> String {
    match op {
        Op::Run(d) => dispatch_line(d),
        Op::Copy { bytes, .. } => format!("copy {bytes} bytes"),
        Op::Host(HostOp::Upload { routed, .. }) => {
            let routed = routed.as_ref().map_or(0, |(_, slots)| *slots);
            format!("upload experts, {routed} routed slots")
        }
        Op::Host(HostOp::TokenRows) => "per-layer table rows".into(),
    }
}

/// Floats of the split attention's scratch: one token over the whole cache or, for a cache
/// of `slot_rows`-row slots, up to `batch` tokens over their slots.
fn attn_part_floats(cfg: &TextConfig, capacity: usize, slot_rows: usize, batch: usize) -> u64 {
    let max_hd = cfg.layers.iter().map(|l| l.head_dim).max().unwrap_or(0) as u32;
    let n_head = cfg.n_head as u32;
    if slot_rows > 0 {
        ops::DecodeAttention::scratch_floats_for(n_head, max_hd, slot_rows as u32, batch as u32)
    } else {
        ops::DecodeAttention::scratch_floats(n_head, max_hd, capacity as u32)
    }
}

/// [`attn_part_floats`], and on a device with cooperative matrices room for a step of
/// `batch` tokens' attention split over its keys (`ops::attention_in_parts`).
fn attn_scratch_floats(
    ctx: &GpuContext,
    cfg: &TextConfig,
    capacity: usize,
    slot_rows: usize,
    batch: usize,
) -> u64 {
    let decode = attn_part_floats(cfg, capacity, slot_rows, batch);
    if !ctx.features.coop_matmul || slot_rows > 0 {
        return decode;
    }
    let max_hd = cfg.layers.iter().map(|l| l.head_dim).max().unwrap_or(0) as u32;
    decode.max(ops::attention_parts_floats(
        batch as u32,
        cfg.n_head as u32,
        max_hd,
    ))
}

/// Fetched rows kept for later steps; past this, a new fetch starts from an empty store.
const FETCHED_ROWS_KEPT: usize = 1024;

impl GpuSession {
    /// Allocates the KV cache and scratch and prepares the decode step.
    pub fn new(model: Arc<GpuModel>, opts: SessionOptions) -> Result<Self, ForwardError> {
        let _span = tracing::info_span!("session_new", context = opts.context).entered();
        let capacity = opts.context.clamp(1, model.cfg.context_length.max(1));
        let kv = KvCache::new(&model.ctx, &model.cfg, capacity);
        Self::with_cache(model, opts.max_batch, kv, 0)
    }

    /// A session whose KV cache is a slot of `pool` (its context is at most the pool's slot),
    /// so that [`BatchDecoder`] can run its decode steps together with the pool's other
    /// sessions'. The slot is free again when the session is dropped.
    pub fn in_pool(
        model: Arc<GpuModel>,
        opts: SessionOptions,
        pool: &Arc<KvPool>,
    ) -> Result<Self, ForwardError> {
        let _span =
            tracing::info_span!("session_new", context = opts.context, pooled = true).entered();
        if !Arc::ptr_eq(&model, pool.model()) {
            return Err(ForwardError::Batch(
                "the pool holds another model's caches".into(),
            ));
        }
        let slot = pool.take().ok_or(ForwardError::PoolFull {
            slots: pool.slots(),
        })?;
        let kv = KvCache::in_slot(slot, opts.context)?;
        Self::with_cache(model, opts.max_batch, kv, 0)
    }

    /// A session over `kv` (its capacity is the session's) whose steps are at most
    /// `max_batch` tokens. With `slot_rows` > 0 the cache holds several sequences of that
    /// many rows each (a [`BatchDecoder`]'s), and the one-token decode step is not prepared.
    fn with_cache(
        model: Arc<GpuModel>,
        max_batch: usize,
        kv: KvCache,
        slot_rows: usize,
    ) -> Result<Self, ForwardError> {
        let ctx = &model.ctx;
        let cfg = &model.cfg;
        let capacity = kv.capacity();
        let b = max_batch.clamp(1, capacity);
        let buf = |name: &str, floats: u64| View::of(&ctx.storage(name, floats * 4));
        let d = cfg.n_embd as u64;
        let max_ff = cfg.layers.iter().map(|l| l.n_ff).max().unwrap_or(0) as u32;
        let vocab = cfg.n_vocab as u64;
        let s = Scratch {
            own: Activations::new(&model, 1),
            x_alt: buf("x_alt", d),
            attn_part: buf(
                "attn_part",
                attn_scratch_floats(ctx, cfg, capacity, slot_rows, b),
            ),
            act_q: buf("act_q", ops::int8_vector_words(max_ff)),
            last_n: buf("last_n", d),
            logits: buf("logits", vocab),
            argmax_scratch: buf("argmax_scratch", ops::Argmax::scratch_words(vocab as u32)),
            result: buf("result", 2),
            topk_scratch: buf(
                "topk_scratch",
                ops::TopK::scratch_words(vocab as u32, ops::TOPK_MAX),
            ),
            topk_out: buf("topk_out", 2 * u64::from(ops::TOPK_MAX)),
            ring: buf("ring", 1 + u64::from(ops::RING_CAP)),
        };
        let arena = Arena::for_model(&model, b);

        let router_readback =
            (model.streams_experts() && cfg!(not(target_arch = "wasm32"))).then(|| {
                let n_expert = cfg.moe.map_or(1, |mc| mc.n_expert) as u64;
                ctx.readback_buffer("router readback", n_expert * 4)
            });
        let mut session = Self {
            model: model.clone(),
            capacity,
            max_batch: b,
            slot_rows,
            kv,
            s,
            arena,
            decode: Vec::new(),
            sampler: None,
            ledger: Ledger::new(),
            queue: StepQueue::new(ctx),
            has_logits: false,
            watch: None,
            fetched: HashMap::new(),
            streamed: AtomicU64::new(0),
            router_readback,
            fusions: Fusions::ALL.with_env(),
            adapters: Vec::new(),
            lora: None,
            logprobs: None,
            canvas: None,
        };
        if slot_rows == 0 {
            session.decode =
                session.plan(1, StepInput::ids(&session.s.result), LogitsFor::Last, None)?;
        }
        ctx.check()?;
        Ok(session)
    }

    /// Chooses the fusions the steps use (all by default; fewer for testing the fused kernels
    /// against the ops they replace). Steps in flight must have been read first.
    pub fn set_fusions(&mut self, fusions: Fusions) -> Result<(), ForwardError> {
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        self.fusions = fusions;
        self.decode = self.plan(1, StepInput::ids(&self.s.result), LogitsFor::Last, None)?;
        self.model.ctx.check()?;
        Ok(())
    }

    /// Applies `adapters` (each uploaded for this session's model, with its scale) to the
    /// steps from now on, in place of the ones before: the base model stays loaded, and no
    /// adapter at all is the base model. An adapter of scale 0 is left out, so it gives the
    /// base model's logits exactly. Positions already in the cache keep what the adapters
    /// before computed (rewind to recompute them).
    pub fn set_adapters(
        &mut self,
        adapters: &[(Arc<PreparedLora>, f32)],
    ) -> Result<(), ForwardError> {
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        if !adapters.iter().all(|(a, _)| a.fits(&self.model)) {
            return Err(crate::lora::LoraError::OtherModel.into());
        }
        let kept: Vec<(Arc<PreparedLora>, f32)> = adapters
            .iter()
            .filter(|(_, s)| *s != 0.0)
            .cloned()
            .collect();
        let ctx = &self.model.ctx;
        let floats = |n: u32| u64::from(n).max(1) * self.max_batch as u64 * 4;
        self.lora = JoinedLora::join(&self.model, &kept)?.map(|joined| LoraBuffers {
            t: View::of(&ctx.storage("lora t", floats(joined.t_floats))),
            raw: View::of(&ctx.storage("lora raw", floats(joined.gated_rows))),
            joined,
        });
        self.adapters = kept;
        self.decode = self.plan(1, StepInput::ids(&self.s.result), LogitsFor::Last, None)?;
        self.model.ctx.check()?;
        Ok(())
    }

    /// Positions in the cache.
    pub fn position(&self) -> usize {
        self.ledger.position()
    }

    /// Whether the newest sampled token is still on the GPU: a step queued for this session
    /// (its own, or a batched one) samples it.
    pub fn token_on_gpu(&self) -> bool {
        self.ledger.sampled() == Sampled::OnGpu
    }

    /// The tokens in the cache whose ids are known, in order (all of them once no step is in
    /// flight).
    pub fn tokens(&self) -> &[u32] {
        self.ledger.tokens()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Steps queued whose tokens are not read back yet.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Bytes this session holds on the GPU: its KV cache and scratch (weights are the
    /// model's, and so is the arena of batched steps' activations, [`GpuSession::arena_bytes`]).
    pub fn gpu_bytes(&self) -> u64 {
        let lora = self
            .lora
            .as_ref()
            .map_or(0, |l| l.t.size + l.raw.size + l.joined.bytes());
        self.s.bytes() + self.kv.bytes() + lora
    }

    /// Bytes of the batched steps' activations, which the model's sessions share.
    pub fn arena_bytes(&self) -> u64 {
        self.arena.acts.bytes()
    }

    /// Whether this session and `other` share their batched steps' activations: sessions of
    /// one model do, unless one asked for a larger batch than the other's arena holds.
    pub fn shares_arena(&self, other: &GpuSession) -> bool {
        Arc::ptr_eq(&self.arena, &other.arena)
    }

    /// The activations of a step over `m` tokens: the session's own for one, the shared
    /// arena's for more (whose lease the caller holds while it records and submits the step).
    fn acts(&self, m: usize) -> &Activations {
        if m <= self.s.own.rows {
            &self.s.own
        } else {
            &self.arena.acts
        }
    }

    /// Takes the first `len` positions of `from`'s cache as its own, so that a prompt that
    /// starts like `from`'s conversation reads only the rest: `from` is another session of
    /// the same [`KvPool`] whose cache holds those positions, their keys and values are
    /// copied on the GPU into this session's slot (queued after everything submitted so
    /// far), and this session then holds `from`'s first `len` tokens. `from` may be
    /// generating (its steps write only past its known tokens); this session must have no
    /// step in flight, and both must apply the same adapters.
    pub fn adopt_prefix(&mut self, from: &GpuSession, len: usize) -> Result<(), ForwardError> {
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        let refuse = |why: &str| Err(ForwardError::Prefix(why.into()));
        let pooled = match (self.kv.slot(), from.kv.slot()) {
            (Some(a), Some(b)) => Arc::ptr_eq(a.pool(), b.pool()) && a.index() != b.index(),
            _ => false,
        };
        if !pooled {
            return refuse("the sessions are not two slots of one pool");
        }
        if len > from.tokens().len() || len > self.capacity {
            return refuse("it holds fewer positions than asked for, or this one has no room");
        }
        let same = |a: &(Arc<PreparedLora>, f32), b: &(Arc<PreparedLora>, f32)| {
            Arc::ptr_eq(&a.0, &b.0) && a.1 == b.1
        };
        if self.adapters.len() != from.adapters.len()
            || !self
                .adapters
                .iter()
                .zip(&from.adapters)
                .all(|(a, b)| same(a, b))
        {
            return refuse("the sessions apply different adapters");
        }
        let ds = self.kv.copy_rows_from(&self.model.ctx, &from.kv, len)?;
        let mut rec = Recorder::new(&self.model.ctx, "adopt_prefix");
        for d in &ds {
            rec.run(d);
        }
        rec.submit();
        self.ledger.rewind(0);
        self.ledger.feed(&from.tokens()[..len]);
        self.has_logits = false;
        Ok(())
    }

    /// Forgets everything after the first `pos` tokens (their cache slots are overwritten
    /// when new tokens arrive and are never read before then). Steps in flight must have been
    /// read first.
    pub fn rewind(&mut self, pos: usize) -> Result<(), ForwardError> {
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        self.ledger.rewind(pos);
        self.has_logits = false;
        Ok(())
    }

    fn head_post_args<'a>(&'a self, il: usize, m: u32) -> HeadPostArgs<'a> {
        let (cfg, l) = (&self.model.cfg, &self.model.layers[il]);
        let lc = &cfg.layers[il];
        let kv = match (&l.k_norm, self.kv.written_by(il)) {
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
        let a = self.acts(m as usize);
        HeadPostArgs {
            qkv: &a.qkv,
            q_norm: &l.q_norm,
            kv,
            positions: &a.positions,
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
            slot_rows: self.slot_rows as u32,
        }
    }

    fn attention_args<'a>(
        &'a self,
        il: usize,
        m: u32,
        reach: KeyReach,
    ) -> Result<AttentionArgs<'a>, GpuError> {
        let cfg = &self.model.cfg;
        let lc = &cfg.layers[il];
        let (kc, vc) = self.kv.read_by(cfg, il)?;
        let a = self.acts(m as usize);
        Ok(AttentionArgs {
            q: &a.qkv,
            k_cache: kc,
            v_cache: vc,
            positions: &a.positions,
            out: &a.attn,
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
            last_key: match reach {
                KeyReach::Causal => None,
                KeyReach::Spans => lc.sliding.then_some(&a.last_key),
                KeyReach::Canvas | KeyReach::Blocks => Some(&a.last_key),
            },
            first_key: (matches!(reach, KeyReach::Canvas | KeyReach::Blocks) && lc.sliding)
                .then_some(&a.first_key),
            slot_rows: self.slot_rows as u32,
        })
    }

    /// The ops of one step over `m` tokens whose ids are in `ids`. One token takes the
    /// matrix-vector and split-attention kernels (the decode step); more take the batched
    /// ones. Between the blocks of each layer a single pass does the residual add and the next
    /// block's norm. `all_logits` receives every row's logits when `logits` is
    /// [`LogitsFor::All`]. Their parameter blocks share a few uniform buffers
    /// ([`wgemma_kernels::GpuContext::with_params_batch`]).
    fn plan<'a>(
        &'a self,
        m: u32,
        input: StepInput<'a>,
        logits: LogitsFor,
        all_logits: Option<&'a View>,
    ) -> Result<Vec<Op>, GpuError> {
        let fusions = Fusions {
            few_token_products: false,
            ..self.fusions
        };
        self.plan_fused(m, input, logits, all_logits, fusions)
    }

    /// [`GpuSession::plan`] under `fusions` (a batched decode step's, whose rows are
    /// sequences: [`Fusions::few_token_products`]).
    fn plan_fused<'a>(
        &'a self,
        m: u32,
        input: StepInput<'a>,
        logits: LogitsFor,
        all_logits: Option<&'a View>,
        fusions: Fusions,
    ) -> Result<Vec<Op>, GpuError> {
        let ctx = &*self.model.ctx;
        ctx.with_params_batch(|| {
            let g = DecoderGraph::step(self, m, input, logits, all_logits)?;
            DecoderGraph::lower(self, &g, fusions, Vec::new())
        })
    }

    /// Feeds `tokens` as [`GpuSession::feed`] does, in one step (at most the session's batch),
    /// and returns the step's values named in `names` (`blk.N.attn_out`, `blk.N.ffn_out`,
    /// `blk.N.out`, `result_norm`, ...: the names of the decoder's graph), as the step wrote
    /// them. A value that a fusion takes into a kernel is never written: trace under
    /// [`Fusions::NONE`] to see them all.
    pub async fn trace(
        &mut self,
        tokens: &[u32],
        names: &[&str],
    ) -> Result<Vec<Traced>, ForwardError> {
        self.check_tokens(tokens)?;
        if tokens.len() > self.max_batch {
            return Err(ForwardError::Trace(format!(
                "{} tokens in one step (the batch is {})",
                tokens.len(),
                self.max_batch
            )));
        }
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        let ctx = self.model.ctx.clone();
        let m = tokens.len() as u32;
        let (ops, taps) = ctx.with_params_batch(|| -> Result<_, ForwardError> {
            let input = StepInput::ids(&self.acts(tokens.len()).ids);
            let g = DecoderGraph::step(self, m, input, LogitsFor::Last, None)?;
            let mut taps = Vec::new();
            for name in names {
                let v = g
                    .find(name)
                    .ok_or_else(|| ForwardError::Trace(format!("no value named {name}")))?;
                let value = g.get(v);
                let floats = u64::from(value.rows.max(1) - 1) * u64::from(value.stride())
                    + u64::from(value.cols);
                let to = View::of(&ctx.storage("trace", floats * 4));
                let shape = (
                    value.rows as usize,
                    value.cols as usize,
                    value.stride() as usize,
                );
                taps.push((v, to, shape));
            }
            let tap_views = taps.iter().map(|(v, to, _)| (*v, to.clone())).collect();
            Ok((
                DecoderGraph::lower(self, &g, self.fusions, tap_views)?,
                taps,
            ))
        })?;
        let arena = self.arena.clone();
        let lease = arena.lease().await;
        self.stage(tokens, tokens)?;
        let mut rec = Recorder::new(&ctx, "trace");
        self.record(&mut rec, &ops).await?;
        rec.submit();
        drop(lease);
        self.ledger.feed(tokens);
        self.write_ring();
        self.has_logits = true;
        let mut out = Vec::new();
        for ((_, to, (rows, cols, stride)), name) in taps.iter().zip(names) {
            let raw = ctx.read_f32(to).await?;
            let (rows, cols, stride) = (*rows, *cols, *stride);
            let values = (0..rows)
                .flat_map(|r| raw[r * stride..r * stride + cols].iter().copied())
                .collect();
            out.push(Traced {
                name: name.to_string(),
                rows,
                cols,
                values,
            });
        }
        Ok(out)
    }

    /// The dispatch sequence of a step over `tokens` positions, one line an op (the kernel
    /// variant and its workgroups, or the copy, upload or row staging between them): 1 is
    /// the decode step the session keeps, more a prefill chunk that leaves the last
    /// position's logits. Then the sampling dispatches, greedy and top-64. Nothing runs. The
    /// tests pin these sequences per model and device class (`tests/plans.rs`).
    pub fn plan_lines(&self, tokens: usize) -> Result<Vec<String>, ForwardError> {
        let (step, samplers) = self.step_and_samplers(tokens)?;
        let lines = step.iter().map(op_line);
        Ok(lines.chain(samplers.iter().map(dispatch_line)).collect())
    }

    /// Compiles the pipelines a request's steps use, so that the first request does not
    /// wait for them: a full prefill chunk's (whose tiled kernels serve any chunk of 5
    /// tokens or more), the decode step's (already built) and the samplers'.
    /// Chunks of 2 to 4 tokens take matrix-vector kernels shaped by their count, compiled
    /// when first needed: in Dawn each pipeline takes tens of milliseconds. Nothing runs.
    /// Where pipeline creation is asynchronous (a browser's GPU process compiles them), this
    /// only starts the work.
    pub fn compile_pipelines(&self) -> Result<(), ForwardError> {
        let _span = tracing::info_span!("compile_pipelines").entered();
        self.step_and_samplers(self.max_batch)?;
        Ok(())
    }

    /// The dispatches of [`GpuSession::plan_lines`]'s step and samplers.
    pub fn plan_dispatches(&self, tokens: usize) -> Result<Vec<Dispatch>, ForwardError> {
        let (step, samplers) = self.step_and_samplers(tokens)?;
        let runs = step.into_iter().filter_map(|op| match op {
            Op::Run(d) => Some(d),
            _ => None,
        });
        Ok(runs.chain(samplers).collect())
    }

    fn step_and_samplers(&self, tokens: usize) -> Result<(Vec<Op>, Vec<Dispatch>), ForwardError> {
        let m = u32::try_from(tokens.clamp(1, self.max_batch)).unwrap_or(1);
        let step = if m == 1 {
            self.decode.clone()
        } else {
            let ids = &self.acts(m as usize).ids;
            self.plan(m, StepInput::ids(ids), LogitsFor::Last, None)?
        };
        let mut samplers = Vec::new();
        for strategy in [Strategy::Greedy, Strategy::TopK(64)] {
            let sp = self.sampler_plan(strategy, true)?;
            samplers.extend([sp.ring_push, sp.penalty]);
            samplers.extend(sp.argmax.into_iter().flat_map(|a| [a.partial, a.finish]));
            samplers.extend(sp.top_k.into_iter().flat_map(|t| [t.partial, t.finish]));
            samplers.extend(sp.draw);
        }
        Ok((step, samplers))
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

    /// Writes the ids and positions of a chunk that starts at the current position, and the
    /// per-layer table rows of `ple_ids` (the chunk's ids, the padding token at soft tokens).
    /// With the table on the GPU, which the step gathers by the ids it embeds, those are
    /// `ple_ids`: a soft token replaces the padding id's token embedding anyway, and the
    /// table gives the padding id's row there, as the reference does.
    fn stage(&self, chunk: &[u32], ple_ids: &[u32]) -> Result<(), ForwardError> {
        let ctx = &self.model.ctx;
        self.stage_ple_rows(ple_ids)?;
        let start = self.position() as u32;
        let positions: Vec<u32> = (start..start + chunk.len() as u32).collect();
        let a = self.acts(chunk.len());
        let table_on_gpu = self.model.ple.as_ref().is_some_and(|p| p.gpu.is_some());
        let ids = if table_on_gpu && ple_ids.len() == chunk.len() {
            ple_ids
        } else {
            chunk
        };
        ctx.write(&a.ids.buffer, a.ids.offset, bytemuck::cast_slice(ids));
        ctx.write(
            &a.positions.buffer,
            a.positions.offset,
            bytemuck::cast_slice(&positions),
        );
        Ok(())
    }

    /// Copies the per-layer table rows of `tokens` to the GPU (models with per-layer
    /// embeddings whose table stays off the GPU): a row per token from the file.
    fn stage_ple_rows(&self, tokens: &[u32]) -> Result<(), ForwardError> {
        let Some(ple) = &self.model.ple else {
            return Ok(());
        };
        let mut rows = Vec::with_capacity(tokens.len() * ple.info.row_bytes() as usize);
        for &t in tokens {
            match &ple.rows {
                PleRows::Mapped(src) => {
                    let (offset, len) = ple.row_range(t);
                    rows.extend_from_slice(src.bytes(offset, len)?);
                }
                PleRows::Fetched(_) => {
                    rows.extend_from_slice(
                        self.fetched
                            .get(&t)
                            .ok_or(ForwardError::RowsNotFetched(t))?,
                    );
                }
                // The step gathers the rows from the table on the GPU.
                PleRows::Gpu => return Ok(()),
            }
        }
        let staged = &self.acts(tokens.len()).ple.rows;
        self.model.ctx.write(&staged.buffer, 0, &rows);
        Ok(())
    }

    /// Reads the per-layer embedding rows of `tokens` ahead of the steps that feed them, when
    /// they come from an asynchronous source (the browser); a no-op otherwise. Generation
    /// ([`GpuSession::next_token`], [`GpuSession::feed_and_sample`], [`GpuSession::score`])
    /// fetches by itself; call it before [`GpuSession::begin`] and [`GpuSession::feed`].
    pub async fn fetch_rows(&mut self, tokens: &[u32]) -> Result<(), ForwardError> {
        let model = self.model.clone();
        let Some(
            ple @ PleTable {
                rows: PleRows::Fetched(src),
                ..
            },
        ) = &model.ple
        else {
            return Ok(());
        };
        if self.fetched.len() > FETCHED_ROWS_KEPT {
            self.fetched.clear();
        }
        let mut want: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|t| !self.fetched.contains_key(t))
            .collect();
        want.sort_unstable();
        want.dedup();
        // Bad ids fail later with a clear error, not as an out-of-range read here.
        want.retain(|&t| (t as usize) < model.cfg.n_vocab);
        let ranges: Vec<(u64, u64)> = want.iter().map(|&t| ple.row_range(t)).collect();
        let rows = src.fetch(&ranges).await?;
        self.fetched.extend(want.into_iter().zip(rows));
        Ok(())
    }

    /// Whether a decode step needs its input token on the CPU (per-layer embeddings read the
    /// token's table row from the file), so steps cannot run ahead of the readback.
    fn needs_token_on_cpu(&self) -> bool {
        self.model.ple.as_ref().is_some_and(|p| p.gpu.is_none())
    }

    /// Bytes of streamed experts ([`crate::ExpertPlacement::Streamed`]) copied to the GPU
    /// since the session began: every expert layer's experts for long steps, the chosen ones
    /// for short steps.
    pub fn experts_streamed_bytes(&self) -> u64 {
        self.streamed.load(Ordering::Relaxed)
    }

    /// How many decode steps may be queued ahead of the readback: [`MAX_IN_FLIGHT`], or for
    /// models whose step needs the previous token on the CPU, 2: one running and the next
    /// recorded, submitted as soon as its token is read (the CPU's recording overlaps the GPU).
    pub fn pipeline_depth(&self) -> usize {
        if self.logprobs.is_some() {
            // Each step's log-probabilities are read before the next step writes its own.
            1
        } else if self.needs_token_on_cpu() {
            2
        } else {
            MAX_IN_FLIGHT
        }
    }

    async fn record(&self, rec: &mut Recorder<'_>, ops: &[Op]) -> Result<(), ForwardError> {
        for op in ops {
            match op {
                Op::Run(d) => rec.run(d),
                Op::Copy { from, to, bytes } => rec.copy(from, to, *bytes),
                Op::Host(HostOp::Upload { host, routed }) => {
                    // The router's choice goes to the session's staging buffer with the rest
                    // of the step so far (the browser, which cannot wait for the GPU mid-step,
                    // has none and copies every expert).
                    let staged = match (routed, &self.router_readback) {
                        (Some((sel, slots)), Some(staging)) => {
                            let size = u64::from(*slots) * 4;
                            rec.copy(&sel.slice(0, size)?, &View::of(staging), size);
                            Some((staging, size))
                        }
                        _ => None,
                    };
                    rec.flush();
                    let ctx = rec.ctx();
                    let n_expert = self.model.cfg.moe.map_or(0, |mc| mc.n_expert as u32);
                    let bytes = match staged {
                        Some((staging, size)) => {
                            let raw = ctx.map_and_copy(staging, size).await?;
                            let chosen: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
                            host.write_chosen(ctx, n_expert, &chosen)
                        }
                        None => host.write(ctx),
                    };
                    self.streamed.fetch_add(bytes, Ordering::Relaxed);
                }
                Op::Host(HostOp::TokenRows) => {}
            }
        }
        Ok(())
    }

    /// Records a chunk's ops, submitting what is recorded after 32, 64, 128... of them, so that
    /// the GPU runs the first layers while the CPU records the rest (recording a 512-token
    /// chunk takes milliseconds).
    async fn record_submitting_early(
        &self,
        rec: &mut Recorder<'_>,
        ops: &[Op],
    ) -> Result<(), ForwardError> {
        let mut done = 0;
        let mut next = 32;
        while done < ops.len() {
            let end = next.min(ops.len());
            self.record(rec, &ops[done..end]).await?;
            if end < ops.len() {
                rec.flush();
            }
            done = end;
            next *= 2;
        }
        Ok(())
    }

    /// Records `tokens` (with `soft` tokens over some of them) through the model, leaving the
    /// last one's logits; chunks before the last are submitted on their own (ids and positions
    /// are rewritten between them).
    async fn feed_into(
        &mut self,
        rec: &mut Recorder<'_>,
        tokens: &[u32],
        soft: &[SoftTokens],
    ) -> Result<(), ForwardError> {
        self.check_tokens(tokens)?;
        self.check_soft(tokens.len(), soft)?;
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        let (start, spans) = (self.position(), self.bidirectional_spans(soft));
        let ranges = chunk_ranges(tokens.len(), self.max_batch, &spans)?;
        for (i, range) in ranges.iter().enumerate() {
            let last = i + 1 == ranges.len();
            let (first, chunk) = (range.start, &tokens[range.clone()]);
            let (copies, ple_ids) = self.soft_in_chunk(first, chunk, soft)?;
            if last && chunk.len() == 1 && copies.is_empty() {
                // One token: the fused decode step, which reads its token from `result`.
                let ctx = &self.model.ctx;
                ctx.write(&self.s.result.buffer, 0, bytemuck::bytes_of(&chunk[0]));
                self.stage(chunk, &ple_ids)?;
                self.record(rec, &self.decode).await?;
            } else {
                let logits = if last {
                    LogitsFor::Last
                } else {
                    LogitsFor::None
                };
                let input = StepInput {
                    ids: &self.acts(chunk.len()).ids,
                    soft: &copies,
                    reach: self.stage_span_keys(start, range.clone(), &spans),
                };
                let ops = self.plan(chunk.len() as u32, input, logits, None)?;
                self.stage(chunk, &ple_ids)?;
                if last {
                    self.record_submitting_early(rec, &ops).await?;
                } else {
                    let mut r = Recorder::new(&self.model.ctx, "prefill");
                    self.record_submitting_early(&mut r, &ops).await?;
                    let pass = r.submit();
                    self.ledger.feed(chunk);
                    if self.watch.is_some() {
                        self.watch_pass(pass, range.end, tokens.len()).await?;
                    }
                    continue;
                }
            }
            self.ledger.feed(chunk);
        }
        self.write_ring();
        self.has_logits = true;
        Ok(())
    }

    /// Sets (or with `None` removes) what is told of each pass of a long prompt. Without
    /// one, passes run back to back; with one, each is waited for before the next.
    pub fn watch_prefill(&mut self, watch: Option<PrefillWatch>) {
        self.watch = watch;
    }

    /// Waits for a prompt pass and tells the watch; stops the prompt if it says so.
    async fn watch_pass(
        &mut self,
        pass: wgpu::SubmissionIndex,
        done: usize,
        total: usize,
    ) -> Result<(), ForwardError> {
        self.model
            .ctx
            .done(Some(pass), wgemma_kernels::WaitMode::Sleep)
            .await?;
        let stop = self
            .watch
            .as_mut()
            .is_some_and(|w| w(done, total).is_break());
        if stop {
            self.write_ring();
            self.has_logits = false;
            return Err(ForwardError::Interrupted);
        }
        Ok(())
    }

    /// `(at, rows)` of the spans whose tokens see each other on this model.
    fn bidirectional_spans(&self, soft: &[SoftTokens]) -> Vec<(usize, usize)> {
        if !self.model.cfg.bidirectional_images() {
            return Vec::new();
        }
        let row_bytes = self.model.cfg.n_embd as u64 * 4;
        soft.iter()
            .filter(|s| s.bidirectional)
            .map(|s| (s.at, (s.rows.size / row_bytes) as usize))
            .collect()
    }

    /// Stages each row's last key for the rows `range` of what is fed from position `start`
    /// (the end of its span for a span's rows, else itself) and, where the model's images are
    /// seen whole ([`crate::TextConfig::images_seen_whole`]), its first key on sliding layers
    /// (the earlier of its window's reach and its span's start): how its rows see.
    fn stage_span_keys(
        &self,
        start: usize,
        range: Range<usize>,
        spans: &[(usize, usize)],
    ) -> KeyReach {
        let span_of = |i: usize| spans.iter().find(|&&(at, len)| at <= i && i < at + len);
        let last: Vec<u32> = range
            .clone()
            .map(|i| (start + span_of(i).map_or(i, |&(at, len)| at + len - 1)) as u32)
            .collect();
        let ahead = last
            .iter()
            .zip(range.clone())
            .any(|(&k, i)| k as usize > start + i);
        if !ahead {
            return KeyReach::Causal;
        }
        let a = self.acts(range.len());
        let ctx = &self.model.ctx;
        ctx.write(
            &a.last_key.buffer,
            a.last_key.offset,
            bytemuck::cast_slice(&last),
        );
        if !self.model.cfg.images_seen_whole() {
            return KeyReach::Spans;
        }
        let window = self.model.cfg.sliding_window;
        let first: Vec<u32> = range
            .map(|i| {
                let reach = match window {
                    0 => 0,
                    w => (start + i + 1).saturating_sub(w),
                };
                span_of(i).map_or(reach, |&(at, _)| reach.min(start + at)) as u32
            })
            .collect();
        ctx.write(
            &a.first_key.buffer,
            a.first_key.offset,
            bytemuck::cast_slice(&first),
        );
        KeyReach::Blocks
    }

    /// Errors unless every span of soft tokens holds whole rows of the model's width, lies
    /// inside the `n` tokens fed, and no two overlap.
    fn check_soft(&self, n: usize, soft: &[SoftTokens]) -> Result<(), ForwardError> {
        let row_bytes = self.model.cfg.n_embd as u64 * 4;
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(soft.len());
        for (i, span) in soft.iter().enumerate() {
            let rows = span.rows.size / row_bytes;
            let end = span.at.checked_add(rows as usize);
            if rows == 0 || span.rows.size % row_bytes != 0 || end.is_none_or(|e| e > n) {
                return Err(ForwardError::SoftTokens(format!(
                    "span {i}: {} bytes at token {} of {n}: whole rows of {row_bytes} bytes inside what is fed",
                    span.rows.size, span.at
                )));
            }
            spans.push((span.at, rows as usize));
        }
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(ForwardError::SoftTokens("two spans overlap".into()));
        }
        Ok(())
    }

    /// The soft tokens' rows that fall into the chunk of `chunk` tokens from token `first`,
    /// and the ids whose per-layer rows the chunk reads (the padding token at soft tokens).
    fn soft_in_chunk(
        &self,
        first: usize,
        chunk: &[u32],
        soft: &[SoftTokens],
    ) -> Result<(Vec<SoftCopy>, Vec<u32>), ForwardError> {
        let row_bytes = self.model.cfg.n_embd as u64 * 4;
        let mut ple_ids = chunk.to_vec();
        let mut copies = Vec::new();
        let end = first + chunk.len();
        for span in soft {
            let span_end = span.at + (span.rows.size / row_bytes) as usize;
            let (lo, hi) = (span.at.max(first), span_end.min(end));
            if lo >= hi {
                continue;
            }
            let rows = span.rows.slice(
                (lo - span.at) as u64 * row_bytes,
                (hi - lo) as u64 * row_bytes,
            )?;
            copies.push(SoftCopy {
                row: (lo - first) as u32,
                rows,
            });
            ple_ids[lo - first..hi - first].fill(self.model.cfg.pad_id);
        }
        Ok((copies, ple_ids))
    }

    /// The recent-token ring the penalties read: the last tokens of the history.
    fn write_ring(&self) {
        let cap = ops::RING_CAP as usize;
        let history = self.ledger.tokens();
        let recent = &history[history.len().saturating_sub(cap)..];
        let mut ring = vec![0u32; 1 + cap];
        ring[0] = recent.len() as u32;
        ring[1..1 + recent.len()].copy_from_slice(recent);
        self.model
            .ctx
            .write(&self.s.ring.buffer, 0, bytemuck::cast_slice(&ring));
    }

    /// Feeds `tokens` (prompt or generated) and leaves the last one's logits on the GPU.
    pub async fn feed(&mut self, tokens: &[u32]) -> Result<(), ForwardError> {
        self.feed_recorded(tokens, &[], None).await
    }

    /// [`GpuSession::feed`] with soft tokens in place of some tokens' embeddings (an image's or
    /// a clip's encoding). With per-layer embeddings read from an asynchronous source, fetch the
    /// padding token's rows first ([`GpuSession::fetch_rows`]).
    pub async fn feed_with(
        &mut self,
        tokens: &[u32],
        soft: &[SoftTokens],
    ) -> Result<(), ForwardError> {
        self.feed_recorded(tokens, soft, None).await
    }

    /// [`GpuSession::feed_with`], timing each dispatch of the last chunk with `profiler`.
    pub async fn feed_profiled(
        &mut self,
        tokens: &[u32],
        soft: &[SoftTokens],
        profiler: Option<&mut Profiler>,
    ) -> Result<(), ForwardError> {
        self.feed_recorded(tokens, soft, profiler).await
    }

    async fn feed_recorded(
        &mut self,
        tokens: &[u32],
        soft: &[SoftTokens],
        profiler: Option<&mut Profiler>,
    ) -> Result<(), ForwardError> {
        let span = tracing::debug_span!("feed", tokens = tokens.len(), spans = soft.len());
        let ctx = self.model.ctx.clone();
        let fed = async {
            let mut rec = match profiler {
                Some(p) => Recorder::profiled(&ctx, "feed", p),
                None => Recorder::new(&ctx, "feed"),
            };
            let arena = self.arena.clone();
            let _lease = arena.lease().await;
            let r = self.feed_into(&mut rec, tokens, soft).await;
            rec.submit();
            r
        };
        fed.instrument(span).await?;
        ctx.check()?;
        Ok(())
    }

    /// Starts generation: feeds `tokens` and queues the sampling of the next token.
    pub async fn begin(
        &mut self,
        tokens: &[u32],
        p: &SamplingParams,
        step: u32,
    ) -> Result<(), ForwardError> {
        self.begin_with(tokens, &[], p, step).await
    }

    /// [`GpuSession::begin`] with soft tokens in place of some tokens' embeddings (see
    /// [`GpuSession::feed_with`]).
    pub async fn begin_with(
        &mut self,
        tokens: &[u32],
        soft: &[SoftTokens],
        p: &SamplingParams,
        step: u32,
    ) -> Result<(), ForwardError> {
        let span = tracing::info_span!("prefill", tokens = tokens.len(), spans = soft.len());
        let ctx = self.model.ctx.clone();
        let begun = async {
            let mut rec = Recorder::new(&ctx, "begin");
            let arena = self.arena.clone();
            let _lease = arena.lease().await;
            self.feed_into(&mut rec, tokens, soft).await?;
            self.record_sampling(&mut rec, p, step, false)?;
            self.submit_step(rec)
        };
        begun.instrument(span).await
    }

    /// Queues one decode step: feeds the last sampled token (still on the GPU) and samples
    /// the next. Does not wait: read tokens back with [`GpuSession::next_token`].
    pub async fn advance(&mut self, p: &SamplingParams, step: u32) -> Result<(), ForwardError> {
        if self.ledger.sampled() == Sampled::None {
            return Err(ForwardError::NothingSampled);
        }
        if self.in_flight() >= self.pipeline_depth() {
            return Err(ForwardError::Busy);
        }
        let need = self.position() + 1;
        if need > self.capacity {
            return Err(ForwardError::ContextOverflow {
                need,
                capacity: self.capacity,
            });
        }
        // Per-layer embeddings need the fed token's table row: staged now when the token is
        // known, else when the step sampling it is read back (`next_token`).
        let known = match self.ledger.sampled() {
            Sampled::Known(t) => Some(t),
            Sampled::OnGpu | Sampled::None => None,
        };
        let defer = self.needs_token_on_cpu() && known.is_none();
        if defer && (self.queue.has_waiting() || self.queue.submitted() != 1) {
            return Err(ForwardError::Busy);
        }
        if let (true, Some(t)) = (self.needs_token_on_cpu(), known) {
            self.stage_ple_rows(&[t])?;
        }
        let ctx = self.model.ctx.clone();
        let pos = self.position() as u32;
        let own = &self.s.own.positions;
        ctx.write(&own.buffer, own.offset, bytemuck::bytes_of(&pos));
        let mut rec = Recorder::new(&ctx, "decode");
        if defer {
            // What comes before the token's table rows runs while the token is read back.
            let at = self
                .decode
                .iter()
                .position(|op| matches!(op, Op::Host(HostOp::TokenRows)))
                .unwrap_or(0);
            let mut head = Recorder::new(&ctx, "decode head");
            self.record(&mut head, &self.decode[..at]).await?;
            head.submit();
            self.record(&mut rec, &self.decode[at..]).await?;
        } else {
            self.record(&mut rec, &self.decode).await?;
        }
        self.record_sampling(&mut rec, p, step, true)?;
        // The token fed here joins the history when its id is known.
        self.ledger.feed_sampled();
        self.has_logits = true;
        let (slot, commands) = self.queue.finish(rec, &self.s.result)?;
        if defer {
            self.queue.hold(slot, commands);
        } else {
            self.queue.launch(&self.model.ctx, slot, commands);
        }
        Ok(())
    }

    /// Records the readback of the step's token, submits, and starts mapping it: the step
    /// samples the newest token.
    fn submit_step(&mut self, rec: Recorder<'_>) -> Result<(), ForwardError> {
        let (slot, commands) = self.queue.finish(rec, &self.s.result)?;
        self.queue.launch(&self.model.ctx, slot, commands);
        self.ledger.sampling();
        Ok(())
    }

    /// Waits for the oldest queued step and returns the token it sampled.
    pub async fn next_token(&mut self) -> Result<u32, ForwardError> {
        let ctx = self.model.ctx.clone();
        let (token, finite) = self
            .queue
            .read_oldest(&ctx)
            .await?
            .ok_or(ForwardError::NothingSampled)?;
        self.ledger.read_back(token);
        let fetched = if !finite {
            Err(ForwardError::NonFiniteLogits)
        } else if self.needs_token_on_cpu() {
            self.fetch_rows(&[token]).await
        } else {
            Ok(())
        };
        if let Err(e) = fetched {
            // The step recorded for this token cannot run (a model computing NaN has no
            // token worth feeding): forget it, so the token is sampled but not fed, as if
            // that step had never been queued.
            if self.queue.drop_waiting() {
                self.ledger.unfeed(token);
            }
            return Err(e);
        }
        // A recorded step was waiting for exactly this token.
        if self.queue.has_waiting() {
            self.stage_ple_rows(&[token])?;
            self.queue.release(&ctx);
        }
        Ok(token)
    }

    /// Reads every queued step back (their tokens are in the history or pending after this).
    pub async fn drain(&mut self) -> Result<(), ForwardError> {
        while self.in_flight() > 0 {
            match self.next_token().await {
                Ok(_) | Err(ForwardError::NonFiniteLogits) => {}
                Err(e) => return Err(e),
            }
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
        self.fetch_rows(tokens).await?;
        self.begin(tokens, p, step).await?;
        self.next_token().await
    }

    /// Samples the next token from the logits left by the last feed.
    pub async fn sample(&mut self, p: &SamplingParams, step: u32) -> Result<u32, ForwardError> {
        if !self.has_logits {
            return Err(ForwardError::NoLogits);
        }
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        let ctx = self.model.ctx.clone();
        let mut rec = Recorder::new(&ctx, "sample");
        self.record_sampling(&mut rec, p, step, false)?;
        self.submit_step(rec)?;
        self.next_token().await
    }

    /// From the next sampling on, records the log-probabilities of the sampled token and of
    /// the `top` most likely (at most [`MAX_TOP_LOGPROBS`]) for [`GpuSession::logprobs`];
    /// `None` stops. While on, one step is queued at a time.
    pub fn set_logprobs(&mut self, top: Option<u32>) -> Result<(), ForwardError> {
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        let Some(top) = top else {
            self.logprobs = None;
            return Ok(());
        };
        let top = top.min(MAX_TOP_LOGPROBS);
        if self.logprobs.as_ref().is_none_or(|lp| lp.top != top) {
            let vocab = self.model.cfg.n_vocab as u32;
            let ctx = &self.model.ctx;
            self.logprobs = Some(LogprobPlan::new(ctx, vocab, top, &self.s.topk_scratch)?);
        }
        Ok(())
    }

    /// The log-probabilities of the last token read back ([`GpuSession::next_token`]), where
    /// [`GpuSession::set_logprobs`] asked for them before its step.
    pub async fn logprobs(&self) -> Result<TokenLogprobs, ForwardError> {
        let lp = self.logprobs.as_ref().ok_or(ForwardError::NoLogprobs)?;
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        Ok(lp.read(&self.model.ctx).await?)
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
        if let Some(lp) = &self.logprobs {
            lp.record_before(rec, &self.s.logits);
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
        if let Some(lp) = &self.logprobs {
            lp.record_after(rec, &self.s.result);
        }
        // Penalties rewrite the logits in place: they are no longer the raw ones.
        if sp.penalties {
            self.has_logits = false;
        }
        Ok(())
    }

    /// How a batched step samples this session's row together with the others
    /// ([`ops::argmax_rows`]): where its sampling is the argmax or a Gumbel-max draw, with
    /// no penalties and no log-probabilities, as [`GpuSession::record_sampling`] would draw
    /// it; `None` where the session samples its row itself.
    pub(super) fn row_draw(&self, p: &SamplingParams, step: u32) -> Option<ops::RowDraw> {
        if self.logprobs.is_some() || p.penalties().is_some() {
            return None;
        }
        match p.strategy() {
            Strategy::Greedy => Some(ops::RowDraw::greedy()),
            Strategy::Gumbel => Some(ops::RowDraw::gumbel(ops::Gumbel {
                seed: p.seed32(),
                step,
                temperature: p.temperature,
            })),
            _ => None,
        }
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
        self.score_with(tokens, &[]).await
    }

    /// [`GpuSession::score`] with soft tokens in place of some tokens' embeddings (see
    /// [`GpuSession::feed_with`]).
    pub async fn score_with(
        &mut self,
        tokens: &[u32],
        soft: &[SoftTokens],
    ) -> Result<Vec<(u32, f32)>, ForwardError> {
        self.check_tokens(tokens)?;
        self.check_soft(tokens.len(), soft)?;
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        let ctx = self.model.ctx.clone();
        let vocab = self.model.cfg.n_vocab;
        // Rows of logits per pass: bounded so the buffer stays small, but whole images that
        // see each other.
        let (start, spans) = (self.position(), self.bidirectional_spans(soft));
        let longest = spans.iter().map(|s| s.1).max().unwrap_or(0);
        let rows = self.max_batch.min(16.max(longest));
        let all = View::of(&ctx.storage("all_logits", (rows * vocab * 4) as u64));
        let mut out = Vec::with_capacity(tokens.len());
        for range in chunk_ranges(tokens.len(), rows, &spans)? {
            let chunk = &tokens[range.clone()];
            let (copies, ple_ids) = self.soft_in_chunk(range.start, chunk, soft)?;
            self.fetch_rows(&ple_ids).await?;
            let input = StepInput {
                ids: &self.acts(chunk.len()).ids,
                soft: &copies,
                reach: self.stage_span_keys(start, range.clone(), &spans),
            };
            let ops = self.plan(chunk.len() as u32, input, LogitsFor::All, Some(&all))?;
            let arena = self.arena.clone();
            let lease = arena.lease().await;
            self.stage(chunk, &ple_ids)?;
            let mut rec = Recorder::new(&ctx, "score");
            self.record(&mut rec, &ops).await?;
            rec.submit();
            drop(lease);
            self.ledger.feed(chunk);
            let logits = ctx
                .read_f32(&all.slice(0, (chunk.len() * vocab * 4) as u64)?)
                .await?;
            out.extend(logits.chunks_exact(vocab).map(wgemma_kernels::cpu::argmax));
        }
        self.has_logits = false;
        Ok(out)
    }
}

/// The steps `n` fed tokens split into: at most `max` each, never cutting a span whose tokens
/// see each other (`spans`: `(at, rows)`), since a span's queries read all its keys from the
/// cache.
fn chunk_ranges(
    n: usize,
    max: usize,
    spans: &[(usize, usize)],
) -> Result<Vec<Range<usize>>, ForwardError> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < n {
        let mut end = (start + max).min(n);
        if let Some(&(at, len)) = spans.iter().find(|&&(at, len)| at < end && end < at + len) {
            if at <= start {
                return Err(ForwardError::SoftTokens(format!(
                    "an image of {len} tokens that see each other needs steps of at least {len} tokens; this session's take {max}"
                )));
            }
            end = at;
        }
        out.push(start..end);
        start = end;
    }
    Ok(out)
}

#[cfg(test)]
mod chunk_tests {
    use super::chunk_ranges;

    #[test]
    fn steps_never_cut_an_image_that_sees_itself() {
        assert_eq!(chunk_ranges(10, 4, &[]).unwrap(), vec![0..4, 4..8, 8..10]);
        assert_eq!(
            chunk_ranges(10, 4, &[(3, 3)]).unwrap(),
            vec![0..3, 3..7, 7..10]
        );
        assert_eq!(
            chunk_ranges(10, 4, &[(4, 4)]).unwrap(),
            vec![0..4, 4..8, 8..10]
        );
        assert!(
            chunk_ranges(10, 4, &[(2, 6)]).is_err(),
            "a span longer than a step"
        );
    }
}
