//! `cargo xtask bench-audio --mmproj P [--model M] [--audio F]`: the audio tower's speed on a
//! clip (by default 30 s, one full chunk: 750 soft tokens): decoding and features on the CPU,
//! the encode on the GPU (medians over repetitions, after a warm-up), GPU time per kernel with
//! `--profile`, and with `--model` the time to first token of a chat turn holding the clip and
//! a short question.

use std::sync::Arc;
use std::time::Instant;

use wgemma::{AudioInput, GenerateRequest, LoadOptions, Message, Model, Prompt};
use wgemma_audio::{AudioConfig, AudioTower};
use wgemma_gguf::{Gguf, MmapSource, TensorSource};
use wgemma_kernels::{ContextOptions, GpuContext};

use crate::TaskError;
use crate::timing::{first_token_ms, median, print, profile_json, timed_reps};

#[derive(clap::Args)]
pub struct Args {
    /// The audio tower: an mmproj GGUF (`cargo xtask synth --preset e2b-audio-mmproj`).
    #[arg(long)]
    mmproj: std::path::PathBuf,
    /// A text model to time the first token of an audio prompt with.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// The clip (WAV, FLAC, MP3, Ogg); without it, `--seconds` of synthetic sound.
    #[arg(long)]
    audio: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Also time every kernel of one encode (GPU timestamps).
    #[arg(long)]
    profile: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// `seconds` of a sweeping tone over a hum at 16 kHz (what it sounds like does not change the
/// work).
fn synthetic(seconds: f64) -> Vec<f32> {
    let n = (seconds * 16_000.0) as usize;
    (0..n)
        .map(|i| {
            let t = i as f64 / 16_000.0;
            (0.3 * (2.0 * std::f64::consts::PI * (300.0 + 40.0 * t) * t).sin()
                + 0.1 * (2.0 * std::f64::consts::PI * 97.0 * t).sin()) as f32
        })
        .collect()
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let ctx = Arc::new(pollster::block_on(GpuContext::new(
        ContextOptions::default().with_env(),
    ))?);
    let src = MmapSource::open(&a.mmproj)?;
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&src))?)?;
    let cfg = AudioConfig::from_gguf(&g)?.ok_or("the file holds no audio tower")?;
    let tower = pollster::block_on(AudioTower::load(ctx.clone(), &g, &cfg, &src, |_, _| {}))?;
    let t = Instant::now();
    let clip = match &a.audio {
        Some(path) => AudioInput::from_bytes(&std::fs::read(path)?)?,
        None => AudioInput::from_samples(&synthetic(a.seconds), 16_000, 1)?,
    };
    let features_ms = t.elapsed().as_secs_f64() * 1e3;
    let chunk = &clip.chunks()[0];
    let (first_encode_ms, encode) = timed_reps(a.reps, || {
        pollster::block_on(tower.encode_to_vec(chunk))?;
        Ok(())
    })?;
    let profile = if a.profile {
        pollster::block_on(tower.profile(chunk))?
    } else {
        None
    };
    let ttft = match &a.model {
        Some(m) => Some(first_token(m, &a, &ctx, &clip)?),
        None => None,
    };
    let out = serde_json::json!({
        "adapter": ctx.info.name,
        "seconds": clip.duration_secs(),
        "chunks": clip.chunks().len(),
        "soft_tokens": clip.soft_tokens(),
        "features_ms": features_ms,
        "first_encode_ms": first_encode_ms,
        "encode_ms": median(encode.clone()),
        "encode_ms_each": encode,
        "ttft_ms": ttft.as_ref().map(|t| t.0),
        "ttft_encode_ms": ttft.as_ref().map(|t| t.1),
        "profile": profile_json(profile),
    });
    print(&out, a.json)
}

/// Median time to the first token (and the encode's part of it) of a chat turn with the clip
/// and a short question, each from an empty cache.
fn first_token(
    model: &std::path::Path,
    a: &Args,
    ctx: &Arc<GpuContext>,
    clip: &AudioInput,
) -> Result<(f64, f64), TaskError> {
    let opts = LoadOptions {
        context: Some(ctx.clone()),
        mmproj: Some(a.mmproj.clone()),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(model, opts))?;
    let mut session = model.session(wgemma::SessionOptions {
        context: 2048,
        max_batch: 1024,
    })?;
    first_token_ms(&mut session, a.reps, || {
        let message = Message::user("Transcribe this audio.").with_audio(1);
        let mut req = GenerateRequest::new(Prompt::Chat(vec![message]));
        req.audio = vec![clip.clone()];
        req
    })
}
