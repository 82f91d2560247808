//! The model's weights on the GPU, and the loader that streams them there.
//!
//! Projections that share an input and a dtype (Q/K/V) sit side by side in one weight so one
//! dispatch computes them; gate and up rows are interleaved (per expert, for experts) so the
//! product can emit the gated activation directly.

use std::sync::Arc;

use wgemma_gguf::{Gguf, RangeSource, RowFetcher, TensorInfo, TensorSource, dequantize_to_vec};
use wgemma_kernels::store::{RowSource, StoreError, WeightStore, interleaved_rows, stacked_rows};
use wgemma_kernels::{GpuContext, GpuError, GpuWeight, View, wgpu};

use crate::config::TextConfig;
use crate::tensors::{ExpertGateUp, ModelTensors, ple_table};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Tensor(#[from] wgemma_gguf::TensorError),
    #[error(transparent)]
    Source(#[from] wgemma_gguf::SourceError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("tensor {name}: {reason}")]
    Unsupported { name: String, reason: String },
    #[error(
        "this model's per-layer embeddings are read by rows at run time: give the loader random access to the file"
    )]
    NoRowSource,
    #[error("streamed experts need a model without per-layer embeddings")]
    StreamedExpertsWithPle,
}

/// Where a mixture-of-experts model's experts live while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertPlacement {
    /// On the GPU when every layer's experts fit there, else streamed.
    #[default]
    Auto,
    /// On the GPU.
    Resident,
    /// In host memory: before each expert layer runs, its experts are copied into GPU
    /// buffers that every such layer shares. GPU memory holds one layer's experts. Natively,
    /// steps of fewer tokens than the layer has experts read the router's choice back and
    /// copy only the experts it chose (one wait for the GPU per layer); longer ones copy all.
    Streamed,
}

/// Whether [`GpuModel::load_with`] fills the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightBytes {
    /// Read every weight through the source and upload it.
    #[default]
    Upload,
    /// Allocate every weight and leave it unwritten: the model's steps can be planned (and
    /// their dispatch sequences compared) without reading the file's gigabytes, but what
    /// they compute means nothing.
    Skip,
}

/// How [`GpuModel::load_with`] places the model.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    pub experts: ExpertPlacement,
    pub weights: WeightBytes,
}

/// Bytes of weights uploaded so far, of the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    pub done: u64,
    pub total: u64,
}

/// A weight whose rows land at column `offset` of a shared output.
#[derive(Clone, Debug)]
pub(super) struct Part {
    pub w: GpuWeight,
    pub offset: u32,
}

/// The gate and up projections of a feed-forward block.
pub enum GateUp {
    /// One weight with gate and up rows alternating, so one product yields the activation.
    Interleaved(GpuWeight),
    /// Different dtypes: two products and a separate activation.
    Separate { gate: GpuWeight, up: GpuWeight },
}

/// A layer's per-layer-embedding weights.
pub(super) struct PleLayer {
    pub inp_gate: GpuWeight,
    pub proj: GpuWeight,
    pub post_norm: View,
}

/// A layer's experts.
pub(super) struct Experts {
    pub router: GpuWeight,
    /// The router input's norm weight, already times 1/sqrt(n_embd).
    pub router_scale: View,
    pub pre_norm: View,
    pub post_norm_dense: View,
    pub post_norm_experts: View,
    /// Per expert, gate/up row pairs.
    pub gate_up: GpuWeight,
    pub down: GpuWeight,
    pub down_scale: Option<View>,
    /// Streamed experts: this layer's bytes for `gate_up` and `down` (shared by layers).
    pub host: Option<Arc<HostExperts>>,
}

/// One layer's streamed experts in host memory, tile by tile in the layout of the GPU
/// weights they are copied into before the layer runs.
pub(super) struct HostExperts {
    gate_up: GpuWeight,
    down: GpuWeight,
    gate_up_tiles: Vec<Vec<u8>>,
    down_tiles: Vec<Vec<u8>>,
}

impl std::fmt::Debug for HostExperts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes: usize = self
            .gate_up_tiles
            .iter()
            .chain(&self.down_tiles)
            .map(Vec::len)
            .sum();
        write!(
            f,
            "HostExperts({} + {}, {bytes} bytes)",
            self.gate_up.name, self.down.name
        )
    }
}

