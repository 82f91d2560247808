//! The tower on the GPU: the subsampling convolutions, the conformer blocks, the output
//! projection and the embedder as general ops of `wgemma-kernels` (im2col and products for the
//! convolutions, norms along rows, products of stored weights with their clamps, pointwise
//! activations and gates, the causal depthwise convolution, local attention with a
//! relative-position term and softcap), recorded into one command encoder per chunk. Only the
//! features go up and, when asked, the soft tokens come back: they stay on the GPU for the
//! text model to read.
//!
//! Constants of the weights are folded in once, on the GPU, when the tower loads: the half-step
//! feed-forward's ½ into its post-norm, the query's `dh^-½ / ln 2` into the per-dimension
//! scale, and each block's relative-position keys (its projection of the fixed sinusoids)
//! divided by the key scale, which the attention then applies to the whole logit.

use std::sync::{Arc, Mutex};

use tracing::info_span;
use wgemma_gguf::{Gguf, RangeSource, TensorInfo};
use wgemma_kernels::ops::{
    self, Activation, Affine, Attend, Binary, Mask, MatmulArgs, MatvecOut, NormOut, Product,
    ProductClamp, RmsNorm, RowOp, Window2d,
};
use wgemma_kernels::store::{StoreError, WeightStore, read_f32};
use wgemma_kernels::{
    DType, Dispatch, GpuContext, GpuError, GpuWeight, Recorder, Steps, Tensor, View,
};

use crate::features::MelChunk;
use crate::features::soft_tokens;
use crate::load::AudioLoadError;
use crate::mel::N_MELS;
use crate::reference::{AudioConfig, AudioTrace, key_scale, query_scale, sinusoids, subsampled};
use crate::tensors::{ClampedLinear, ConformerLayer, Mappers, Tower, TowerTensors};

