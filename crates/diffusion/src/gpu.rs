//! DiffusionGemma on the GPU: the text crate's layers (a [`GpuSession`] runs the encoder
//! over the prompt and the canvas step), and the self-conditioning block that makes each
//! canvas row's input, recorded in the same pass as the canvas step.

use std::collections::HashMap;
use std::sync::Arc;

use wgemma_gguf::{GgmlType, Gguf, RangeSource, TensorInfo, dequantize_to_vec};
use wgemma_kernels::ops::{
    self, Affine, Elementwise, EmbedOut, MatmulArgs, MatvecOut, NormOut, RmsNorm, RowOp,
};
use wgemma_kernels::store::{RowSource, StoreError, WeightStore};
use wgemma_kernels::{Dispatch, GpuContext, GpuError, GpuWeight, Tensor, View};
use wgemma_text::{
    CanvasBuffers, ForwardError, GpuModel, GpuSession, LoadError, LoadOptions, LoadProgress,
    SessionOptions,
};

use crate::config::DiffusionConfig;
use crate::tensors::SelfCond;

#[derive(Debug, thiserror::Error)]
pub enum DiffusionError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tensor(#[from] wgemma_gguf::TensorError),
    #[error(transparent)]
    Source(#[from] wgemma_gguf::SourceError),
    #[error(transparent)]
    Forward(#[from] ForwardError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{0}")]
    Input(String),
}

/// The self-conditioning block's weights on the GPU.
struct GpuSelfCond {
    pre_norm: View,
    /// Gate and up rows interleaved: the product is the gated activation.
    gate_up: GpuWeight,
    down: GpuWeight,
    /// The embedding table transposed (`n_embd` rows of `n_vocab`; f32 for an f32 table, else
    /// f16), so that `softmax(z) E` is a product like any other.
    embd_t: GpuWeight,
}

/// A DiffusionGemma model's weights on the GPU.
pub struct GpuDiffusion {
    pub cfg: DiffusionConfig,
    pub text: Arc<GpuModel>,
    sc: GpuSelfCond,
}

/// Rows of the embedding table read and transposed at a time.
const TRANSPOSE_ROWS: u64 = 4096;

/// The embedding table transposed, read through `src` a few thousand rows at a time.
async fn transposed_embedding<R: RangeSource + ?Sized>(
    ctx: &GpuContext,
    (g, src): (&Gguf, &R),
    t: &TensorInfo,
) -> Result<GpuWeight, DiffusionError> {
    let (vocab, d) = (t.n_rows(), t.row_len());
    let f32_table = t.dtype == GgmlType::F32;
    let n = (vocab * d) as usize;
    let (mut wide, mut narrow) = if f32_table {
        (vec![0f32; n], Vec::new())
    } else {
        (Vec::new(), vec![half::f16::ZERO; n])
    };
    let start = g.tensor_range(t).start;
    let mut first = 0;
    while first < vocab {
        let rows = TRANSPOSE_ROWS.min(vocab - first);
        let bytes = src
            .read_range(start + first * t.row_bytes(), rows * t.row_bytes())
            .await?;
        let values = dequantize_to_vec(t.dtype, &bytes)?;
        for (r, row) in values.chunks_exact(d as usize).enumerate() {
            let v = (first as usize) + r;
            for (j, &x) in row.iter().enumerate() {
                let at = j * vocab as usize + v;
                if f32_table {
                    wide[at] = x;
                } else {
                    narrow[at] = half::f16::from_f32(x);
                }
            }
        }
        first += rows;
    }
    let (dtype, bytes): (GgmlType, &[u8]) = if f32_table {
        (GgmlType::F32, bytemuck::cast_slice(&wide))
    } else {
        (GgmlType::F16, bytemuck::cast_slice(&narrow))
    };
    Ok(GpuWeight::upload(
        ctx,
        "token_embd transposed",
        dtype,
        vocab,
        d,
        bytes,
        None,
    )?)
}

impl GpuDiffusion {
    /// Uploads the model: the text layers, the self-conditioning block and the transposed
    /// embedding table.
    pub async fn load<R: RangeSource + ?Sized>(
        ctx: Arc<GpuContext>,
        g: &Gguf,
        cfg: &DiffusionConfig,
        src: &R,
        opts: LoadOptions,
        progress: impl FnMut(LoadProgress),
    ) -> Result<Self, DiffusionError> {
        let _span = tracing::info_span!("load_diffusion").entered();
        let text =
            GpuModel::load_with(ctx.clone(), g, &cfg.text, src, None, opts, progress).await?;
        let t = SelfCond::resolve(g, cfg)?;
        let mut ld = WeightStore::new(&ctx);
        let pre_norm = ld.vector(t.pre_norm);
        let gate_up = ld.interleaved(
            RowSource::whole(t.gate),
            RowSource::whole(t.up),
            t.gate.n_rows(),
            1,
        )?;
        let down = ld.matrix(vec![t.down], 1)?;
        ld.upload((g, src), &mut |_, _| {}).await?;
        let embd_t =
            transposed_embedding(&ctx, (g, src), g.require_tensor("token_embd.weight")?).await?;
        ctx.check()?;
        Ok(Self {
            cfg: cfg.clone(),
            text: Arc::new(text),
            sc: GpuSelfCond {
                pre_norm,
                gate_up,
                down,
                embd_t,
            },
        })
    }
}

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
    ids: View,
    soft: View,
    normed: View,
    act: View,
    sc: View,
}

/// A DiffusionGemma generation's state on the GPU: the prompt's KV cache and the canvas step.
pub struct DiffusionSession {
    model: Arc<GpuDiffusion>,
    session: GpuSession,
    canvas: CanvasBuffers,
    scratch: ScScratch,
    /// The dispatches before a canvas step: without self-conditioning, and with it per
    /// temperature (their parameters differ), built on first use.
    plain: Vec<Dispatch>,
    conditioned: HashMap<u32, Vec<Dispatch>>,
}

impl DiffusionSession {
    /// A session of `context` positions (the prompt, the blocks and one canvas).
    pub fn new(model: Arc<GpuDiffusion>, context: usize) -> Result<Self, DiffusionError> {
        let rows = model.cfg.canvas_length;
        let opts = SessionOptions {
            context,
            max_batch: rows.max(512),
        };
        let mut session = GpuSession::new(model.text.clone(), opts)?;
        let canvas = session.prepare_canvas(rows)?;
        let ctx = &model.text.ctx;
        let c = &model.cfg.text;
        let ff = model.sc.down.cols;
        let buf = |name: &str, floats: u64| View::of(&ctx.storage(name, floats * 4));
        let (r, d) = (rows as u64, c.n_embd as u64);
        let scratch = ScScratch {
            ids: buf("canvas ids", r),
            soft: buf("sc soft", r * d),
            normed: buf("sc normed", r * d),
            act: buf("sc act", r * ff),
            sc: buf("sc out", r * d),
        };
        let mut s = Self {
            model,
            session,
            canvas,
            scratch,
            plain: Vec::new(),
            conditioned: HashMap::new(),
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

    /// Reads `tokens` into the cache with the causal encoder (the prompt, or a finished
    /// block).
    pub async fn encode(&mut self, tokens: &[u32]) -> Result<(), DiffusionError> {
        let span = tracing::info_span!("encode", tokens = tokens.len());
        let _e = span.enter();
        self.session.feed(tokens).await?;
        Ok(())
    }

    /// The dispatches that write the canvas rows' input from the ids in `scratch.ids`: the
    /// scaled embeddings, plus (at temperature `t`) the self-conditioning signal of the
    /// logits in the canvas buffer, then the norm.
    fn input_dispatches(&self, t: Option<f32>) -> Result<Vec<Dispatch>, GpuError> {
        let (m, ctx) = (&self.model, &*self.model.text.ctx);
        let c = &m.cfg.text;
        let (rows, d) = (self.canvas.rows as u32, c.n_embd as u32);
        let (vocab, s) = (c.n_vocab as u32, &self.scratch);
        let input = &self.canvas.input;
        let mut out = ops::embed(
            ctx,
            m.text.token_embd(),
            &s.ids,
            input,
            rows,
            c.embed_scale,
            EmbedOut::Write,
        )?;
        if let Some(t) = t {
            let logits = Tensor::new(&self.canvas.logits, &[rows, vocab])?;
            out.push(ops::rows(
                ctx,
                RowOp::Softmax { scale: 1.0 / t },
                Affine::default(),
                &logits,
                &logits,
            )?);
            let product = |w: &GpuWeight, x: &View, y: &View, out: MatvecOut<'_>, y_stride| {
                ops::matmul(
                    ctx,
                    w,
                    &MatmulArgs {
                        x,
                        y,
                        m: rows,
                        x_stride: w.cols as u32,
                        y_stride,
                        out,
                        y_offset: 0,
                        partials: None,
                    },
                )
            };
            let rows_out = MatvecOut::Rows { softcap: 0.0 };
            out.extend(product(
                &m.sc.embd_t,
                &self.canvas.logits,
                &s.soft,
                rows_out,
                d,
            )?);
            // The soft embeddings are `softmax(z) E sqrt(d)`: RMSNorm of `x sqrt(d)` is that
            // of x with eps / d.
            out.push(ops::rms_norm(
                ctx,
                RmsNorm {
                    x: &s.soft,
                    out: NormOut::To(&s.normed),
                    weight: Some(&m.sc.pre_norm),
                    rows,
                    dim: d,
                    x_stride: d,
                    eps: c.eps / d as f32,
                },
            )?);
            let ff = m.sc.down.cols as u32;
            out.extend(product(
                &m.sc.gate_up,
                &s.normed,
                &s.act,
                MatvecOut::Geglu,
                ff,
            )?);
            out.extend(product(&m.sc.down, &s.act, &s.sc, rows_out, d)?);
            out.push(ops::elementwise(
                ctx,
                Elementwise::Add(&s.sc),
                input,
                rows * d,
            )?);
        }
        out.push(ops::rms_norm(
            ctx,
            RmsNorm {
                x: input,
                out: NormOut::InPlace,
                weight: None,
                rows,
                dim: d,
                x_stride: d,
                eps: c.eps,
            },
        )?);
        Ok(out)
    }

    /// One denoising step over `canvas` (the block's current tokens), after the cache's
    /// position: its logits stay in the canvas buffer ([`DiffusionSession::logits`]).
    pub async fn denoise(
        &mut self,
        canvas: &[u32],
        sc: SelfConditioning<'_>,
    ) -> Result<(), DiffusionError> {
        let span = tracing::debug_span!("denoise", canvas = canvas.len());
        let _e = span.enter();
        let c = &self.model.cfg.text;
        let rows = self.canvas.rows;
        if canvas.len() != rows {
            return Err(DiffusionError::Input(format!(
                "a canvas of {} tokens (the model's is {rows})",
                canvas.len()
            )));
        }
        if let Some(&t) = canvas.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(DiffusionError::Input(format!(
                "canvas token {t} of {}",
                c.n_vocab
            )));
        }
        let ctx = self.model.text.ctx.clone();
        let temperature = match sc {
            SelfConditioning::None => None,
            SelfConditioning::Previous { temperature } => Some(temperature),
            SelfConditioning::Given(z) => {
                if z.len() != rows * c.n_vocab {
                    return Err(DiffusionError::Input(format!(
                        "{} self-conditioning logits for {rows} rows of {}",
                        z.len(),
                        c.n_vocab
                    )));
                }
                ctx.write(
                    &self.canvas.logits.buffer,
                    self.canvas.logits.offset,
                    bytemuck::cast_slice(z),
                );
                Some(1.0)
            }
        };
        if let Some(t) = temperature.filter(|t| !(t.is_finite() && *t > 0.0)) {
            return Err(DiffusionError::Input(format!(
                "self-conditioning temperature {t}"
            )));
        }
        ctx.write(
            &self.scratch.ids.buffer,
            self.scratch.ids.offset,
            bytemuck::cast_slice(canvas),
        );
        let before = match temperature {
            None => &self.plain,
            Some(t) => {
                if !self.conditioned.contains_key(&t.to_bits()) {
                    let d = self.input_dispatches(Some(t))?;
                    self.conditioned.insert(t.to_bits(), d);
                }
                &self.conditioned[&t.to_bits()]
            }
        };
        let before = before.clone();
        self.session.canvas_step(&before, &[]).await?;
        Ok(())
    }

    /// The last step's logits, `[canvas, vocab]` row-major.
    pub async fn logits(&self) -> Result<Vec<f32>, DiffusionError> {
        Ok(self.model.text.ctx.read_f32(&self.canvas.logits).await?)
    }
}
