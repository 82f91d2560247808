//! The tower on the GPU: the patch embedding, the encoder layers, the pooling and the embedder
//! as general ops of `wgemma-kernels` (products of stored weights, norms along rows, 2-D rope,
//! bidirectional attention, pointwise clamps and gates, average pooling), recorded into one
//! command encoder and one compute pass per image. Only the patches go up and, when asked, the
//! soft tokens come back: they stay on the GPU for the text model to read.

use std::sync::{Arc, Mutex};

use tracing::info_span;
use wgemma_gguf::{Gguf, RangeSource};
use wgemma_kernels::ops::{
    self, Activation, Affine, Attend, Binary, Mask, MatmulArgs, MatvecOut, NormOut, ProductClamp,
    RmsNorm, RopePairs, RowOp, RowRope, Window2d,
};
use wgemma_kernels::store::{WeightStore, read_f32};
use wgemma_kernels::{
    DType, Dispatch, GpuContext, GpuError, GpuWeight, Recorder, Steps, Tensor, View,
};

use crate::config::{POSITION_AXES, ROPE_THETA, VisionConfig};
use crate::preprocess::{PATCH, POOL, Patches};
use crate::reference::Trace;
use crate::tensors::{Clamp, Layer, Linear, PatchOrder, Tower, TowerTensors};
use crate::{VisionError, check_positions};

/// The tower's weights on the GPU.
pub struct VisionTower {
    ctx: Arc<GpuContext>,
    pub cfg: VisionConfig,
    w: Tower<GpuWeight, View>,
    /// The plans of the last few patch grids (buffers and bind groups built once per size).
    plans: Mutex<Vec<Arc<Plan>>>,
}

/// Patch grids whose plans a tower keeps.
const KEPT_PLANS: usize = 4;

/// Steps an encode submits at a time: the GPU starts on a layer or so while the rest is
/// recorded.
const SUBMIT_EVERY: usize = 32;

/// One image's soft tokens on the GPU: `tokens` rows of the text model's width.
#[derive(Clone, Debug)]
pub struct Encoded {
    pub rows: View,
    pub tokens: u32,
    pub width: u32,
}

impl VisionTower {
    /// Uploads the tower's tensors of `g`, read from `src`, calling `progress(done, total)`
    /// in bytes.
    pub async fn load<R: RangeSource + ?Sized>(
        ctx: Arc<GpuContext>,
        g: &Gguf,
        cfg: &VisionConfig,
        src: &R,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Self, VisionError> {
        let _span = info_span!("load_vision", layers = cfg.n_layer, width = cfg.n_embd).entered();
        let t = TowerTensors::resolve(g, cfg)?;
        let mut clamp_values = Vec::new();
        for tensor in t.clamps.tensors() {
            clamp_values.push(read_f32(g, src, tensor).await?);
        }
        let clamps = t.clamps.assemble(cfg.n_layer, &clamp_values)?;
        let mut out_scales = Vec::with_capacity(cfg.n_layer);
        for s in &t.out_scales {
            out_scales.push(match s {
                Some(s) => read_f32(g, src, s).await?[0],
                None => 1.0,
            });
        }
        let mut store = WeightStore::new(&ctx);
        let mut w = Tower {
            patch_embd: store.matrix(vec![&t.patch_embd], 1)?,
            patch_order: t.tower.patch_order,
            positions: store.vector(t.tower.positions),
            layers: Vec::with_capacity(cfg.n_layer),
            standardize: t
                .tower
                .standardize
                .map(|(b, s)| (store.vector(b), store.vector(s))),
            projection: store.matrix(vec![t.tower.projection], 1)?,
        };
        for l in &t.tower.layers {
            let mut lin = |x: &Linear<_>| -> Result<Linear<GpuWeight>, VisionError> {
                Ok(Linear {
                    w: store.matrix(vec![x.w], 1)?,
                    clamp: Clamp::NONE,
                })
            };
            let (q, k, v, o) = (lin(&l.q)?, lin(&l.k)?, lin(&l.v)?, lin(&l.o)?);
            let (gate, up, down) = (lin(&l.gate)?, lin(&l.up)?, lin(&l.down)?);
            w.layers.push(Layer {
                ln1: store.vector(l.ln1),
                ln2: store.vector(l.ln2),
                attn_post_norm: store.vector(l.attn_post_norm),
                ffn_post_norm: store.vector(l.ffn_post_norm),
                q_norm: store.vector(l.q_norm),
                k_norm: store.vector(l.k_norm),
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
                out_scale: 1.0,
            });
        }
        w.set_ranges(&clamps, &out_scales);
        store.upload((g, src), &mut progress).await?;
        Ok(Self {
            ctx,
            cfg: cfg.clone(),
            w,
            plans: Mutex::new(Vec::new()),
        })
    }

    /// The plan for `p`'s grid, built on first use.
    fn plan(&self, p: &Patches) -> Result<Arc<Plan>, VisionError> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = plans
            .iter()
            .position(|q| (q.rows, q.cols) == (p.rows, p.cols))
        {
            let plan = plans.remove(i);
            plans.push(plan.clone());
            return Ok(plan);
        }
        let plan = Arc::new(Plan::build(self, p, false)?);
        if plans.len() == KEPT_PLANS {
            plans.remove(0);
        }
        plans.push(plan.clone());
        Ok(plan)
    }