impl HostExperts {
    /// Queues the copy of the layer's experts into the shared weights; it lands before the
    /// next submission's commands (so after everything submitted before it). Returns the
    /// bytes copied.
    pub fn write(&self, ctx: &GpuContext) -> u64 {
        let mut bytes = 0;
        for (w, tiles) in [
            (&self.gate_up, &self.gate_up_tiles),
            (&self.down, &self.down_tiles),
        ] {
            for (tile, host) in w.tiles.iter().zip(tiles) {
                ctx.write(&tile.buffer, 0, host);
                bytes += host.len() as u64;
            }
        }
        bytes
    }

    /// [`HostExperts::write`] of only the experts in `chosen` (ids of `n_expert`; others are
    /// ignored, repeats copied once), each to its own place in the shared weights: the
    /// expert products index them there by id. Returns the bytes copied.
    pub fn write_chosen(&self, ctx: &GpuContext, n_expert: u32, chosen: &[u32]) -> u64 {
        let mut ids: Vec<u64> = chosen
            .iter()
            .filter(|&&e| e < n_expert)
            .map(|&e| u64::from(e))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut bytes = 0;
        for (w, tiles) in [
            (&self.gate_up, &self.gate_up_tiles),
            (&self.down, &self.down_tiles),
        ] {
            let per_expert = w.rows / u64::from(n_expert);
            for &e in &ids {
                let first = e * per_expert;
                // Tiles hold whole experts.
                let found = w
                    .tiles
                    .iter()
                    .zip(tiles)
                    .find(|(t, _)| (t.first_row..t.first_row + t.rows).contains(&first));
                if let Some((tile, host)) = found {
                    // Copies start at 4-byte boundaries: widened to them, a copy rewrites a
                    // few bytes of the neighbouring experts with what they hold already.
                    let start = (first - tile.first_row) * w.row_bytes / 4 * 4;
                    let end = ((first + per_expert - tile.first_row) * w.row_bytes)
                        .div_ceil(4)
                        .saturating_mul(4)
                        .min(host.len() as u64);
                    ctx.write(&tile.buffer, start, &host[start as usize..end as usize]);
                    bytes += end - start;
                }
            }
        }
        bytes
    }
}

/// One decoder layer on the GPU.
pub(super) struct Layer {
    pub attn_norm: View,
    /// `[q | k | v]` projections (k and v absent on shared-KV layers, v absent when V is K).
    pub qkv: Vec<Part>,
    pub qkv_width: u32,
    pub k_is_v: bool,
    pub q_norm: View,
    pub k_norm: Option<View>,
    pub o: GpuWeight,
    pub post_attn_norm: View,
    pub ffn_norm: View,
    pub gate_up: GateUp,
    pub down: GpuWeight,
    pub post_ffw_norm: View,
    pub out_scale: f32,
    /// DiffusionGemma: the encoder's output scale, which the steps over the prompt use (the
    /// canvas steps use `out_scale`).
    pub enc_out_scale: Option<f32>,
    pub ple: Option<PleLayer>,
    pub experts: Option<Experts>,
}

/// The per-layer token table: read a row per token from the file, or uploaded whole
/// ([`PleRows::Gpu`]).
pub(super) struct PleTable {
    pub info: TensorInfo,
    /// Absolute offset of the table's data in the file.
    pub start: u64,
    pub rows: PleRows,
    /// The whole table on the GPU, with [`PleRows::Gpu`].
    pub gpu: Option<GpuWeight>,
    pub proj: GpuWeight,
    /// Times 1 / sqrt(2), the scale of the per-layer inputs' sum.
    pub proj_norm: View,
}

