//! Helpers the integration tests share: the GPU context (a missing adapter fails under CI),
//! model loading into both forwards, and the error measure.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use wgemma_gguf::{BytesSource, Gguf, TensorSource};
use wgemma_kernels::{ContextOptions, GpuContext};
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
    s.begin(prompt, p, 0).unwrap();
    let (mut got, mut submitted) = (Vec::new(), 1);
    while got.len() < n as usize {
        while s.in_flight() < s.pipeline_depth() && submitted < n {
            s.advance(p, submitted).unwrap();
            submitted += 1;
        }
        got.push(pollster::block_on(s.next_token()).unwrap());
    }
    got
}

pub fn ctx() -> Option<Arc<GpuContext>> {
    static CTX: OnceLock<Option<Arc<GpuContext>>> = OnceLock::new();
    CTX.get_or_init(|| {
        match pollster::block_on(GpuContext::new(ContextOptions::default().with_env())) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI is set but no GPU adapter: {e}"
                );
                eprintln!("skipping GPU tests: {e}");
                None
            }
        }
    })
    .clone()
}

/// Largest difference relative to the reference's largest magnitude.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
        / scale
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
    let g = Gguf::parse(&bytes).unwrap();
    let cfg = TextConfig::from_gguf(&g).unwrap();
    let src = Arc::new(BytesSource::new(bytes.clone()));
    let rows = PleRows::Fetched(src.clone());
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