    /// The soft tokens of one image, left on the GPU.
    pub async fn encode(&self, p: &Patches) -> Result<Encoded, VisionError> {
        let _span = info_span!("encode_image", rows = p.rows, cols = p.cols).entered();
        let plan = self.plan(p)?;
        // Each image's soft tokens in a buffer of their own: the plan's are the next image's.
        let rows = View::of(&self.ctx.storage("soft tokens", plan.buffers.soft.size));
        self.record(&plan, p, &rows).submit();
        Ok(Encoded {
            rows,
            tokens: plan.tokens,
            width: plan.width,
        })
    }

    /// The tower's steps on `p`'s patches (written for them), then a copy of the soft tokens
    /// to `out`.
    fn record<'c>(&'c self, plan: &Plan, p: &Patches, out: &View) -> Recorder<'c> {
        plan.write_input(&self.ctx, p);
        let mut rec = plan
            .steps
            .record_submitting(&self.ctx, "vision tower", SUBMIT_EVERY);
        rec.copy(&plan.buffers.soft, out, out.size);
        rec
    }

    /// The soft tokens of one image, read back (`[tokens, text width]`): copied out in the
    /// same submission as the forward.
    pub async fn encode_to_vec(&self, p: &Patches) -> Result<Vec<f32>, VisionError> {
        let _span = info_span!("encode_image", rows = p.rows, cols = p.cols).entered();
        let plan = self.plan(p)?;
        let size = plan.buffers.soft.size;
        let staging = self.ctx.readback_buffer("soft tokens readback", size);
        self.record(&plan, p, &View::of(&staging)).submit();
        let bytes = self.ctx.map_and_copy(&staging, size).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// GPU time per kernel of one image's forward, most expensive first: (kernel, dispatches,
    /// microseconds). `None` where the adapter has no timestamp queries.
    pub async fn profile(
        &self,
        p: &Patches,
    ) -> Result<Option<Vec<(&'static str, usize, f64)>>, VisionError> {
        let plan = self.plan(p)?;
        plan.write_input(&self.ctx, p);
        Ok(plan.steps.profile(&self.ctx, "vision tower").await?)
    }

    /// The tower's forward on one image with its intermediate values read back (as
    /// [`crate::CpuTower::trace`] gives them).
    pub async fn trace(&self, p: &Patches) -> Result<Trace, VisionError> {
        let plan = Plan::build(self, p, true)?;
        plan.write_input(&self.ctx, p);
        let mut taps = plan.steps.run_traced(&self.ctx, "vision tower").await?;
        let soft_tokens = self.ctx.read_f32(&plan.buffers.soft).await?;
        let pooled = taps.pop().unwrap_or_default();
        let mut taps = taps.into_iter();
        Ok(Trace {
            patch_embed: taps.next().unwrap_or_default(),
            layers: taps.collect(),
            pooled,
            soft_tokens,
        })
    }
}

