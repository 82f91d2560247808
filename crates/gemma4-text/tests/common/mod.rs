//! Helpers the integration tests share: the GPU context (a missing adapter fails under CI),
//! model loading into both forwards, and the error measure.

#![allow(dead_code)]

use std::sync::Arc;

use wgemma_gguf::{BytesSource, Gguf, TensorSource};
use wgemma_kernels::GpuContext;
use wgemma_text::{
    CpuModel, GpuModel, GpuSession, PleRows, SamplingParams, SessionOptions, TextConfig,
};

/// Samples `n` tokens after `prompt`, keeping as many steps queued as the session allows
/// (a server's loop).
pub fn generate_pipelined(
    s: &mut GpuSession,
    prompt: &[u32],
    p: &SamplingParams,
    n: u32,
) -> Vec<u32> {
    pollster::block_on(s.begin(prompt, p, 0)).unwrap();
    let (mut got, mut submitted) = (Vec::new(), 1);
    while got.len() < n as usize {
        while s.in_flight() < s.pipeline_depth() && submitted < n {
            pollster::block_on(s.advance(p, submitted)).unwrap();
            submitted += 1;
        }
        got.push(pollster::block_on(s.next_token()).unwrap());
    }
    got
}

/// The test binary's context (`wgemma_test_support::gpu`).
pub fn ctx() -> Option<Arc<GpuContext>> {
    wgemma_test_support::gpu().cloned()
}

/// Largest difference relative to the reference's largest magnitude.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    wgemma_test_support::rel_err_max(got, want)
}

pub struct Loaded {
    pub cpu: CpuModel,
    pub gpu: Arc<GpuModel>,
}

pub fn load(bytes: Vec<u8>, ctx: Arc<GpuContext>) -> Loaded {
    let g = Gguf::parse(&bytes).unwrap();
    let cfg = TextConfig::from_gguf(&g).unwrap();
    let src = Arc::new(BytesSource::new(bytes.clone()));
    Loaded {
        cpu: CpuModel::load(&g, &cfg, src.clone()).unwrap(),
        gpu: gpu_model(ctx, &g, &cfg, &src),
    }
}

/// The model's weights on the GPU, read from `src` (which also serves rows at run time).
pub fn gpu_model<S: TensorSource + 'static>(
    ctx: Arc<GpuContext>,
    g: &Gguf,
    cfg: &TextConfig,
    src: &Arc<S>,
) -> Arc<GpuModel> {
    let rows = PleRows::Mapped(src.clone());
    Arc::new(pollster::block_on(GpuModel::load(ctx, g, cfg, &**src, Some(rows), |_| {})).unwrap())
}

/// The model's weights on the GPU, with the per-layer embedding rows read as the browser
/// reads them: fetched asynchronously ahead of the steps that feed their tokens.
pub fn gpu_model_fetching_rows(ctx: Arc<GpuContext>, bytes: Vec<u8>) -> Arc<GpuModel> {
    gpu_model_with_rows(ctx, bytes, |src| PleRows::Fetched(src))
}

/// The model's weights on the GPU with its per-layer embedding table uploaded whole.
pub fn gpu_model_table_on_gpu(ctx: Arc<GpuContext>, bytes: Vec<u8>) -> Arc<GpuModel> {
    gpu_model_with_rows(ctx, bytes, |_| PleRows::Gpu)
}

fn gpu_model_with_rows(
    ctx: Arc<GpuContext>,
    bytes: Vec<u8>,
    rows: impl FnOnce(Arc<BytesSource>) -> PleRows,
) -> Arc<GpuModel> {
    let g = Gguf::parse(&bytes).unwrap();
    let cfg = TextConfig::from_gguf(&g).unwrap();
    let src = Arc::new(BytesSource::new(bytes.clone()));
    let rows = rows(src.clone());
    Arc::new(pollster::block_on(GpuModel::load(ctx, &g, &cfg, &*src, Some(rows), |_| {})).unwrap())
}

/// A small session for teacher forcing: prompts run in chunks of 8.
pub fn scoring_session(model: &Arc<GpuModel>) -> GpuSession {
    session_in_chunks(model, 8)
}

/// A session of 64 positions whose prompts run in chunks of `max_batch` tokens.
pub fn session_in_chunks(model: &Arc<GpuModel>, max_batch: usize) -> GpuSession {
    let opts = SessionOptions {
        context: 64,
        max_batch,
    };
    GpuSession::new(model.clone(), opts).unwrap()
}