/// Where the per-layer embedding table's rows come from while the model runs.
#[derive(Clone)]
pub enum PleRows {
    /// Synchronous random access (a mapped file): rows are read as each step is staged.
    Mapped(Arc<dyn TensorSource>),
    /// Asynchronous reads (HTTP Range requests in the browser): a session fetches the rows
    /// of the tokens it is about to feed first ([`crate::GpuSession::fetch_rows`]).
    Fetched(Arc<dyn RowFetcher>),
    /// The whole table uploaded at load, its size in GPU memory (E2B's: 1.3 GB at Q4_K, 2.5
    /// GB at Q8_0): each step gathers its tokens' rows on the GPU, so decode steps queue ahead of
    /// the token's readback as for models without the table. For the browser, where the
    /// readback and a row fetch are two round trips per token that the GPU would wait for.
    Gpu,
}

impl PleTable {
    /// The file range of `token`'s row.
    pub fn row_range(&self, token: u32) -> (u64, u64) {
        let rb = self.info.row_bytes();
        (self.start + u64::from(token) * rb, rb)
    }
}

/// The model's weights on the GPU.
pub struct GpuModel {
    pub cfg: TextConfig,
    pub ctx: Arc<GpuContext>,
    pub(super) token_embd: GpuWeight,
    pub(super) output: Option<GpuWeight>,
    pub(super) output_norm: View,
    pub(super) rope_freqs: Option<View>,
    pub(super) ple: Option<PleTable>,
    pub(super) layers: Vec<Layer>,
    /// Batched steps' activations, shared by the sessions (while one holds them).
    pub(super) arena: super::session::ArenaSlot,
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

/// A dense layer's gate and up projections: interleaved into one weight where they share a
/// dtype (its product is the gated activation itself), else two.
pub fn load_gate_up<'a>(
    ld: &mut WeightStore<'a, '_>,
    gate: &'a TensorInfo,
    up: &'a TensorInfo,
) -> Result<GateUp, LoadError> {
    if gate.dtype != up.dtype {
        return Ok(GateUp::Separate {
            gate: ld.matrix(vec![gate], 1)?,
            up: ld.matrix(vec![up], 1)?,
        });
    }
    let (g, u) = (RowSource::whole(gate), RowSource::whole(up));
    Ok(GateUp::Interleaved(ld.interleaved(
        g,
        u,
        gate.n_rows(),
        1,
    )?))
}

/// Projections side by side: one part per run of equal dtype, with its output column.
fn parts<'a>(
    ld: &mut WeightStore<'a, '_>,
    tensors: &[&'a TensorInfo],
) -> Result<(Vec<Part>, u32), LoadError> {
    let mut offset = 0;
    let mut parts = Vec::new();
    for run in runs(tensors) {
        let w = ld.matrix(run, 1)?;
        let rows = w.rows as u32;
        parts.push(Part { w, offset });
        offset += rows;
    }
    Ok((parts, offset))
}

/// Layer tensors as resolved from the file.
type LayerTensors<'a> = crate::tensors::Layer<&'a TensorInfo, &'a TensorInfo>;
type MoeTensors<'a> = crate::tensors::MoeLayer<&'a TensorInfo, &'a TensorInfo>;

/// A layer's weights, allocated (and queued for upload) by `ld`.
async fn load_layer<'a, R: RangeSource + ?Sized>(
    ld: &mut WeightStore<'a, '_>,
    (g, src): (&'a Gguf, &R),
    cfg: &TextConfig,
    lt: &LayerTensors<'a>,
    streamed: bool,
) -> Result<Layer, LoadError> {
    let mut qkv_tensors = vec![lt.q];
    qkv_tensors.extend(lt.k);
    qkv_tensors.extend(lt.v);
    let (qkv, qkv_width) = parts(ld, &qkv_tensors)?;
    let out_scale = match lt.out_scale {
        Some(s) => read_scalar((g, src), s).await?,
        None => 1.0,
    };
    let enc_out_scale = match lt.enc_out_scale {
        Some(s) => Some(read_scalar((g, src), s).await?),
        None => None,
    };
    let experts = match (&lt.moe, cfg.moe) {
        (Some(m), Some(_)) => Some(load_experts(ld, (g, src), cfg, m, streamed).await?),
        _ => None,
    };
    Ok(Layer {
        attn_norm: ld.vector(lt.attn_norm),
        qkv,
        qkv_width,
        k_is_v: lt.k.is_some() && lt.v.is_none(),
        q_norm: ld.vector(lt.q_norm),
        k_norm: lt.k_norm.map(|k| ld.vector(k)),
        o: ld.matrix(vec![lt.o], 1)?,
        post_attn_norm: ld.vector(lt.post_attn_norm),
        ffn_norm: ld.vector(lt.ffn_norm),
        gate_up: load_gate_up(ld, lt.gate, lt.up)?,
        down: ld.matrix(vec![lt.down], 1)?,
        post_ffw_norm: ld.vector(lt.post_ffw_norm),
        out_scale,
        enc_out_scale,
        ple: match &lt.ple {
            Some(p) => Some(PleLayer {
                inp_gate: ld.matrix(vec![p.inp_gate], 1)?,
                proj: ld.matrix(vec![p.proj], 1)?,
                post_norm: ld.vector(p.post_norm),
            }),
            None => None,
        },
        experts,
    })
}

