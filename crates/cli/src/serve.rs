//! `wgemma serve`: the OpenAI- and Ollama-compatible HTTP server (`wgemma-server`).

use std::net::IpAddr;
use std::time::Duration;

use wgemma::pull::DEFAULT_MODEL;
use wgemma_server::{ServedModel, ServerConfig};

use super::CliError;

#[derive(clap::Args)]
pub struct Args {
    /// A model to serve: a GGUF path or an Ollama name (repeatable; the first answers
    /// requests that name none). Requests may also name any other Ollama model or path,
    /// loaded on first use. Without one, the default model (fetched on first use).
    #[arg(long, short)]
    model: Vec<String>,
    /// A llama.cpp projector file (mmproj GGUF) for the first --model, with its vision or
    /// audio tower (Ollama's model files hold theirs).
    #[arg(long, value_name = "PATH")]
    mmproj: Option<std::path::PathBuf>,
    /// Address to listen on; loopback unless you mean to serve other machines.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every request (env: WGEMMA_API_KEY).
    #[arg(long, env = "WGEMMA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Requests served at once per model, each in its own session (KV cache).
    #[arg(long, default_value_t = 2)]
    parallel: usize,
    /// Tokens of context per session (capped at the model's).
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// Requests that may wait per model beyond those being served; more get 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// The largest request body, in MiB (images and audio arrive inside it as base64).
    #[arg(long, default_value_t = 64)]
    max_body_mib: usize,
    /// Unload a model unused this long ("5m", "1h"; "never" keeps it).
    #[arg(long, default_value = "5m")]
    keep_alive: String,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let keep_alive = match args.keep_alive.as_str() {
        "never" | "forever" | "-1" => None,
        s => Some(humantime_duration(s)?),
    };
    let models = if args.model.is_empty() {
        vec![ServedModel {
            name: DEFAULT_MODEL.name.to_string(),
            spec: super::pull::run()?.display().to_string(),
            projector: None,
        }]
    } else {
        args.model
            .iter()
            .enumerate()
            .map(|(i, spec)| ServedModel {
                name: spec.clone(),
                spec: spec.clone(),
                projector: if i == 0 { args.mmproj.clone() } else { None },
            })
            .collect()
    };
    let config = ServerConfig {
        host: args.host,
        port: args.port,
        models,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        parallel: args.parallel.max(1),
        context: args.context.max(1),
        queue: args.queue.max(1),
        max_body_bytes: args.max_body_mib.saturating_mul(1 << 20),
        idle_unload: keep_alive,
        gpu: wgemma::ContextOptions::default().with_env(),
    };
    eprintln!(
        "wgemma serve: http://{}:{} (OpenAI /v1, Ollama /api), models: {}",
        config.host,
        config.port,
        config
            .models
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(wgemma_server::serve(config))?;
    Ok(())
}

/// A duration such as `5m` or `90s` (a bare number is seconds).
fn humantime_duration(s: &str) -> Result<Duration, CliError> {
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|e| format!("--keep-alive {s}: {e}").into());
    }
    humantime::parse_duration(s).map_err(|e| format!("--keep-alive {s}: {e}").into())
}
