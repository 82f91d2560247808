//! Resolving `--model` and loading it with a progress bar.

use indicatif::{ProgressBar, ProgressStyle};
use wgemma::pull::DEFAULT_MODEL;
use wgemma::{LoadOptions, Model, ModelSource};

use super::CliError;

/// `--model` shared by the subcommands that run a model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArg {
    /// A GGUF path or an Ollama model name (gemma3:270m); the default model when absent,
    /// fetched on first use.
    #[arg(long, short)]
    pub model: Option<String>,
    /// Keep a mixture-of-experts model's experts in host memory and copy each layer's in as
    /// it runs: less GPU memory, slower steps. By default they stay on the GPU when they fit.
    #[arg(long)]
    pub stream_experts: bool,
}

/// Loads the model, showing upload progress on stderr unless `quiet`.
pub fn load(arg: &ModelArg, quiet: bool) -> Result<Model, CliError> {
    let path = match arg.model.as_deref() {
        None => super::pull::run()?,
        Some(name) if name == DEFAULT_MODEL.name => super::pull::run()?,
        Some(spec) => ModelSource::resolve(spec)?.model,
    };
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(1).with_style(
            ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    };
    let progress_bar = bar.clone();
    let opts = LoadOptions {
        on_progress: Some(Box::new(move |p| {
            progress_bar.set_length(p.total);
            progress_bar.set_position(p.done);
        })),
        gpu: wgemma::ContextOptions::default().with_env(),
        experts: if arg.stream_experts {
            wgemma::ExpertPlacement::Streamed
        } else {
            wgemma::ExpertPlacement::Auto
        },
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(&path, opts))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    bar.finish_and_clear();
    Ok(model)
}