/// The value of a one-element tensor.
async fn read_scalar<R: RangeSource + ?Sized>(
    (g, src): (&Gguf, &R),
    t: &TensorInfo,
) -> Result<f32, LoadError> {
    let bytes = src.read_range(g.tensor_range(t).start, t.n_bytes).await?;
    Ok(dequantize_to_vec(t.dtype, &bytes)?
        .first()
        .copied()
        .unwrap_or(1.0))
}

/// Where each expert's gate and up rows are: one fused tensor (gate rows, then up rows, per
/// expert) or two.
fn gate_up_rows<'a>(
    gate_up: &ExpertGateUp<&'a TensorInfo>,
    ff: u64,
) -> (RowSource<'a>, RowSource<'a>) {
    let rows = |tensor, stride, offset| RowSource {
        tensor,
        stride,
        offset,
    };
    match *gate_up {
        ExpertGateUp::Fused(t) => (rows(t, 2 * ff, 0), rows(t, 2 * ff, ff)),
        ExpertGateUp::Split { gate, up } => (rows(gate, ff, 0), rows(up, ff, 0)),
    }
}

/// A MoE layer's experts: resident on the GPU, or (`streamed`) held on the host and copied
/// into weights the streamed layers share.
async fn load_experts<'a, R: RangeSource + ?Sized>(
    ld: &mut WeightStore<'a, '_>,
    (g, src): (&'a Gguf, &R),
    cfg: &TextConfig,
    m: &MoeTensors<'a>,
    streamed: bool,
) -> Result<Experts, LoadError> {
    let mc = cfg.moe.ok_or(LoadError::Unsupported {
        name: m.router.name.clone(),
        reason: "experts in a model without an expert count".into(),
    })?;
    let (ff, n) = (mc.n_ff as u64, mc.n_expert as u64);
    let (gate, up) = gate_up_rows(&m.gate_up, ff);
    let d = cfg.n_embd as u64;
    let (gate_up, down, host) = if streamed {
        let gate_up = ld.shared(gate.tensor, 2 * ff * n, 2 * ff)?;
        let down = ld.shared(m.down, m.down.n_rows(), d)?;
        let mut gate_up_tiles = Vec::with_capacity(gate_up.tiles.len());
        for tile in &gate_up.tiles {
            let range = tile.first_row..tile.first_row + tile.rows;
            gate_up_tiles.push(interleaved_rows(g, src, gate, up, ff, range).await?);
        }
        let mut down_tiles = Vec::with_capacity(down.tiles.len());
        for tile in &down.tiles {
            let range = tile.first_row..tile.first_row + tile.rows;
            down_tiles.push(stacked_rows(g, src, &[m.down], range).await?);
        }
        let host = HostExperts {
            gate_up: gate_up.clone(),
            down: down.clone(),
            gate_up_tiles,
            down_tiles,
        };
        (gate_up, down, Some(Arc::new(host)))
    } else {
        let gate_up = ld.interleaved(gate, up, ff, n)?;
        (gate_up, ld.matrix(vec![m.down], d)?, None)
    };
    let inv_sqrt_d = 1.0 / (cfg.n_embd as f32).sqrt();
    Ok(Experts {
        router: ld.matrix(vec![m.router], 1)?,
        router_scale: ld.vector_scaled(m.router_scale, inv_sqrt_d),
        pre_norm: ld.vector(m.pre_norm),
        post_norm_dense: ld.vector(m.post_norm_dense),
        post_norm_experts: ld.vector(m.post_norm_experts),
        gate_up,
        down,
        down_scale: m.down_scale.map(|s| ld.vector(s)),
        host,
    })
}

