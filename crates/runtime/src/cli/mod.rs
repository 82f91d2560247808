//! Command-line front end: argument parsing and one function per subcommand.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod chat;
mod encode;
mod info;
mod load;
mod pull;
mod run;
mod score;
mod tokenize;

#[derive(Parser)]
#[command(
    name = "wgemma",
    version,
    about = "Gemma inference on the GPU through wgpu"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print what a GGUF file holds: architecture, hyper-parameters, tensors, dtypes.
    Info(info::Args),
    /// Fetch the default model (Gemma 3 270M Q4_K_M) into the cache.
    Pull,
    /// Answer one prompt, streaming the reply.
    Run(run::Args),
    /// An interactive multi-turn chat.
    Chat(chat::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::Args),
    /// Teacher forcing: the model's top prediction after each of the given tokens.
    Score(score::Args),
    /// An image's soft tokens (what the vision tower hands the text model): prints how many,
    /// and writes them as .npy with --out.
    Encode(encode::Args),
}

pub fn main() -> ExitCode {
    // Output piped into `head` and the like: end quietly when the reader goes away, as
    // command-line tools do, instead of panicking in println!.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WGEMMA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(args),
        Command::Pull => pull::run().map(|path| println!("{}", path.display())),
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Score(args) => score::run(args),
        Command::Encode(args) => encode::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = e.source();
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Errors any subcommand may end with.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;