/// The activations of one image.
struct Buffers {
    /// The patches as preprocessing gives them (`[patches, PATCH², 3]` in [0, 1]).
    pixels: View,
    /// The same as the patch embedding reads them: `2 x - 1`, in its column order.
    input: View,
    positions: View,
    /// The residual stream `[patches, D]`.
    x: View,
    /// The attention's and the MLP's outputs (their projections').
    h: View,
    /// The residual stream's normed rows: each block's input.
    normed: View,
    /// q, k and v side by side: `[patches, 3 D]`.
    qkv: View,
    /// The same normed and roped, in the element type the attention reads best: `[patches,
    /// 3, heads, head_dim]`.
    heads: Tensor,
    attn: View,
    gate: View,
    up: View,
    pooled: View,
    soft: View,
}

impl Buffers {
    fn new(ctx: &GpuContext, cfg: &VisionConfig, p: &Patches) -> Result<Self, GpuError> {
        let n = u64::from(p.rows * p.cols);
        let (d, ff) = (cfg.n_embd as u64, cfg.n_ff as u64);
        let tokens = u64::from(p.soft_tokens());
        let f32s = |label: &str, count: u64| View::of(&ctx.storage(label, count * 4));
        let head_dim = cfg.head_dim as u32;
        let dtype = ops::attend_input_dtype(ctx, p.rows * p.cols, head_dim);
        let heads = View::of(&ctx.storage("vision heads", n * 3 * d * dtype.bytes()));
        let dims = [p.rows * p.cols, 3, cfg.n_head as u32, head_dim];
        Ok(Self {
            heads: Tensor::of(&heads, dtype, &dims)?,
            pixels: f32s("vision pixels", n * Patches::PATCH_VALUES as u64),
            input: f32s("vision input", n * Patches::PATCH_VALUES as u64),
            positions: f32s("vision positions", n * POSITION_AXES as u64),
            x: f32s("vision x", n * d),
            h: f32s("vision h", n * d),
            normed: f32s("vision normed", n * d),
            qkv: f32s("vision qkv", n * 3 * d),
            attn: f32s("vision attn", n * d),
            gate: f32s("vision gate", n * ff),
            up: f32s("vision up", n * ff),
            pooled: f32s("vision pooled", tokens * d),
            soft: f32s("vision soft tokens", tokens * cfg.projection_dim as u64),
        })
    }
}

/// One image's dispatches, built over its buffers.
struct Plan {
    buffers: Buffers,
    /// Traced, it copies out, in order: the patch embedding, each layer's output, the pooled
    /// tokens.
    steps: Steps,
    tokens: u32,
    width: u32,
    rows: u32,
    cols: u32,
}

/// Builds a [`Plan`]'s steps.
struct Builder<'a> {
    ctx: &'a GpuContext,
    cfg: &'a VisionConfig,
    b: &'a Buffers,
    /// Patches.
    n: u32,
    steps: Steps,
}

impl Plan {
    fn build(tower: &VisionTower, p: &Patches, traced: bool) -> Result<Self, VisionError> {
        let (ctx, cfg) = (&*tower.ctx, &tower.cfg);
        check_positions(cfg, p)?;
        let buffers = Buffers::new(ctx, cfg, p)?;
        let positions: Vec<u32> = (0..p.rows * p.cols)
            .flat_map(|i| {
                let (c, r) = p.position(i);
                [c, r]
            })
            .collect();
        ctx.write(
            &buffers.positions.buffer,
            0,
            bytemuck::cast_slice(&positions),
        );
        let mut b = Builder {
            ctx,
            cfg,
            b: &buffers,
            n: p.rows * p.cols,
            steps: Steps::new(traced),
        };
        b.embed(&tower.w, p)?;
        let layers = &tower.w.layers;
        if let Some(first) = layers.first() {
            b.first_norm(&first.ln1)?;
        }
        for (i, l) in layers.iter().enumerate() {
            b.layer(l, layers.get(i + 1).map(|next| &next.ln1))?;
            b.tap(&buffers.x);
        }
        b.pool_and_project(&tower.w, p)?;
        let steps = b.steps;
        Ok(Self {
            steps,
            tokens: p.soft_tokens(),
            width: cfg.projection_dim as u32,
            rows: p.rows,
            cols: p.cols,
            buffers,
        })
    }

