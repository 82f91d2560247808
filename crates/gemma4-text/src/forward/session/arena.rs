//! The activations of a step, and the arena that lets a model's sessions share the large
//! ones. A prefill chunk's activations (hundreds of rows: the stream, the q/k/v rows, the
//! feed-forward rows, the experts' slots) are only read within the chunk's own submissions, so
//! one copy per model serves every session; each session keeps one row's worth for its decode
//! steps, which run ahead of the CPU and interleave with other sessions' work.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use wgemma_kernels::{View, ops};

use crate::forward::model::GpuModel;

/// Per-layer-embedding activations: the tokens' raw table rows, their dequantized values, the
/// projection of the embedding they join, and the per-layer injection.
pub(super) struct PleScratch {
    /// The table rows of the step's tokens, as the file stores them.
    pub rows: View,
    /// 0, 1, 2, ...: the staged rows are gathered in order.
    pub iota: View,
    /// Every layer's per-layer inputs of the step's tokens.
    pub all: View,
    pub gate: View,
    pub act: View,
    pub out: View,
}

/// Mixture-of-experts activations.
pub(super) struct MoeScratch {
    /// The router's or the experts' input, where a norm runs before its product.
    pub normed: View,
    pub logits: View,
    pub sel: View,
    pub weight: View,
    /// The slots grouped by expert, for many tokens (`ops::moe_group`).
    pub groups: View,
    pub act: View,
    pub out: View,
    /// The dense branch and the experts' mix, normalised and added.
    pub ffn_out: View,
}

/// A step's activations for up to `rows` tokens. `x` is the residual stream, `xn` the normed
/// input of the next block. Buffers a model does not use are one word.
pub(super) struct Activations {
    pub rows: usize,
    pub ple: PleScratch,
    pub moe: MoeScratch,
    pub x: View,
    pub xn: View,
    pub qkv: View,
    pub attn: View,
    pub o: View,
    /// Gate and up products of a layer whose gate and up weights differ in dtype (same-dtype
    /// pairs are interleaved into one weight whose product is the activation itself).
    pub gate: View,
    pub up: View,
    pub act: View,
    pub down: View,
    /// Partial sums of prefill products split over k (`ops::matmul_parts`).
    pub partials: View,
    pub ids: View,
    pub positions: View,
    /// Per row, the last key it sees (u32; bidirectional spans, `AttentionArgs::last_key`).
    pub last_key: View,
    /// Per row, the first key it sees (u32; a DiffusionGemma canvas, `AttentionArgs::first_key`).
    pub first_key: View,
}

