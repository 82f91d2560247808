//! DiffusionGemma's weights on the GPU: the text crate's layers, the self-conditioning block
//! and the transposed embedding table its product reads.

use std::sync::Arc;

use wgemma_gguf::{GgmlType, Gguf, RangeSource, TensorInfo, dequantize_to_vec};
use wgemma_kernels::store::{StoreError, WeightStore};
use wgemma_kernels::{GpuContext, GpuError, GpuWeight, View};
use wgemma_text::forward::{GateUp, load_gate_up};
use wgemma_text::{ForwardError, GpuModel, LoadError, LoadOptions, LoadProgress};

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
    #[error("the sampler's random streams ran out")]
    StreamsExhausted,
    #[error(
        "the context is full: {need} positions needed (the prompt and whole blocks), the session holds {capacity}"
    )]
    ContextOverflow { need: usize, capacity: usize },
}

/// The self-conditioning block's weights on the GPU.
pub(crate) struct GpuSelfCond {
    pub pre_norm: View,
    pub gate_up: GateUp,
    pub down: GpuWeight,
    /// The embedding table transposed (`n_embd` rows of `n_vocab`; f32 for an f32 table, else
    /// f16), so that `softmax(z) E` is a product like any other.
    pub embd_t: GpuWeight,
}

/// A DiffusionGemma model's weights on the GPU.
pub struct GpuDiffusion {
    pub cfg: DiffusionConfig,
    pub text: Arc<GpuModel>,
    pub(crate) sc: GpuSelfCond,
}

/// Rows of the embedding table read and transposed at a time.
const TRANSPOSE_ROWS: u64 = 4096;

/// Threads the transposition takes (natively all the machine's; in the browser one).
fn transpose_threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
    #[cfg(target_arch = "wasm32")]
    {
        1
    }
}

/// Writes `values` (rows of `d`, table rows `first..` of a table of `vocab` rows) into their
/// columns of the transposed table `out` (`d` rows of `vocab`), through `conv`. Each output
/// row's stretch is written in one run; threads take whole output rows.
fn transpose_into<T: Copy + Send>(
    values: &[f32],
    d: usize,
    (first, vocab): (usize, usize),
    out: &mut [T],
    conv: impl Fn(f32) -> T + Sync,
) {
    let rows = values.len() / d.max(1);
    let fill = |j0: usize, block: &mut [T]| {
        for (jj, row) in block.chunks_mut(vocab).enumerate() {
            let j = j0 + jj;
            for (r, o) in row[first..first + rows].iter_mut().enumerate() {
                *o = conv(values[r * d + j]);
            }
        }
    };
    let per = d.div_ceil(transpose_threads()).max(1);
    if per >= d {
        fill(0, out);
        return;
    }
    std::thread::scope(|s| {
        for (i, block) in out.chunks_mut(per * vocab).enumerate() {
            let fill = &fill;
            s.spawn(move || fill(i * per, block));
        }
    });
}

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
        let at = (first as usize, vocab as usize);
        if f32_table {
            transpose_into(&values, d as usize, at, &mut wide, |x| x);
        } else {
            transpose_into(&values, d as usize, at, &mut narrow, half::f16::from_f32);
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
        let gate_up = load_gate_up(&mut ld, t.gate, t.up)?;
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