/// Why the GPU tower could not load or encode.
#[derive(Debug, thiserror::Error)]
pub enum TowerError {
    #[error(transparent)]
    Load(#[from] AudioLoadError),
    #[error("loading the audio tower: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("the audio features do not hold together: {0}")]
    Chunk(String),
}

/// The tower's weights on the GPU.
pub struct AudioTower {
    ctx: Arc<GpuContext>,
    pub cfg: AudioConfig,
    w: Tower<GpuWeight, View>,
    /// Per block, `[window, hidden]`: the relative-position key term of distances
    /// `0..window`, divided by the key scale.
    relative: Vec<View>,
    /// The plans of the last few chunk lengths (buffers and bind groups built once each).
    plans: Mutex<Vec<Arc<Plan>>>,
}

/// Chunk lengths whose plans a tower keeps (a long clip is full chunks and one shorter).
const KEPT_PLANS: usize = 3;

/// One chunk's soft tokens on the GPU: `tokens` rows of the text model's width.
#[derive(Clone, Debug)]
pub struct Encoded {
    pub rows: View,
    pub tokens: u32,
    pub width: u32,
}

/// Keys a query sees: itself and `window - 1` before it.
fn window(cfg: &AudioConfig) -> u32 {
    (cfg.context_left - 1) as u32
}

/// `Some(range)` where a clamp range changes some finite value.
fn bites(range: [f32; 2]) -> Option<[f32; 2]> {
    (range[0] > f32::MIN || range[1] < f32::MAX).then_some(range)
}

impl AudioTower {
    /// Uploads the tower's tensors of `g`, read from `src`, calling `progress(done, total)`
    /// in bytes, and folds its constants in.
    pub async fn load<R: RangeSource + ?Sized>(
        ctx: Arc<GpuContext>,
        g: &Gguf,
        cfg: &AudioConfig,
        src: &R,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Self, TowerError> {
        let _span = info_span!("load_audio", layers = cfg.n_layer, width = cfg.hidden).entered();
        let t = TowerTensors::resolve(g, cfg)?;
        let mut values = Vec::new();
        for c in t.clamp_tensors() {
            values.push(read_f32(g, src, c).await?);
        }
        let tensors = t.with_clamps(&values)?;
        let mut store = WeightStore::new(&ctx);
        let mappers = Mappers {
            matrix: store_matrix,
            vector: store_vector,
        };
        let w = tensors.try_map(&mut store, &mappers)?;
        store.upload((g, src), &mut progress).await?;
        let relative = fold_constants(&ctx, cfg, &w)?;
        Ok(Self {
            ctx,
            cfg: cfg.clone(),
            w,
            relative,
            plans: Mutex::new(Vec::new()),
        })
    }

    /// The plan for `chunk`'s length, built on first use.
    fn plan(&self, chunk: &MelChunk) -> Result<Arc<Plan>, TowerError> {
        let shape = ChunkShape::of(chunk)?;
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = plans.iter().position(|p| p.shape == shape) {
            let plan = plans.remove(i);
            plans.push(plan.clone());
            return Ok(plan);
        }
        let plan = Arc::new(Plan::build(self, shape, false)?);
        if plans.len() == KEPT_PLANS {
            plans.remove(0);
        }
        plans.push(plan.clone());
        Ok(plan)
    }

    /// One chunk's soft tokens, left on the GPU.
    pub async fn encode(&self, chunk: &MelChunk) -> Result<Encoded, TowerError> {
        let _span = info_span!("encode_audio", frames = chunk.frames()).entered();
        let plan = self.plan(chunk)?;
        plan.write_input(&self.ctx, chunk);
        // Each chunk's soft tokens in a buffer of their own: the plan's are the next chunk's.
        let rows = View::of(
            &self
                .ctx
                .storage("audio soft tokens", plan.buffers.soft.size),
        );
        let mut rec = Recorder::new(&self.ctx, "audio tower");
        plan.steps.record_into(&mut rec);
        rec.copy(&plan.buffers.soft, &rows, rows.size);
        rec.submit();
        Ok(Encoded {
            rows,
            tokens: plan.shape.tokens,
            width: self.cfg.text_width as u32,
        })
    }

    /// One chunk's soft tokens, read back (`[tokens, text width]`).
    pub async fn encode_to_vec(&self, chunk: &MelChunk) -> Result<Vec<f32>, TowerError> {
        let e = self.encode(chunk).await?;
        Ok(self.ctx.read_f32(&e.rows).await?)
    }

    /// GPU time per kernel of one chunk's forward, most expensive first: (kernel,
    /// dispatches, microseconds). `None` where the adapter has no timestamp queries.
    pub async fn profile(
        &self,
        chunk: &MelChunk,
    ) -> Result<Option<Vec<(&'static str, usize, f64)>>, TowerError> {
        let plan = self.plan(chunk)?;
        plan.write_input(&self.ctx, chunk);
        Ok(plan.steps.profile(&self.ctx, "audio tower").await?)
    }

    /// The tower's forward on one chunk with its intermediate values read back (as
    /// [`crate::reference::AudioWeights::forward`] gives them; `mask` is left empty).
    pub async fn trace(&self, chunk: &MelChunk) -> Result<AudioTrace, TowerError> {
        let plan = Plan::build(self, ChunkShape::of(chunk)?, true)?;
        plan.write_input(&self.ctx, chunk);
        let mut taps = plan.steps.run_traced(&self.ctx, "audio tower").await?;
        let soft_tokens = self.ctx.read_f32(&plan.buffers.soft).await?;
        let output = taps.pop().unwrap_or_default();
        let mut taps = taps.into_iter();
        Ok(AudioTrace {
            sscp: taps.next().unwrap_or_default(),
            layers: taps.collect(),
            output,
            soft_tokens,
            mask: Vec::new(),
        })
    }
}

fn store_matrix<'g>(
    s: &mut WeightStore<'g, '_>,
    t: &&'g TensorInfo,
) -> Result<GpuWeight, StoreError> {
    s.matrix(vec![*t], 1)
}

fn store_vector<'g>(s: &mut WeightStore<'g, '_>, t: &&'g TensorInfo) -> Result<View, StoreError> {
    Ok(s.vector(t))
}