impl Activations {
    /// Allocates the activations of steps of up to `rows` tokens through `model`.
    pub fn new(model: &GpuModel, rows: usize) -> Self {
        let (ctx, cfg) = (&model.ctx, &model.cfg);
        let b = rows as u64;
        let buf = |name: &str, floats: u64| View::of(&ctx.storage(name, floats * 4));
        let d = cfg.n_embd as u64;
        let max_qkv = u64::from(model.layers.iter().map(|l| l.qkv_width).max().unwrap_or(0));
        let max_q = cfg
            .layers
            .iter()
            .map(|l| cfg.n_head * l.head_dim)
            .max()
            .unwrap_or(0) as u64;
        let max_ff = cfg.layers.iter().map(|l| l.n_ff).max().unwrap_or(0) as u64;
        // Per-layer embeddings: every layer's inputs for each token.
        let (n_ple, n_all) = (cfg.n_ple as u64, (cfg.n_ple * cfg.n_layer) as u64);
        let row_bytes = model.ple.as_ref().map_or(0, |p| p.info.row_bytes());
        let iota: Vec<u32> = (0..rows as u32).collect();
        let ple = PleScratch {
            rows: View::of(&ctx.storage("ple_rows", b * row_bytes + 16)),
            iota: View::of(&ctx.storage_init("ple_iota", bytemuck::cast_slice(&iota))),
            all: buf("ple_all", b * n_all),
            gate: buf("ple_gate", b * n_ple),
            act: buf("ple_act", b * n_ple),
            out: buf("ple_out", if n_ple > 0 { b * d } else { 1 }),
        };
        let (k, e, ffe) = cfg.moe.map_or((0, 0, 0), |m| {
            (m.n_used as u64, m.n_expert as u64, m.n_ff as u64)
        });
        let moe_d = if k > 0 { b * d } else { 1 };
        let moe = MoeScratch {
            normed: buf("moe_normed", moe_d),
            logits: buf("moe_logits", b * e),
            sel: buf("moe_sel", b * k),
            weight: buf("moe_weight", b * k),
            groups: buf("moe_groups", 2 * e + b * k),
            act: buf("moe_act", b * k * ffe),
            out: buf("moe_out", b * k * d),
            ffn_out: buf("moe_ffn_out", moe_d),
        };
        let partials = model
            .matrices()
            .iter()
            .map(|(w, _)| ops::matmul_partials_floats(ctx, w, rows as u32))
            .max()
            .unwrap_or(0);
        Self {
            rows,
            ple,
            moe,
            x: buf("x", b * d),
            xn: buf("xn", b * d),
            qkv: buf("qkv", b * max_qkv),
            attn: buf("attn", b * max_q),
            o: buf("o", b * d),
            gate: buf("gate", b * max_ff),
            up: buf("up", b * max_ff),
            act: buf("act", b * max_ff),
            down: buf("down", b * d),
            partials: buf("partials", partials.max(1)),
            ids: buf("ids", b),
            positions: buf("positions", b),
            last_key: buf("last_key", b),
            first_key: buf("first_key", b),
        }
    }

    /// Bytes of GPU memory they take.
    pub fn bytes(&self) -> u64 {
        let (p, e) = (&self.ple, &self.moe);
        [
            &self.x,
            &self.xn,
            &self.qkv,
            &self.attn,
            &self.o,
            &self.gate,
            &self.up,
            &self.act,
            &self.down,
            &self.partials,
            &self.ids,
            &self.positions,
            &self.last_key,
            &self.first_key,
            &p.rows,
            &p.iota,
            &p.all,
            &p.gate,
            &p.act,
            &p.out,
            &e.normed,
            &e.logits,
            &e.sel,
            &e.weight,
            &e.groups,
            &e.act,
            &e.out,
            &e.ffn_out,
        ]
        .iter()
        .map(|v| v.size)
        .sum()
    }
}

/// Activations for batched steps, shared by the sessions of one model. A session holds the
/// lease from writing a chunk's ids until the chunk's last submission: the GPU runs
/// submissions in order, so a chunk never sees another session's rows in between.
pub(super) struct Arena {
    pub acts: Activations,
    /// An async lock: a session awaiting the lease holds no thread, and its guard may cross
    /// the awaits of a step's recording.
    lease: futures::lock::Mutex<()>,
}

/// The model's arena, while some session holds it.
#[derive(Default)]
pub(crate) struct ArenaSlot(Mutex<Weak<Arena>>);

impl Arena {
    /// `model`'s arena for steps of `rows` tokens: the one its sessions share when it is large
    /// enough, else a new one (sessions that hold the old one keep it).
    pub fn for_model(model: &GpuModel, rows: usize) -> Arc<Self> {
        let mut slot = model.arena.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(arena) = slot.upgrade()
            && arena.acts.rows >= rows
        {
            return arena;
        }
        let arena = Arc::new(Self {
            acts: Activations::new(model, rows),
            lease: futures::lock::Mutex::new(()),
        });
        *slot = Arc::downgrade(&arena);
        arena
    }

    /// Resolves once no other session records or submits a step through the arena.
    pub async fn lease(&self) -> futures::lock::MutexGuard<'_, ()> {
        self.lease.lock().await
    }
}
