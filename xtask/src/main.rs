//! `cargo xtask ...`: developer tasks that are too slow or too specialised for `cargo test`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_e2e;
mod synth;

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// End-to-end speed: prefill and decode tok/s, time to first token, memory, bandwidth use.
    BenchE2e(bench_e2e::Args),
    /// Write a synthetic GGUF with random weights (tiny for tests, full size for benchmarks).
    Synth(synth::Args),
}

type TaskError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.task {
        Task::BenchE2e(a) => bench_e2e::run(a),
        Task::Synth(a) => synth::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