    /// Writes the image's patches for the next run (as they are: the GPU orders them).
    fn write_input(&self, ctx: &GpuContext, p: &Patches) {
        ctx.write(
            &self.buffers.pixels.buffer,
            0,
            bytemuck::cast_slice(&p.pixels),
        );
    }
}

impl Builder<'_> {
    fn push(&mut self, d: Result<Dispatch, GpuError>) -> Result<(), VisionError> {
        Ok(self.steps.push(d)?)
    }

    /// `[n, cols]` rows `stride` apart from column `offset` of `view`.
    fn rows(&self, view: &View, cols: u32, stride: u32, offset: u32) -> Result<Tensor, GpuError> {
        Tensor::strided(view, DType::F32, &[self.n, cols], &[stride, 1], offset)
    }

    /// Copies `view` out when traced.
    fn tap(&mut self, view: &View) {
        self.steps.tap(self.ctx, view);
    }

    /// `input = 2 pixels - 1` in the patch embedding's column order
    /// ([`crate::tensors::PatchOrder::input`] on the GPU).
    fn order_input(&mut self, order: PatchOrder) -> Result<(), VisionError> {
        let (n, b) = (self.n, self.b);
        let area = PATCH * PATCH;
        let pixels = Tensor::new(&b.pixels, &[n, area, 3])?;
        let (from, to) = match order {
            PatchOrder::ChannelLast => (pixels, Tensor::new(&b.input, &[n, area, 3])?),
            PatchOrder::ChannelFirst => (
                pixels.permute(&[0, 2, 1])?,
                Tensor::new(&b.input, &[n, 3, area])?,
            ),
        };
        let affine = Activation::Affine {
            scale: 2.0,
            shift: -1.0,
        };
        self.push(ops::unary(self.ctx, affine, &from, &to))
    }

    /// `x = W input + posX[col] + posY[row]`.
    fn embed(&mut self, w: &Tower<GpuWeight, View>, p: &Patches) -> Result<(), VisionError> {
        let (d, b) = (self.cfg.n_embd as u32, self.b);
        let values = Patches::PATCH_VALUES as u32;
        self.order_input(w.patch_order)?;
        let plain = Linear {
            w: w.patch_embd.clone(),
            clamp: Clamp::NONE,
        };
        self.linear(&plain, (&b.input, values), (&b.x, d, 0))?;
        let grid = [p.rows, p.cols, d];
        let x = Tensor::new(&b.x, &grid)?;
        let table = (self.cfg.n_positions as u32) * d;
        let by_col = Tensor::strided(&w.positions, DType::F32, &grid, &[0, d, 1], 0)?;
        let by_row = Tensor::strided(&w.positions, DType::F32, &grid, &[d, 0, 1], table)?;
        for pos in [by_col, by_row] {
            self.push(ops::binary(self.ctx, Binary::Add, &x, &pos, &x))?;
        }
        self.tap(&b.x);
        Ok(())
    }

    /// `out[:, offset..] = clamp(W clamp(x))`, the clamps inside the product: `x` is (view,
    /// stride), `out` (view, stride, first column).
    fn linear(
        &mut self,
        l: &Linear<GpuWeight>,
        x: (&View, u32),
        out: (&View, u32, u32),
    ) -> Result<(), VisionError> {
        self.linear_as(l, x, out, MatvecOut::Rows { softcap: 0.0 })
    }

    /// [`Builder::linear`] whose output becomes `kind` (a gate times its other factor).
    fn linear_as(
        &mut self,
        l: &Linear<GpuWeight>,
        (x, x_stride): (&View, u32),
        (out, y_stride, y_offset): (&View, u32, u32),
        kind: MatvecOut<'_>,
    ) -> Result<(), VisionError> {
        let args = MatmulArgs {
            x,
            y: out,
            m: self.n,
            x_stride,
            y_stride,
            out: kind,
            y_offset,
            partials: None,
        };
        let clamp = ProductClamp {
            input: Clamp::bites(l.clamp.input),
            output: Clamp::bites(l.clamp.output),
        };
        Ok(self
            .steps
            .extend(ops::matmul_clamped(self.ctx, &l.w, &args, clamp))?)
    }

    /// RMSNorm of `t`'s rows in place, times `weight` when given.
    fn norm(&mut self, t: &Tensor, weight: Option<&View>) -> Result<(), VisionError> {
        let w = weight.map(|w| Tensor::new(w, &[t.dim(-1)])).transpose()?;
        let affine = Affine {
            weight: w.as_ref(),
            bias: None,
        };
        let op = RowOp::RmsNorm { eps: self.cfg.eps };
        self.push(ops::rows(self.ctx, op, affine, t, t))
    }

    /// `x += norm(delta) * post`, in one pass.
    fn residual(&mut self, delta: &View, post: &View) -> Result<(), VisionError> {
        let d = self.cfg.n_embd as u32;
        let norm = RmsNorm {
            x: delta,
            out: NormOut::AddTo(&self.b.x),
            weight: Some(post),
            rows: self.n,
            dim: d,
            x_stride: d,
            eps: self.cfg.eps,
        };
        self.push(ops::rms_norm(self.ctx, norm))
    }

    /// `x = (x + norm(delta) * post) * scale`, then `normed = norm(x) * weight` (the next
    /// block's input), in one pass.
    fn residual_then_norm(
        &mut self,
        post: &View,
        weight: &View,
        scale: f32,
    ) -> Result<(), VisionError> {
        let b = self.b;
        let step = ops::ResidualNorm {
            res: &b.x,
            delta: &b.h,
            post,
            weight,
            out: &b.normed,
            rows: self.n,
            dim: self.cfg.n_embd as u32,
            scale,
            eps: self.cfg.eps,
        };
        self.push(ops::residual_norm(self.ctx, &step))
    }

    /// The first layer's input norm (each later one's comes with the residual before it).
    fn first_norm(&mut self, ln1: &View) -> Result<(), VisionError> {
        let (d, b) = (self.cfg.n_embd as u32, self.b);
        let affine = Affine {
            weight: Some(&Tensor::new(ln1, &[d])?),
            bias: None,
        };
        let (x, normed) = (self.rows(&b.x, d, d, 0)?, self.rows(&b.normed, d, d, 0)?);
        let op = RowOp::RmsNorm { eps: self.cfg.eps };
        self.push(ops::rows(self.ctx, op, affine, &x, &normed))
    }

    /// One encoder layer on `normed` (its input norm already applied); `next_ln1` is the next
    /// layer's input norm, applied with this layer's last residual.
    fn layer(
        &mut self,
        l: &Layer<GpuWeight, View>,
        next_ln1: Option<&View>,
    ) -> Result<(), VisionError> {
        let cfg = self.cfg;
        let (d, ff) = (cfg.n_embd as u32, cfg.n_ff as u32);
        let (heads_n, dh) = (cfg.n_head as u32, cfg.head_dim as u32);
        let b = self.b;
        for (i, lin) in [&l.q, &l.k, &l.v].into_iter().enumerate() {
            self.linear(lin, (&b.normed, d), (&b.qkv, 3 * d, i as u32 * d))?;
        }
        // Per-head norms (v's without weight) and the 2-D rope of q and k, into the heads the
        // attention reads.
        let positions = Tensor::of(&b.positions, DType::U32, &[self.n, POSITION_AXES as u32])?;
        let rope = RowRope {
            positions: &positions,
            n_rot: dh / POSITION_AXES as u32,
            pairs: RopePairs::Neox,
            base: ROPE_THETA,
            freq_scale: 1.0,
        };
        let mut heads = Vec::with_capacity(3);
        for (i, weight) in [Some(&l.q_norm), Some(&l.k_norm), None]
            .into_iter()
            .enumerate()
        {
            let (dims, strides) = ([self.n, heads_n, dh], [3 * d, dh, 1]);
            let x = Tensor::strided(&b.qkv, DType::F32, &dims, &strides, i as u32 * d)?;
            let (view, dtype) = (b.heads.view(), b.heads.dtype());
            let y = Tensor::strided(view, dtype, &dims, &strides, i as u32 * d)?;
            let w = weight.map(|w| Tensor::new(w, &[dh])).transpose()?;
            let affine = Affine {
                weight: w.as_ref(),
                bias: None,
            };
            let op = RowOp::RmsNorm { eps: cfg.eps };
            self.push(match weight {
                Some(_) => ops::rows_roped(self.ctx, op, affine, &rope, &x, &y),
                None => ops::rows(self.ctx, op, affine, &x, &y),
            })?;
            heads.push(y);
        }
        let (q, k, v) = (&heads[0], &heads[1], &heads[2]);
        let attn = Tensor::new(&b.attn, &[self.n, heads_n, dh])?;
        let attend = Attend {
            q,
            k,
            v,
            mask: Mask::Full,
            q_pos0: 0,
            scale: 1.0,
            softcap: 0.0,
            relative: None,
        };
        self.push(ops::attend(self.ctx, &attend, &attn))?;
        self.linear(&l.o, (&b.attn, d), (&b.h, d, 0))?;
        self.residual_then_norm(&l.attn_post_norm, &l.ln2, 1.0)?;
        // gelu_tanh(gate) * up, the gate's product multiplying as it stores.
        self.linear(&l.up, (&b.normed, d), (&b.up, ff, 0))?;
        let gated = MatvecOut::GeluTimes {
            by: &b.up,
            offset: 0,
        };
        self.linear_as(&l.gate, (&b.normed, d), (&b.gate, ff, 0), gated)?;
        self.linear(&l.down, (&b.gate, ff), (&b.h, d, 0))?;
        match next_ln1 {
            Some(ln1) => self.residual_then_norm(&l.ffn_post_norm, ln1, l.out_scale)?,
            None => {
                self.residual(&b.h, &l.ffn_post_norm)?;
                if l.out_scale != 1.0 {
                    let x = self.rows(&b.x, d, d, 0)?;
                    let scale = Activation::Scale(l.out_scale);
                    self.push(ops::unary(self.ctx, scale, &x, &x))?;
                }
            }
        }
        Ok(())
    }

    /// 3x3 average pool, `* sqrt(D)`, standardisation, weightless RMSNorm, projection.
    fn pool_and_project(
        &mut self,
        w: &Tower<GpuWeight, View>,
        p: &Patches,
    ) -> Result<(), VisionError> {
        let (d, b) = (self.cfg.n_embd as u32, self.b);
        let (rows, cols) = (p.rows / POOL, p.cols / POOL);
        let tokens = rows * cols;
        let x = Tensor::new(&b.x, &[p.rows, p.cols, d])?;
        let grid = Tensor::new(&b.pooled, &[rows, cols, d])?;
        let window = Window2d {
            kernel: [POOL; 2],
            stride: [POOL; 2],
            pad: [0; 2],
        };
        self.push(ops::avg_pool2d(self.ctx, &x, window, &grid))?;
        let pooled = Tensor::new(&b.pooled, &[tokens, d])?;
        let root = Activation::Scale((d as f32).sqrt());
        self.push(ops::unary(self.ctx, root, &pooled, &pooled))?;
        if let Some((bias, scale)) = &w.standardize {
            let each = |v: &View| Tensor::strided(v, DType::F32, &[tokens, d], &[0, 1], 0);
            let (bias, scale) = (each(bias)?, each(scale)?);
            self.push(ops::binary(self.ctx, Binary::Sub, &pooled, &bias, &pooled))?;
            self.push(ops::binary(self.ctx, Binary::Mul, &pooled, &scale, &pooled))?;
        }
        self.tap(&b.pooled);
        self.norm(&pooled, None)?;
        let projection = Linear {
            w: w.projection.clone(),
            clamp: Clamp::NONE,
        };
        let width = self.cfg.projection_dim as u32;
        let n = std::mem::replace(&mut self.n, tokens);
        self.linear(&projection, (&b.pooled, d), (&b.soft, width, 0))?;
        self.n = n;
        Ok(())
    }
}
