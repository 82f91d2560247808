//! `cargo xtask bench-vision --mmproj P [--model M]`: the vision tower's speed on an image of a
//! given soft-token budget: preprocessing (resize, patches) on the CPU, the encode on the GPU
//! (medians over repetitions, after a warm-up; also split into the CPU's part up to the last
//! submission and the time until the GPU is done, soft tokens left on the GPU), GPU time per
//! kernel with `--profile`, and with
//! `--model` the time to first token of a chat turn holding the image and a 20-word question.

use std::sync::Arc;
use std::time::Instant;

use wgemma::{GenerateRequest, ImageInput, LoadOptions, Message, Model, Prompt};
use wgemma_gguf::{Gguf, MmapSource, TensorSource};
use wgemma_kernels::{ContextOptions, GpuContext};
use wgemma_vision::preprocess::RgbImage;
use wgemma_vision::{VisionConfig, VisionTower, patches};

use crate::TaskError;
use crate::timing::{first_token_ms, median, print, profile_json, timed_reps};

#[derive(clap::Args)]
pub struct Args {
    /// The vision tower: an mmproj GGUF (`cargo xtask synth --preset e2b-mmproj`).
    #[arg(long)]
    mmproj: std::path::PathBuf,
    /// A text model to time the first token of an image prompt with.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Image size as WIDTHxHEIGHT (1008x624: 273 soft tokens at the 280 budget; 1920x1344:
    /// 1120 at 1120).
    #[arg(long, default_value = "1008x624")]
    size: String,
    /// Soft-token budget (70, 140, 280, 560, 1120).
    #[arg(long, default_value_t = 280)]
    budget: u32,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Also time every kernel of one encode (GPU timestamps).
    #[arg(long)]
    profile: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// A smooth synthetic picture of `w x h` (what is in it does not change the work).
fn picture(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        image_rgb([
            (x * 255 / w.max(1)) as u8,
            (y * 255 / h.max(1)) as u8,
            ((x ^ y) & 255) as u8,
        ])
    })
}

fn image_rgb(c: [u8; 3]) -> wgemma_vision::preprocess::Rgb<u8> {
    wgemma_vision::preprocess::Rgb(c)
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let (w, h) = a
        .size
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)))
        .ok_or_else(|| format!("--size {}: expected WIDTHxHEIGHT", a.size))?;
    let ctx = Arc::new(pollster::block_on(GpuContext::new(
        ContextOptions::default().with_env(),
    ))?);
    let src = MmapSource::open(&a.mmproj)?;
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&src))?)?;
    let cfg = VisionConfig::from_gguf(&g)?.ok_or("the file holds no vision tower")?;
    let tower = pollster::block_on(VisionTower::load(ctx.clone(), &g, &cfg, &src, |_, _| {}))?;
    let img = picture(w, h);
    let t = Instant::now();
    let p = patches(&img, a.budget)?;
    let preprocess_ms = t.elapsed().as_secs_f64() * 1e3;
    let (first_encode_ms, encode) = timed_reps(a.reps, || {
        pollster::block_on(tower.encode_to_vec(&p))?;
        Ok(())
    })?;
    let (submit, unread) = submit_and_wait(&tower, &ctx, &p, a.reps)?;
    let profile = if a.profile {
        pollster::block_on(tower.profile(&p))?
    } else {
        None
    };
    let ttft = match &a.model {
        Some(m) => Some(first_token(m, &a.mmproj, &ctx, &img, &a)?),
        None => None,
    };
    let out = serde_json::json!({
        "adapter": ctx.info.name,
        "image": format!("{w}x{h}"),
        "budget": a.budget,
        "patches": p.rows * p.cols,
        "soft_tokens": p.soft_tokens(),
        "preprocess_ms": preprocess_ms,
        "first_encode_ms": first_encode_ms,
        "encode_ms": median(encode.clone()),
        "encode_ms_each": encode,
        "encode_submit_ms": median(submit),
        "encode_unread_ms": median(unread),
        "ttft_ms": ttft.as_ref().map(|t| t.0),
        "ttft_encode_ms": ttft.as_ref().map(|t| t.1),
        "profile": profile_json(profile),
    });
    print(&out, a.json)
}

/// Where an encode's time goes, over `reps` encodes: the times until the work is submitted
/// (the CPU's part: the patches' upload, the recording) and until the GPU is done with it,
/// the soft tokens left on the GPU (as a prompt uses them).
fn submit_and_wait(
    tower: &VisionTower,
    ctx: &GpuContext,
    p: &wgemma_vision::Patches,
    reps: usize,
) -> Result<(Vec<f64>, Vec<f64>), TaskError> {
    let (mut submit, mut unread) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        let encoded = pollster::block_on(tower.encode(p))?;
        submit.push(t.elapsed().as_secs_f64() * 1e3);
        ctx.wait()?;
        unread.push(t.elapsed().as_secs_f64() * 1e3);
        drop(encoded);
    }
    Ok((submit, unread))
}

/// Median time to the first token (and the encode's part of it) of a chat turn with the image
/// and a 20-word question, each from an empty cache.
fn first_token(
    model: &std::path::Path,
    mmproj: &std::path::Path,
    ctx: &Arc<GpuContext>,
    img: &RgbImage,
    a: &Args,
) -> Result<(f64, f64), TaskError> {
    let opts = LoadOptions {
        context: Some(ctx.clone()),
        mmproj: Some(mmproj.to_path_buf()),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(model, opts))?;
    let mut session = model.session(wgemma::SessionOptions {
        context: 2048,
        max_batch: 512,
    })?;
    let question = "Describe this picture in detail: what do you see, which colours and shapes, \
                    and is anything unusual there?";
    first_token_ms(&mut session, a.reps, || {
        let mut req =
            GenerateRequest::new(Prompt::Chat(vec![Message::user(question).with_images(1)]));
        req.images = vec![ImageInput::from_rgb(img.clone()).with_budget(a.budget)];
        req
    })
}
