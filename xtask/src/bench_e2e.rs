//! `cargo xtask bench-e2e --model M`: load, warm up, then prefill and decode several times;
//! medians of prefill tok/s, decode tok/s and time to first token, GPU memory held, and the
//! decode step's time against the bandwidth floor (weight bytes per token / 3.0 TB/s).

use std::sync::Arc;
use std::time::Instant;

use wgemma_gguf::{Gguf, MmapSource, TensorSource};
use wgemma_kernels::{ContextOptions, GpuContext, Profiler};
use wgemma_text::{
    ExpertPlacement, GpuModel, GpuSession, LoadOptions, PleRows, SamplingParams, SessionOptions,
    TextConfig,
};

use crate::TaskError;
use crate::timing::median;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file.
    #[arg(long)]
    model: std::path::PathBuf,
    /// Prompt tokens per prefill.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Tokens decoded per repetition.
    #[arg(long, default_value_t = 256)]
    decode: usize,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Bandwidth the floor assumes, in TB/s (3.0: an H100's measured WGSL read rate).
    #[arg(long, default_value_t = 3.0)]
    floor_tbps: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Also time every kernel of one prefill and one decode step (GPU timestamps).
    #[arg(long)]
    profile: bool,
    /// With --profile, also list the prefill's and the decode step's dispatches in order
    /// (label, workgroups, microseconds).
    #[arg(long)]
    profile_each: bool,
    /// Stream a mixture-of-experts model's experts from host memory layer by layer.
    #[arg(long)]
    stream_experts: bool,
    /// Upload Gemma 4's per-layer embedding table whole instead of staging a row per token.
    #[arg(long)]
    table_on_gpu: bool,
    /// Apply a random LoRA adapter of this rank to every projection (what an adapter costs).
    #[arg(long)]
    lora_rank: Option<usize>,
}

/// A random adapter of rank `rank` on every projection `model` has.
fn random_adapter(model: &GpuModel, rank: usize) -> wgemma_text::lora::LoraAdapter {
    use wgemma_text::lora::{LoraAdapter, LoraPair, Proj};
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut values = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 * 0.02 - 0.01
            })
            .collect()
    };
    let mut adapter = LoraAdapter::default();
    for il in 0..model.cfg.n_layer {
        for p in Proj::ALL {
            if !model.has_projection(il, p) {
                continue;
            }
            let (rows, cols) = p.shape(&model.cfg, il);
            let pair = LoraPair {
                a: values(rank * cols),
                b: values(rows * rank),
                rank,
                cols,
                rows,
                scale: 1.0,
            };
            adapter.pairs.insert((il, p), pair);
        }
    }
    adapter
}

/// A model loaded for a benchmark, with what the reports name.
pub(crate) struct Loaded {
    pub ctx: Arc<GpuContext>,
    pub model: Arc<GpuModel>,
    pub name: String,
    pub load_s: f64,
}

/// Where a benchmark's model keeps what may live off the GPU.
#[derive(Clone, Copy, Default)]
pub(crate) struct Placement {
    /// A mixture of experts' experts streamed from host memory layer by layer.
    pub stream_experts: bool,
    /// Gemma 4's per-layer embedding table uploaded whole ([`PleRows::Gpu`]).
    pub table_on_gpu: bool,
}

/// Loads `path` onto the GPU as `placement` says.
pub(crate) fn load(path: &std::path::Path, placement: Placement) -> Result<Loaded, TaskError> {
    let ctx = Arc::new(pollster::block_on(GpuContext::new(
        ContextOptions::default().with_env(),
    ))?);
    let src = Arc::new(MmapSource::open(path)?);
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&*src))?)?;
    let cfg = TextConfig::from_gguf(&g)?;
    let t = Instant::now();
    let experts = if placement.stream_experts {
        ExpertPlacement::Streamed
    } else {
        ExpertPlacement::Auto
    };
    let model = Arc::new(pollster::block_on(GpuModel::load_with(
        ctx.clone(),
        &g,
        &cfg,
        &*src,
        Some(if placement.table_on_gpu {
            PleRows::Gpu
        } else {
            PleRows::Mapped(src.clone())
        }),
        LoadOptions {
            experts,
            ..LoadOptions::default()
        },
        |_| {},
    ))?);
    ctx.wait()?;
    let name = g
        .metadata
        .opt_str("general.name")?
        .unwrap_or("?")
        .to_string();
    Ok(Loaded {
        ctx,
        model,
        name,
        load_s: t.elapsed().as_secs_f64(),
    })
}