/// Folds the weights' constants in (see the module's comment) and computes each block's
/// relative-position keys, in one submission.
fn fold_constants(
    ctx: &GpuContext,
    cfg: &AudioConfig,
    w: &Tower<GpuWeight, View>,
) -> Result<Vec<View>, TowerError> {
    let (d, n) = (cfg.hidden as u32, window(cfg));
    let table = sinusoids(cfg.hidden, 0..n as usize);
    let table = View::of(&ctx.storage_init("audio sinusoids", bytemuck::cast_slice(&table)));
    let mut steps = Steps::new(false);
    let scale = |v: &View, len: usize, s: f32| -> Result<Dispatch, GpuError> {
        let t = Tensor::new(v, &[len as u32])?;
        ops::unary(ctx, Activation::Scale(s), &t, &t)
    };
    let mut relative = Vec::with_capacity(w.layers.len());
    for l in &w.layers {
        steps.push(scale(&l.ffn1.post_norm, cfg.hidden, 0.5))?;
        steps.push(scale(&l.ffn2.post_norm, cfg.hidden, 0.5))?;
        steps.push(scale(&l.query_scale, cfg.head_dim(), query_scale(cfg)))?;
        let rel = View::of(&ctx.storage("audio relative keys", u64::from(n * d) * 4));
        let args = MatmulArgs {
            x: &table,
            y: &rel,
            m: n,
            x_stride: d,
            y_stride: d,
            out: MatvecOut::Rows { softcap: 0.0 },
            y_offset: 0,
            partials: None,
        };
        steps.extend(ops::matmul(ctx, &l.relative_k, &args))?;
        steps.push(scale(&rel, (n * d) as usize, 1.0 / key_scale()))?;
        relative.push(rel);
    }
    let mut rec = Recorder::new(ctx, "audio tower constants");
    steps.record_into(&mut rec);
    rec.submit();
    Ok(relative)
}

/// The sizes of one chunk's forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChunkShape {
    frames: u32,
    /// After the first and the second subsampling.
    t0: u32,
    t1: u32,
    /// Valid positions after both (a prefix): the soft tokens.
    tokens: u32,
}

impl ChunkShape {
    fn of(chunk: &MelChunk) -> Result<Self, TowerError> {
        let frames = chunk.frames();
        let valid = chunk.mask.iter().take_while(|&&m| m).count();
        if frames == 0
            || frames > crate::CHUNK_SAMPLES / crate::HOP
            || chunk.features.len() != frames * N_MELS
            || chunk.mask[valid..].iter().any(|&m| m)
        {
            return Err(TowerError::Chunk(format!(
                "{} values over {frames} frames, {valid} valid ones first",
                chunk.features.len()
            )));
        }
        let t0 = subsampled(frames);
        let t1 = subsampled(t0);
        let tokens = soft_tokens(&chunk.mask);
        Ok(Self {
            frames: frames as u32,
            t0: t0 as u32,
            t1: t1 as u32,
            tokens: tokens as u32,
        })
    }
}

/// The activations of one chunk.
struct Buffers {
    features: View,
    /// 1 for each valid position after the first subsampling, else 0.
    mask0: View,
    cols0: View,
    y0: View,
    cols1: View,
    y1: View,
    /// The residual stream `[t1, D]`.
    x: View,
    /// Its normed rows, then the sublayers' outputs.
    h: View,
    /// q, k and v side by side: `[t1, 3 D]`.
    qkv: View,
    attn: View,
    /// The feed-forward's hidden rows `[t1, ff]`, and the light convolution's `[t1, 2 D]`.
    wide: View,
    glu: View,
    conv: View,
    out: View,
    soft: View,
}