/// Whether every layer's experts fit in GPU memory next to the rest of the weights:
/// allocates them all (empty), plus as many bytes as the file's other tensors, and frees them
/// again; an out-of-memory error means no. (The KV cache and scratch come later; they are
/// small next to the experts of a model that needs this.)
async fn experts_fit(ctx: &GpuContext, g: &Gguf, t: &ModelTensors<'_>, cfg: &TextConfig) -> bool {
    let Some(mc) = cfg.moe else {
        return true;
    };
    let (ff, n) = (mc.n_ff as u64, mc.n_expert as u64);
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let mut probe = Vec::new();
    let mut expert_bytes = 0;
    for m in t.layers.iter().filter_map(|l| l.moe.as_ref()) {
        let (gate, up): (&TensorInfo, Option<&TensorInfo>) = match &m.gate_up {
            ExpertGateUp::Fused(t) => (t, None),
            ExpertGateUp::Split { gate, up } => (gate, Some(up)),
        };
        expert_bytes += gate.n_bytes + up.map_or(0, |u| u.n_bytes) + m.down.n_bytes;
        for (t, rows, group) in [
            (gate, 2 * ff * n, 2 * ff),
            (m.down, m.down.n_rows(), cfg.n_embd as u64),
        ] {
            // Shapes the GPU cannot take at all fail later, with their own error.
            if let Ok(w) =
                GpuWeight::allocate_in_groups(ctx, "probe", t.dtype, t.row_len(), rows, group, None)
            {
                probe.push(w);
            }
        }
    }
    let all: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
    let mut rest = all.saturating_sub(expert_bytes);
    let mut filler = Vec::new();
    while rest > 0 {
        let chunk = rest.min(ctx.max_binding_size());
        filler.push(ctx.storage("probe", chunk));
        rest -= chunk;
    }
    let oom = scope.pop().await;
    drop((probe, filler));
    oom.is_none()
}

impl GpuModel {
    /// Uploads the model's tensors, reading them through `src` one weight tile at a time, so
    /// memory on the CPU side peaks at one tile. Models with per-layer embeddings also need
    /// `rows`, random access to the file for the table that is read a row per token.
    pub async fn load<R: RangeSource + ?Sized>(
        ctx: Arc<GpuContext>,
        g: &Gguf,
        cfg: &TextConfig,
        src: &R,
        rows: Option<PleRows>,
        progress: impl FnMut(LoadProgress),
    ) -> Result<Self, LoadError> {
        let opts = LoadOptions::default();
        Self::load_with(ctx, g, cfg, src, rows, opts, progress).await
    }