/// A synthetic prompt of `n` tokens (`seed` varies it).
pub(crate) fn synthetic_prompt(n: usize, seed: u32, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + 13 + seed * 104_729) % vocab.max(1))
        .collect()
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let Loaded {
        ctx,
        model,
        name,
        load_s,
    } = load(
        &a.model,
        Placement {
            stream_experts: a.stream_experts,
            table_on_gpu: a.table_on_gpu,
        },
    )?;
    let cfg = &model.cfg;
    let opts = SessionOptions {
        context: a.prompt + a.decode + 8,
        max_batch: a.prompt.min(512),
    };
    let mut session = GpuSession::new(model.clone(), opts)?;
    if let Some(rank) = a.lora_rank {
        let adapter = model.prepare_adapter(&random_adapter(&model, rank))?;
        session.set_adapters(&[(adapter, 1.0)])?;
    }
    let vocab = cfg.n_vocab as u32;
    let prompt = synthetic_prompt(a.prompt, 0, vocab);
    let greedy = SamplingParams::default();
    let (mut prefill, mut ttft, mut decode, mut cpu_step) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut prefill_cpu = Vec::new();
    let mut streamed = Vec::new();
    for rep in 0..a.reps + 1 {
        // Prefill alone: every prompt position through the batched kernels.
        session.rewind(0)?;
        let t0 = Instant::now();
        pollster::block_on(session.feed(&prompt))?;
        let prefill_cpu_s = t0.elapsed().as_secs_f64();
        ctx.wait()?;
        let prefill_s = t0.elapsed().as_secs_f64();
        // Generation as the runtime does it: prefill and first sample, then decode steps
        // queued back to back while earlier tokens are read.
        session.rewind(0)?;
        let t0 = Instant::now();
        pollster::block_on(session.begin(&prompt, &greedy, 0))?;
        pollster::block_on(session.next_token())?;
        let first_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let streamed_before = session.experts_streamed_bytes();
        let (mut submitted, mut read) = (1u32, 1usize);
        let mut record_s = 0.0;
        while read < a.decode {
            while session.in_flight() < session.pipeline_depth() && (submitted as usize) < a.decode
            {
                let tr = Instant::now();
                pollster::block_on(session.advance(&greedy, submitted))?;
                record_s += tr.elapsed().as_secs_f64();
                submitted += 1;
            }
            pollster::block_on(session.next_token())?;
            read += 1;
        }
        let decode_s = t1.elapsed().as_secs_f64();
        // The first repetition warms pipelines and caches.
        if rep > 0 {
            cpu_step.push(record_s / f64::from(submitted - 1) * 1e3);
            prefill.push(a.prompt as f64 / prefill_s);
            prefill_cpu.push(prefill_cpu_s * 1e3);
            ttft.push(first_s * 1e3);
            decode.push((a.decode - 1) as f64 / decode_s);
            let bytes = session.experts_streamed_bytes() - streamed_before;
            streamed.push(bytes as f64 / f64::from(submitted - 1).max(1.0));
        }
    }
    let streamed_mib = median(streamed) / f64::from(1 << 20);
    let prefill_cpu = median(prefill_cpu);
    let (prefill, ttft, decode, cpu_step) = (
        median(prefill),
        median(ttft),
        median(decode),
        median(cpu_step),
    );
    if a.profile {
        profile(&ctx, &mut session, &prompt, a.profile_each)?;
    }
    let bytes_per_token = model.bytes_per_token();
    let floor_ms = bytes_per_token as f64 / (a.floor_tbps * 1e12) * 1e3;
    let step_ms = 1e3 / decode;
    let memory = model.gpu_bytes() + session.gpu_bytes() + session.arena_bytes();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": name,
                "adapter": ctx.info.name,
                "backend": format!("{:?}", ctx.info.backend),
                "prompt_tokens": a.prompt,
                "decode_tokens": a.decode,
                "prefill_tok_s": prefill,
                "decode_tok_s": decode,
                "ttft_ms": ttft,
                "prefill_cpu_ms": prefill_cpu,
                "gpu_memory_bytes": memory,
                "weight_bytes_per_token": bytes_per_token,
                "floor_ms": floor_ms,
                "decode_ms": step_ms,
                "cpu_record_ms": cpu_step,
                "floor_fraction": floor_ms / step_ms,
                "load_s": load_s,
                "experts_streamed_mib_per_token": streamed_mib,
            })
        );
    } else {
        println!(
            "model            {name} on {} ({:?})",
            ctx.info.name, ctx.info.backend
        );
        println!(
            "prefill          {prefill:.1} tok/s ({} tokens, {prefill_cpu:.1} ms of it preparing and recording on the CPU)",
            a.prompt
        );
        println!(
            "decode           {decode:.1} tok/s ({step_ms:.3} ms/token, {cpu_step:.3} ms of it recording on the CPU)"
        );
        println!("time to first    {ttft:.1} ms");
        if model.streams_experts() {
            println!("experts streamed {streamed_mib:.1} MiB per decoded token");
        }
        println!(
            "gpu memory       {:.1} MiB",
            memory as f64 / (1 << 20) as f64
        );
        println!(
            "floor            {:.3} ms/token ({:.1} MB at {} TB/s): decode runs at {:.1}% of it",
            floor_ms,
            bytes_per_token as f64 / 1e6,
            a.floor_tbps,
            100.0 * floor_ms / step_ms
        );
        println!("load             {load_s:.2} s");
    }
    Ok(())
}