impl Buffers {
    fn new(ctx: &GpuContext, cfg: &AudioConfig, s: ChunkShape) -> Self {
        let (d, ff) = (cfg.hidden as u64, cfg.ff as u64);
        let [c0, c1] = cfg.sscp_channels.map(|c| c as u64);
        let (f0, f1) = (subsampled(N_MELS) as u64, cfg.sscp_freq() as u64);
        let (t0, t1) = (u64::from(s.t0), u64::from(s.t1));
        let f32s = |label: &str, count: u64| View::of(&ctx.storage(label, count.max(1) * 4));
        Self {
            features: f32s("audio features", u64::from(s.frames) * N_MELS as u64),
            mask0: f32s("audio mask", t0),
            cols0: f32s("audio cols0", t0 * f0 * 9),
            y0: f32s("audio conv0", t0 * f0 * c0),
            cols1: f32s("audio cols1", t1 * f1 * c0 * 9),
            y1: f32s("audio conv1", t1 * f1 * c1),
            x: f32s("audio x", t1 * d),
            h: f32s("audio h", t1 * d),
            qkv: f32s("audio qkv", t1 * 3 * d),
            attn: f32s("audio attn", t1 * d),
            wide: f32s("audio wide", t1 * ff.max(2 * d)),
            glu: f32s("audio glu", t1 * d),
            conv: f32s("audio conv", t1 * d),
            out: f32s("audio out", t1 * cfg.output_dims as u64),
            soft: f32s(
                "audio soft tokens",
                u64::from(s.tokens) * cfg.text_width as u64,
            ),
        }
    }
}

/// One chunk length's dispatches, built over its buffers.
struct Plan {
    shape: ChunkShape,
    buffers: Buffers,
    /// Traced, it copies out, in order: after the subsampling, each block's output, the
    /// output projection.
    steps: Steps,
}

impl Plan {
    fn build(tower: &AudioTower, shape: ChunkShape, traced: bool) -> Result<Self, TowerError> {
        let (ctx, cfg) = (&*tower.ctx, &tower.cfg);
        let buffers = Buffers::new(ctx, cfg, shape);
        let mut b = Builder {
            ctx,
            cfg,
            b: &buffers,
            s: shape,
            steps: Steps::new(traced),
        };
        b.subsample(&tower.w)?;
        b.tap(&buffers.x);
        for (l, rel) in tower.w.layers.iter().zip(&tower.relative) {
            b.layer(l, rel)?;
            b.tap(&buffers.x);
        }
        b.output(&tower.w)?;
        let steps = b.steps;
        Ok(Self {
            shape,
            buffers,
            steps,
        })
    }

    /// Writes the chunk's features and its mask after the first subsampling.
    fn write_input(&self, ctx: &GpuContext, chunk: &MelChunk) {
        ctx.write(
            &self.buffers.features.buffer,
            0,
            bytemuck::cast_slice(&chunk.features),
        );
        let mask: Vec<f32> = chunk
            .mask
            .iter()
            .step_by(2)
            .map(|&m| f32::from(u8::from(m)))
            .collect();
        ctx.write(&self.buffers.mask0.buffer, 0, bytemuck::cast_slice(&mask));
    }
}

/// Builds a [`Plan`]'s steps.
struct Builder<'a> {
    ctx: &'a GpuContext,
    cfg: &'a AudioConfig,
    b: &'a Buffers,
    s: ChunkShape,
    steps: Steps,
}