    /// [`GpuModel::load`] with `opts`.
    pub async fn load_with<R: RangeSource + ?Sized>(
        ctx: Arc<GpuContext>,
        g: &Gguf,
        cfg: &TextConfig,
        src: &R,
        rows: Option<PleRows>,
        opts: LoadOptions,
        mut progress: impl FnMut(LoadProgress),
    ) -> Result<Self, LoadError> {
        let t = ModelTensors::resolve(g, cfg)?;
        let streamed = cfg.moe.is_some()
            && match opts.experts {
                ExpertPlacement::Resident => false,
                ExpertPlacement::Streamed => true,
                ExpertPlacement::Auto => !experts_fit(&ctx, g, &t, cfg).await,
            };
        if streamed && t.ple.is_some() {
            return Err(LoadError::StreamedExpertsWithPle);
        }
        let mut ld = WeightStore::new(&ctx);
        let token_embd = ld.matrix(vec![t.token_embd], 1)?;
        let output = t.output.map(|o| ld.matrix(vec![o], 1)).transpose()?;
        let output_norm = ld.vector(t.output_norm);
        let rope_freqs = t.rope_freqs.map(|r| ld.vector(r));
        let ple = match (ple_table(g, cfg)?, &t.ple) {
            (Some(info), Some(p)) => Some(PleTable {
                info: info.clone(),
                start: g.tensor_range(info).start,
                gpu: match rows {
                    Some(PleRows::Gpu) => Some(ld.matrix(vec![info], 1)?),
                    _ => None,
                },
                rows: rows.ok_or(LoadError::NoRowSource)?,
                proj: ld.matrix(vec![p.proj], 1)?,
                proj_norm: ld.vector_scaled(p.proj_norm, std::f32::consts::FRAC_1_SQRT_2),
            }),
            _ => None,
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for lt in &t.layers {
            layers.push(load_layer(&mut ld, (g, src), cfg, lt, streamed).await?);
        }
        if opts.weights == WeightBytes::Skip {
            ld.skip_bytes();
        }
        ld.upload((g, src), &mut |done, total| {
            progress(LoadProgress { done, total })
        })
        .await?;
        ctx.check()?;
        Ok(Self {
            cfg: cfg.clone(),
            ctx: ctx.clone(),
            token_embd,
            output,
            output_norm,
            rope_freqs,
            ple,
            layers,
            arena: Default::default(),
        })
    }

    /// Every matrix with the fraction of its rows one decode step reads (experts: the used
    /// ones; the embedding: one row unless it is also the output).
    pub(super) fn matrices(&self) -> Vec<(&GpuWeight, f64)> {
        let used = self
            .cfg
            .moe
            .map_or(1.0, |m| m.n_used as f64 / m.n_expert as f64);
        let e = &self.token_embd;
        let mut out = vec![(
            e,
            if self.output.is_some() {
                1.0 / e.rows as f64
            } else {
                1.0
            },
        )];
        out.extend(self.output.iter().map(|w| (w, 1.0)));
        out.extend(self.ple.iter().map(|p| (&p.proj, 1.0)));
        for l in &self.layers {
            out.extend(l.qkv.iter().map(|p| (&p.w, 1.0)));
            match &l.gate_up {
                GateUp::Interleaved(w) => out.push((w, 1.0)),
                GateUp::Separate { gate, up } => out.extend([(gate, 1.0), (up, 1.0)]),
            }
            out.extend([(&l.o, 1.0), (&l.down, 1.0)]);
            if let Some(p) = &l.ple {
                out.extend([(&p.inp_gate, 1.0), (&p.proj, 1.0)]);
            }
            if let Some(x) = &l.experts {
                out.extend([(&x.router, 1.0), (&x.gate_up, used), (&x.down, used)]);
            }
        }
        out
    }

    /// Weight bytes one decode step reads: the floor of a step's time is this over bandwidth.
    pub fn bytes_per_token(&self) -> u64 {
        let matrices: f64 = self
            .matrices()
            .iter()
            .map(|(w, frac)| (w.rows * w.row_bytes) as f64 * frac)
            .sum();
        let ple_row = self.ple.as_ref().map_or(0, |p| p.info.row_bytes());
        matrices as u64 + ple_row
    }

    /// Whether the experts are streamed from host memory ([`ExpertPlacement::Streamed`]).
    pub fn streams_experts(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.experts.as_ref().is_some_and(|x| x.host.is_some()))
    }

    /// Bytes the weights hold on the GPU (streamed layers share their expert weights).
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
                .chain(l.ple.iter().map(|p| &p.post_norm))
            })
            .chain([&self.output_norm])
            .chain(&self.rope_freqs)
            .map(|v| v.size)
            .sum();
        let mut matrices: Vec<&GpuWeight> = self.matrices().into_iter().map(|(w, _)| w).collect();
        matrices.sort_by(|a, b| a.name.cmp(&b.name));
        matrices.dedup_by(|a, b| a.name == b.name);
        let table = self
            .ple
            .as_ref()
            .and_then(|p| p.gpu.as_ref())
            .map_or(0, |w| w.gpu_bytes());
        matrices.iter().map(|w| w.gpu_bytes()).sum::<u64>() + vectors + table
    }

    /// The token embedding table as stored.
    pub fn token_embd(&self) -> &GpuWeight {
        &self.token_embd
    }

    pub(super) fn output_matrix(&self) -> &GpuWeight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}
