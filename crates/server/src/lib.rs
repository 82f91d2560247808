//! `wgemma serve`: the models of the wgemma runtime behind the HTTP APIs local tools already
//! speak, OpenAI's (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) and Ollama's
//! (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/version`, `/api/ps`).
//!
//! Models are named by the server's configuration or, on first use, by any Ollama name or
//! GGUF path a request gives; each loads once and serves `parallel` requests at a time, each
//! in a session of its own (its KV cache kept between requests, so a conversation's next turn
//! reuses its prefix, and a prompt that starts like another slot's cache takes that prefix
//! from it), with a bounded queue in front. The requests' decode steps run together
//! (continuous batching); a newcomer's long prompt is read a chunk at a time between them. A client that goes away stops its
//! generation at the next step. Errors come in each API's shape with a status that says whose
//! fault it is.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let config = wgemma_server::ServerConfig {
//!     models: vec![wgemma_server::ServedModel {
//!         name: "gemma3:270m".into(),
//!         spec: "gemma3:270m".into(),
//!         projector: None,
//!     }],
//!     ..Default::default()
//! };
//! wgemma_server::serve(config).await
//! # }
//! ```

// The futures of the handlers hold wgpu's deeply nested types, whose Send checks go past
// the default depth.
#![recursion_limit = "256"]

mod diffusion;
mod error;
mod generation;
mod logprobs;
mod models;
mod ollama;
mod openai;
mod request;
mod sessions;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

pub use error::{ApiError, Dialect};
pub use models::{ModelSettings, ServedModel};

use models::Registry;

/// How a server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where it listens: loopback unless asked otherwise.
    pub host: IpAddr,
    pub port: u16,
    /// Models offered by name (the first answers requests that name none).
    pub models: Vec<ServedModel>,
    /// Requests must carry `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// Sessions per model: requests served at once.
    pub parallel: usize,
    /// Tokens of context each session holds (capped at the model's).
    pub context: usize,
    /// Requests that may wait per model beyond those being served.
    pub queue: usize,
    /// The largest request body (images and audio travel inside it as base64).
    pub max_body_bytes: usize,
    /// Unload a model after this long unused.
    pub idle_unload: Option<Duration>,
    pub gpu: wgemma::ContextOptions,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            models: Vec::new(),
            api_key: None,
            parallel: 2,
            context: 4096,
            queue: 64,
            max_body_bytes: 64 << 20,
            idle_unload: Some(Duration::from_secs(300)),
            gpu: wgemma::ContextOptions::default(),
        }
    }
}

/// What every handler sees.
pub(crate) struct App {
    pub registry: Registry,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
}

pub(crate) type AppState = State<Arc<App>>;

/// The routes of both APIs over `config`'s models (nothing loads until a request asks).
pub fn router(config: &ServerConfig) -> Router {
    let settings = ModelSettings {
        parallel: config.parallel.max(1),
        context: config.context.max(1),
        queue: config.queue.max(1),
        idle_unload: config.idle_unload,
        gpu: config.gpu.clone(),
    };
    let app = Arc::new(App {
        registry: Registry::new(config.models.clone(), settings),
        api_key: config.api_key.clone(),
        max_body_bytes: config.max_body_bytes,
    });
    let unloader = Arc::downgrade(&app);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            match unloader.upgrade() {
                Some(app) => app.registry.unload_idle(),
                None => return,
            }
        }
    });
    Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/metrics", get(metrics))
        .route("/", get(|| async { "wgemma is running" }))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            refuse_large_bodies,
        ))
        .layer(axum::middleware::from_fn_with_state(app.clone(), authorize))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(app)
}

/// Serves `config` until Ctrl-C (or SIGTERM), finishing the requests under way.
pub async fn serve(config: ServerConfig) -> std::io::Result<()> {
    let addr = SocketAddr::new(config.host, config.port);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, models = ?config.models.iter().map(|m| &m.name).collect::<Vec<_>>(), "listening");
    axum::serve(listener, router(&config))
        .with_graceful_shutdown(shutdown())
        .await
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The loaded models' counters in Prometheus' text format.
async fn metrics(State(app): AppState) -> Response {
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = String::new();
    let loaded = app.registry.loaded();
    type Series = (&'static str, &'static str, fn(&models::Loaded) -> u64);
    let series: [Series; 10] = [
        ("wgemma_requests_pending", "gauge", |l| l.pending() as u64),
        ("wgemma_requests_finished_total", "counter", |l| {
            l.sessions.counters.finished.load(Relaxed)
        }),
        ("wgemma_requests_cancelled_total", "counter", |l| {
            l.sessions.counters.cancelled.load(Relaxed)
        }),
        ("wgemma_requests_failed_total", "counter", |l| {
            l.sessions.counters.failed.load(Relaxed)
        }),
        ("wgemma_prompt_tokens_total", "counter", |l| {
            l.sessions.counters.prompt_tokens.load(Relaxed)
        }),
        ("wgemma_prompt_tokens_cached_total", "counter", |l| {
            l.sessions.counters.cached_tokens.load(Relaxed)
        }),
        ("wgemma_generated_tokens_total", "counter", |l| {
            l.sessions.counters.generated_tokens.load(Relaxed)
        }),
        ("wgemma_prompt_microseconds_total", "counter", |l| {
            l.sessions.counters.prompt_us.load(Relaxed)
        }),
        ("wgemma_decode_microseconds_total", "counter", |l| {
            l.sessions.counters.decode_us.load(Relaxed)
        }),
        ("wgemma_gpu_bytes", "gauge", |l| l.model.gpu_bytes()),
    ];
    for (name, kind, value) in series {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for l in &loaded {
            let model = l.name.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", value(l));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// Refuses requests without the API key, when the server has one (`/` stays open, for
/// health checks).
async fn authorize(State(app): AppState, request: Request, next: Next) -> Response {
    let Some(key) = app.api_key.as_deref() else {
        return next.run(request).await;
    };
    if request.uri().path() == "/" {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
        return next.run(request).await;
    }
    ApiError::unauthorized()
        .speaking(dialect_of(request.uri().path()))
        .into_response()
}

/// Refuses a body whose declared length is over the limit before reading any of it (the
/// body extractor would refuse it too, but only after reading up to the limit).
async fn refuse_large_bodies(State(app): AppState, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > app.max_body_bytes as u64 => ApiError::body(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is {n} bytes; this server takes at most {}",
                app.max_body_bytes
            ),
        )
        .speaking(dialect_of(request.uri().path()))
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Compares without returning early at the first difference (the key is a secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn dialect_of(path: &str) -> Dialect {
    if path.starts_with("/api/") {
        Dialect::Ollama
    } else {
        Dialect::OpenAi
    }
}

/// A request body as JSON, its read's failure (413 past the limit) as an API error.
pub(crate) fn json_body(
    body: Result<Bytes, BytesRejection>,
) -> Result<serde_json::Value, ApiError> {
    let bytes = body.map_err(|e| ApiError::body(e.status(), e.body_text()))?;
    request::parse_body(&bytes)
}