/// A product's input rows (view, stride) and where its output rows go (view, stride, first
/// column).
struct Rows<'v> {
    x: (&'v View, u32),
    y: (&'v View, u32, u32),
    m: u32,
}

impl Builder<'_> {
    fn push(&mut self, d: Result<Dispatch, GpuError>) -> Result<(), TowerError> {
        Ok(self.steps.push(d)?)
    }

    /// Copies `view` out when traced.
    fn tap(&mut self, view: &View) {
        self.steps.tap(self.ctx, view);
    }

    /// `[t1, cols]` rows of `view`, `stride` apart, from column `offset`.
    fn rows(&self, view: &View, cols: u32, stride: u32, offset: u32) -> Result<Tensor, GpuError> {
        Tensor::strided(view, DType::F32, &[self.s.t1, cols], &[stride, 1], offset)
    }

    /// `y = clamp(W clamp(x))`, the clamps inside the product.
    fn linear(&mut self, l: &ClampedLinear<GpuWeight>, r: Rows<'_>) -> Result<(), TowerError> {
        let args = MatmulArgs {
            x: r.x.0,
            y: r.y.0,
            m: r.m,
            x_stride: r.x.1,
            y_stride: r.y.1,
            out: MatvecOut::Rows { softcap: 0.0 },
            y_offset: r.y.2,
            // Not split over k: at 750 positions the split's sums cost more than its fuller
            // GPU saves (benches/RESULTS.md, twenty-fourth session).
            partials: None,
        };
        let clamp = ProductClamp {
            input: bites(l.input),
            output: bites(l.output),
        };
        Ok(self
            .steps
            .extend(ops::matmul_clamped(self.ctx, &l.w, &args, clamp))?)
    }

    /// A `[D] -> [D]`-wide linear over the residual stream's rows.
    fn square(
        &mut self,
        l: &ClampedLinear<GpuWeight>,
        x: &View,
        (y, stride, offset): (&View, u32, u32),
    ) -> Result<(), TowerError> {
        let d = self.cfg.hidden as u32;
        let m = self.s.t1;
        self.linear(
            l,
            Rows {
                x: (x, d),
                y: (y, stride, offset),
                m,
            },
        )
    }

    /// RMSNorm of `x`'s rows into `y`, times `weight`.
    fn norm(&mut self, x: &Tensor, weight: &View, y: &Tensor) -> Result<(), TowerError> {
        let w = Tensor::new(weight, &[x.dim(-1)])?;
        let affine = Affine {
            weight: Some(&w),
            bias: None,
        };
        let op = RowOp::RmsNorm { eps: self.cfg.eps };
        self.push(ops::rows(self.ctx, op, affine, x, y))
    }

    /// `x += norm(delta) * post`, in one pass.
    fn residual(&mut self, delta: &View, post: &View) -> Result<(), TowerError> {
        let d = self.cfg.hidden as u32;
        let norm = RmsNorm {
            x: delta,
            out: NormOut::AddTo(&self.b.x),
            weight: Some(post),
            rows: self.s.t1,
            dim: d,
            x_stride: d,
            eps: self.cfg.eps,
        };
        self.push(ops::rms_norm(self.ctx, norm))
    }

    /// A 3x3 stride-2 convolution of `x` (`[c, t, f]`, any layout) by `w` (`[cout, c*9]`)
    /// through `cols`, then LayerNorm over the channels (weight, no bias) and ReLU, into
    /// `y` (`[t', f', cout]`, channels last).
    fn conv_block(
        &mut self,
        x: &Tensor,
        (w, norm): (&View, &View),
        cols: &View,
        y: &View,
    ) -> Result<[u32; 2], TowerError> {
        let window = Window2d {
            kernel: [3, 3],
            stride: [2, 2],
            pad: [1, 1],
        };
        let [t, f] = window.output([x.dim(1), x.dim(2)])?;
        let (k, cout) = (x.dim(0) * 9, (norm.size / 4) as u32);
        self.push(ops::im2col(
            self.ctx,
            x,
            window,
            &Tensor::new(cols, &[t * f, k])?,
        ))?;
        let weight = Tensor::new(w, &[1, cout, k])?;
        let out = Tensor::new(y, &[1, t * f, cout])?;
        let product = Product {
            a: &Tensor::new(cols, &[1, t * f, k])?,
            bt: &weight,
            bias: None,
            alpha: 1.0,
            accumulate: false,
        };
        self.push(ops::product(self.ctx, &product, &out))?;
        let rows = Tensor::new(y, &[t * f, cout])?;
        let norm = Tensor::new(norm, &[cout])?;
        let affine = Affine {
            weight: Some(&norm),
            bias: None,
        };
        let op = RowOp::LayerNorm { eps: self.cfg.eps };
        self.push(ops::rows(self.ctx, op, affine, &rows, &rows))?;
        self.push(ops::unary(self.ctx, Activation::Relu, &rows, &rows))?;
        Ok([t, f])
    }

    /// The subsampling: two convolution blocks (the frame mask on the second's input; the
    /// features are 0 on invalid frames already), then the input projection into `x`.
    fn subsample(&mut self, w: &Tower<GpuWeight, View>) -> Result<(), TowerError> {
        let b = self.b;
        let [c0, c1] = self.cfg.sscp_channels.map(|c| c as u32);
        let features = Tensor::new(&b.features, &[1, self.s.frames, N_MELS as u32])?;
        let [t0, f0] =
            self.conv_block(&features, (&w.conv[0], &w.conv_norm[0]), &b.cols0, &b.y0)?;
        let y0 = Tensor::new(&b.y0, &[t0, f0 * c0])?;
        let mask = Tensor::strided(&b.mask0, DType::F32, &[t0, f0 * c0], &[1, 0], 0)?;
        self.push(ops::binary(self.ctx, Binary::Mul, &y0, &mask, &y0))?;
        // [t0, f0, c0] channels last, read as [c0, t0, f0].
        let x1 = Tensor::strided(&b.y0, DType::F32, &[c0, t0, f0], &[1, f0 * c0, c0], 0)?;
        let [_, f1] = self.conv_block(&x1, (&w.conv[1], &w.conv_norm[1]), &b.cols1, &b.y1)?;
        let plain = ClampedLinear {
            w: w.input_projection.clone(),
            input: [f32::NEG_INFINITY, f32::INFINITY],
            output: [f32::NEG_INFINITY, f32::INFINITY],
        };
        let d = self.cfg.hidden as u32;
        let m = self.s.t1;
        self.linear(
            &plain,
            Rows {
                x: (&b.y1, f1 * c1),
                y: (&b.x, d, 0),
                m,
            },
        )
    }

    /// `x += ½ post_norm(down silu(up pre_norm(x)))` (the ½ is in the post-norm's weight).
    fn feed_forward(
        &mut self,
        f: &crate::tensors::FeedForward<GpuWeight, View>,
    ) -> Result<(), TowerError> {
        let (d, ff, b) = (self.cfg.hidden as u32, self.cfg.ff as u32, self.b);
        let (x, h) = (self.rows(&b.x, d, d, 0)?, self.rows(&b.h, d, d, 0)?);
        self.norm(&x, &f.pre_norm, &h)?;
        self.square(&f.up, &b.h, (&b.wide, ff, 0))?;
        let wide = self.rows(&b.wide, ff, ff, 0)?;
        self.push(ops::unary(self.ctx, Activation::Silu, &wide, &wide))?;
        let m = self.s.t1;
        self.linear(
            &f.down,
            Rows {
                x: (&b.wide, ff),
                y: (&b.h, d, 0),
                m,
            },
        )?;
        self.residual(&b.h, &f.post_norm)
    }

    /// Chunked local attention with the relative-position term and the logit softcap.
    fn attention(
        &mut self,
        l: &ConformerLayer<GpuWeight, View>,
        relative: &View,
    ) -> Result<(), TowerError> {
        let cfg = self.cfg;
        let (d, heads, dh) = (cfg.hidden as u32, cfg.n_head as u32, cfg.head_dim() as u32);
        let b = self.b;
        let (x, h) = (self.rows(&b.x, d, d, 0)?, self.rows(&b.h, d, d, 0)?);
        self.norm(&x, &l.attn_pre_norm, &h)?;
        for (i, lin) in [&l.q, &l.k, &l.v].into_iter().enumerate() {
            self.square(lin, &b.h, (&b.qkv, 3 * d, i as u32 * d))?;
        }
        let head = |i: u32| {
            let dims = [self.s.t1, heads, dh];
            Tensor::strided(&b.qkv, DType::F32, &dims, &[3 * d, dh, 1], i * d)
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let per_dim = Tensor::strided(&l.query_scale, DType::F32, q.dims(), &[0, 0, 1], 0)?;
        self.push(ops::binary(self.ctx, Binary::Mul, &q, &per_dim, &q))?;
        let rel = Tensor::new(relative, &[window(cfg), heads, dh])?;
        let attn = Tensor::new(&b.attn, &[self.s.t1, heads, dh])?;
        let attend = Attend {
            q: &q,
            k: &k,
            v: &v,
            mask: Mask::Local {
                back: window(cfg) - 1,
                ahead: 0,
            },
            q_pos0: 0,
            scale: key_scale(),
            softcap: cfg.logit_cap,
            relative: Some(&rel),
        };
        self.push(ops::attend(self.ctx, &attend, &attn))?;
        self.square(&l.post, &b.attn, (&b.h, d, 0))?;
        self.residual(&b.h, &l.attn_post_norm)
    }

    /// `x += end(silu(norm(depthwise(glu(start(pre_norm(x)))))))`.
    fn light_conv(&mut self, l: &ConformerLayer<GpuWeight, View>) -> Result<(), TowerError> {
        let (d, b) = (self.cfg.hidden as u32, self.b);
        let (x, h) = (self.rows(&b.x, d, d, 0)?, self.rows(&b.h, d, d, 0)?);
        self.norm(&x, &l.conv_pre_norm, &h)?;
        self.square(&l.conv_start, &b.h, (&b.wide, 2 * d, 0))?;
        let (value, gate) = (
            self.rows(&b.wide, d, 2 * d, 0)?,
            self.rows(&b.wide, d, 2 * d, d)?,
        );
        let glu = self.rows(&b.glu, d, d, 0)?;
        let sigmoid = Binary::Gated(Activation::Sigmoid);
        self.push(ops::binary(self.ctx, sigmoid, &gate, &value, &glu))?;
        let kernel = Tensor::new(&l.conv_depthwise, &[d, self.cfg.conv_kernel as u32])?;
        let conv = self.rows(&b.conv, d, d, 0)?;
        self.push(ops::depthwise_conv1d(self.ctx, &glu, &kernel, None, &conv))?;
        self.norm(&conv, &l.conv_norm, &conv)?;
        self.push(ops::unary(self.ctx, Activation::Silu, &conv, &conv))?;
        self.square(&l.conv_end, &b.conv, (&b.h, d, 0))?;
        self.push(ops::binary(self.ctx, Binary::Add, &x, &h, &x))
    }

    fn layer(
        &mut self,
        l: &ConformerLayer<GpuWeight, View>,
        relative: &View,
    ) -> Result<(), TowerError> {
        self.feed_forward(&l.ffn1)?;
        self.attention(l, relative)?;
        self.light_conv(l)?;
        self.feed_forward(&l.ffn2)?;
        let d = self.cfg.hidden as u32;
        let x = self.rows(&self.b.x, d, d, 0)?;
        self.norm(&x, &l.out_norm, &x)
    }

    /// The output projection with its bias, then the embedder on the valid rows: weightless
    /// RMSNorm and the projection to the text width.
    fn output(&mut self, w: &Tower<GpuWeight, View>) -> Result<(), TowerError> {
        let (d, od, b) = (self.cfg.hidden as u32, self.cfg.output_dims as u32, self.b);
        let plain = |m: &GpuWeight| ClampedLinear {
            w: m.clone(),
            input: [f32::NEG_INFINITY, f32::INFINITY],
            output: [f32::NEG_INFINITY, f32::INFINITY],
        };
        let m = self.s.t1;
        self.linear(
            &plain(&w.output_projection),
            Rows {
                x: (&b.x, d),
                y: (&b.out, od, 0),
                m,
            },
        )?;
        let out = self.rows(&b.out, od, od, 0)?;
        let bias = Tensor::strided(&w.output_bias, DType::F32, out.dims(), &[0, 1], 0)?;
        self.push(ops::binary(self.ctx, Binary::Add, &out, &bias, &out))?;
        self.tap(&b.out);
        let tokens = self.s.tokens;
        if tokens == 0 {
            return Ok(());
        }
        let valid = Tensor::new(&b.out, &[tokens, od])?;
        let op = RowOp::RmsNorm { eps: self.cfg.eps };
        self.push(ops::rows(self.ctx, op, Affine::default(), &valid, &valid))?;
        let width = self.cfg.text_width as u32;
        let rows = Rows {
            x: (&b.out, od),
            y: (&b.soft, width, 0),
            m: tokens,
        };
        self.linear(&plain(&w.embedding_projection), rows)
    }
}