/// Prints the GPU time of every kernel in one prefill and one decode step, to stderr.
fn profile(
    ctx: &GpuContext,
    session: &mut GpuSession,
    prompt: &[u32],
    each: bool,
) -> Result<(), TaskError> {
    let Some(mut profiler) = Profiler::new(ctx, 4096) else {
        eprintln!("profile: the adapter has no timestamp queries");
        return Ok(());
    };
    for (what, tokens) in [("prefill", prompt), ("decode", &prompt[..1])] {
        if what == "prefill" {
            session.rewind(0)?;
        }
        pollster::block_on(session.feed_profiled(tokens, &[], Some(&mut profiler)))?;
        let each_row = pollster::block_on(profiler.read_each(ctx))?;
        if each {
            for (i, (label, workgroups, us)) in each_row.iter().enumerate() {
                eprintln!("  {i:4} {label:16} {workgroups:7} workgroups {us:8.1} us");
            }
        }
        let rows = Profiler::totals(&each_row);
        let total: f64 = rows.iter().map(|r| r.2).sum();
        let how = if profiler.in_pass() {
            "timed inside the step's pass"
        } else {
            "each in its own pass"
        };
        eprintln!(
            "{what} ({} tokens): {total:.0} us of kernels, {how}",
            tokens.len()
        );
        for (label, count, us) in rows {
            eprintln!(
                "  {label:16} {count:5} x {:9.1} us = {us:10.1} us",
                us / count as f64
            );
        }
    }
    // The same decode step fed back to back with no token read in between: GPU time per step
    // (the CPU's recording overlaps it), against which the pipelined decode's time per token
    // shows what reading each token back costs.
    let steps = 32.min(session.capacity().saturating_sub(session.position() + 1)) as u32;
    if steps == 0 {
        return Ok(());
    }
    pollster::block_on(session.feed(&prompt[..1]))?;
    ctx.wait()?;
    let t = Instant::now();
    for _ in 0..steps {
        pollster::block_on(session.feed(&prompt[..1]))?;
    }
    ctx.wait()?;
    eprintln!(
        "decode steps back to back, no readback: {:.3} ms a step",
        t.elapsed().as_secs_f64() * 1e3 / f64::from(steps)
    );
    Ok(())
}
