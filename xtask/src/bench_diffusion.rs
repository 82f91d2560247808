//! `cargo xtask bench-diffusion --model M`: DiffusionGemma's speed. The prompt is read, then
//! one block is denoised for a fixed number of steps (the stop rule off, so every run does
//! the same work), each step timed to its readback: the step time, the canvas tokens per
//! second within a step, and the block's effective tokens per second at that step count.

use std::sync::Arc;
use std::time::Instant;

use wgemma_diffusion::{DiffusionConfig, DiffusionSession, GpuDiffusion, SeededRng};
use wgemma_gguf::MmapSource;
use wgemma_kernels::{ContextOptions, GpuContext};

use crate::TaskError;
use crate::bench_e2e::synthetic_prompt;
use crate::timing::median;

#[derive(clap::Args)]
pub struct Args {
    /// A `diffusion-gemma` GGUF.
    #[arg(long)]
    model: std::path::PathBuf,
    /// Prompt tokens.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Denoising steps of the block.
    #[arg(long, default_value_t = 24)]
    steps: u32,
    /// Blocks timed (each after the prompt, from a fresh cache).
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Also time every kernel of one step (GPU timestamps), to stderr.
    #[arg(long)]
    profile: bool,
    /// With `--profile`, also every dispatch of that step (label, workgroups, GPU time).
    #[arg(long)]
    profile_each: bool,
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let ctx = Arc::new(pollster::block_on(GpuContext::new(
        ContextOptions::default().with_env(),
    ))?);
    let header = wgemma_gguf::read_file_header(&a.model)?;
    let cfg = DiffusionConfig::from_gguf(&header)?;
    let src = MmapSource::open(&a.model)?;
    let t = Instant::now();
    let opts = wgemma_text::LoadOptions::default();
    let load = GpuDiffusion::load(ctx.clone(), &header, &cfg, &src, opts, |_| {});
    let model = Arc::new(pollster::block_on(load)?);
    let load_s = t.elapsed().as_secs_f64();
    let canvas = cfg.canvas_length;
    let prompt = synthetic_prompt(a.prompt, 1, cfg.text.n_vocab as u32);
    let mut rule = cfg.sampler;
    rule.max_steps = a.steps;
    // Never stop early: every step of every run is timed.
    rule.confidence_threshold = 0.0;
    let mut s = DiffusionSession::new(model, a.prompt + canvas)?;
    let (mut encode_ms, mut step_ms): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    let mut rng = SeededRng::new(7);
    for rep in 0..a.reps.max(1) {
        s.rewind(0)?;
        let t = Instant::now();
        pollster::block_on(s.encode(&prompt))?;
        // The encode is submitted; the first step's readback waits for it too.
        let mut first = vec![0u32; canvas];
        wgemma_diffusion::SamplerRng::canvas(&mut rng, &mut first, cfg.text.n_vocab as u32)?;
        s.start_block(&first)?;
        for k in 0..a.steps {
            let t_step = Instant::now();
            pollster::block_on(s.step(k, &rule, &mut rng))?;
            let ms = t_step.elapsed().as_secs_f64() * 1e3;
            if k == 0 {
                encode_ms.push(t.elapsed().as_secs_f64() * 1e3 - ms);
            }
            // The first run's first steps build pipelines.
            if rep > 0 || k >= 2 {
                step_ms.push(ms);
            }
        }
    }
    if step_ms.is_empty() {
        return Err(format!(
            "no step was timed: the first run's first two steps build pipelines, so ask for \
             more than 2 steps or more than 1 run (--steps {}, --reps {})",
            a.steps, a.reps
        )
        .into());
    }
    if a.profile {
        profile_step(&ctx, &mut s, &rule, &mut rng, a.profile_each)?;
    }
    let step = median(step_ms);
    let in_step = canvas as f64 / (step / 1e3);
    let effective = canvas as f64 / (step * f64::from(a.steps) / 1e3);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": a.model.display().to_string(),
                "adapter": ctx.info.name,
                "prompt_tokens": a.prompt,
                "canvas": canvas,
                "steps": a.steps,
                "load_s": load_s,
                "encode_ms": median(encode_ms.clone()),
                "step_ms": step,
                "in_step_tok_s": in_step,
                "effective_tok_s": effective,
            })
        );
    } else {
        println!(
            "{}: load {load_s:.1} s, prompt of {} in {:.1} ms, {step:.2} ms a step of {canvas}: \
             {in_step:.0} tok/s in-step, {effective:.1} tok/s effective at {} steps",
            ctx.info.name,
            a.prompt,
            median(encode_ms.clone()),
            a.steps
        );
    }
    Ok(())
}

/// The kernels of one more step of the block, GPU time per kernel, to stderr.
fn profile_step(
    ctx: &GpuContext,
    s: &mut DiffusionSession,
    rule: &wgemma_diffusion::EntropyBound,
    rng: &mut SeededRng,
    each_dispatch: bool,
) -> Result<(), TaskError> {
    let Some(mut profiler) = wgemma_kernels::Profiler::new(ctx, 4096) else {
        eprintln!("no timestamp queries on this GPU: no profile");
        return Ok(());
    };
    pollster::block_on(s.step_profiled(1, rule, rng, Some(&mut profiler)))?;
    let each = pollster::block_on(profiler.read_each(ctx))?;
    if each_dispatch {
        for (i, (label, workgroups, us)) in each.iter().enumerate() {
            eprintln!("  {i:4} {label:20} {workgroups:8} workgroups {us:9.1} us");
        }
    }
    let totals = wgemma_kernels::Profiler::totals(&each);
    let all: f64 = totals.iter().map(|t| t.2).sum();
    eprintln!(
        "one denoising step: {:.2} ms of GPU time over {} dispatches",
        all / 1e3,
        each.len()
    );
    for (name, n, us) in totals {
        eprintln!(
            "  {name:<28} {n:>5} {:>9.1} us {:>5.1}%",
            us,
            100.0 * us / all.max(1e-9)
        );
    }
    Ok(())
}
