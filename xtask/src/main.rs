//! `cargo xtask ...`: developer tasks that are too slow or too specialised for `cargo test`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_audio;
mod bench_batch;
mod bench_diffusion;
mod bench_e2e;
mod bench_serve;
mod bench_vision;
mod browser_probe;
mod browser_test;
mod dawn_bench;
mod dawn_check;
mod dg;
mod plans;
mod serve;
mod shader_stats;
mod synth;
mod timing;
mod wasm;

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// The audio tower's speed: features, encode, time to first token of an audio prompt.
    BenchAudio(bench_audio::Args),
    /// Aggregate decode speed of 1, 4, 16, 64 sequences stepped together (batched decode).
    BenchBatch(bench_batch::Args),
    /// DiffusionGemma's speed: ms a denoising step, in-step and effective tok/s.
    BenchDiffusion(bench_diffusion::Args),
    /// End-to-end speed: prefill and decode tok/s, time to first token, memory, bandwidth use.
    BenchE2e(bench_e2e::Args),
    /// An OpenAI-compatible server (ours, or another by URL) under 1, 4, 16, 64 concurrent
    /// streams: time to first token and aggregate decode.
    BenchServe(bench_serve::Args),
    /// The vision tower's speed: preprocessing, encode, time to first token of an image prompt.
    BenchVision(bench_vision::Args),
    /// Where a model's logits in headless Chromium leave native, under sets of switches.
    BrowserProbe(browser_probe::Args),
    /// Build the wasm package, then test it in headless Chromium (WebGPU on SwiftShader).
    BrowserTest(browser_test::Args),
    /// The page's engine timed in Node on Dawn (Chrome's WebGPU) on this machine's GPU.
    DawnBench(dawn_bench::Args),
    /// The page's engine in Node on Dawn held to native, and on Dawn's subgroup matrices to
    /// its f32 tiles (run it through scripts/dawn-lavapipe.sh).
    DawnCheck(dawn_check::Args),
    /// DiffusionGemma: one denoising step's canvas logits, as raw f32 (parity with
    /// transformers or llama.cpp's diffusion-gemma-eval).
    DgLogits(dg::LogitsArgs),
    /// DiffusionGemma: one block of the entropy-bound sampler with given random streams.
    DgReplay(dg::ReplayArgs),
    /// Write the pinned dispatch sequences of the synthetic presets, or check this GPU's.
    Plans(plans::Args),
    /// Serve the demo page and models on 127.0.0.1 (HTTP with Range requests).
    Serve(serve::Args),
    /// What the Vulkan driver reports for each kernel variant that `WGEMMA_DUMP_SPIRV` wrote:
    /// registers a thread, shared memory, with and without robust buffer access.
    ShaderStats(shader_stats::Args),
    /// Write a synthetic GGUF with random weights (tiny for tests, full size for benchmarks).
    Synth(synth::Args),
    /// Build the runtime for wasm32 and bind it for the browser into web/pkg.
    Wasm(wasm::Args),
}

type TaskError = Box<dyn std::error::Error>;

/// The repository root (xtask's parent folder).
fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.task {
        Task::BenchAudio(a) => bench_audio::run(a),
        Task::BenchBatch(a) => bench_batch::run(a),
        Task::BenchDiffusion(a) => bench_diffusion::run(a),
        Task::BenchE2e(a) => bench_e2e::run(a),
        Task::BenchServe(a) => bench_serve::run(a),
        Task::BenchVision(a) => bench_vision::run(a),
        Task::BrowserProbe(a) => browser_probe::run(a),
        Task::BrowserTest(a) => browser_test::run(a),
        Task::DawnBench(a) => dawn_bench::run(a),
        Task::DawnCheck(a) => dawn_check::run(a),
        Task::DgLogits(a) => dg::logits(a),
        Task::DgReplay(a) => dg::replay(a),
        Task::Plans(a) => plans::run(a),
        Task::Serve(a) => serve::run(a),
        Task::ShaderStats(a) => shader_stats::run(a),
        Task::Synth(a) => synth::run(a),
        Task::Wasm(a) => wasm::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
