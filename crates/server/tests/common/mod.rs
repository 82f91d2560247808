//! What the server's tests share: the tiny model, a server on a free port, and requests to it.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use wgemma_server::{ServedModel, ServerConfig};

/// What the tests call the model.
pub const MODEL: &str = "tiny";

/// A file of `crates/gemma4-audio/tests/fixtures`: the tiny random Gemma 4 with image and audio
/// towers (made by transformers and llama.cpp's converter; its replies vary with the prompt,
/// unlike a synthetic model's) and its clips.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../gemma4-audio/tests/fixtures")
        .join(name)
}

/// A server of the tiny model as [`MODEL`] (with its projector where `towers`), two sessions
/// of 1024 positions.
pub fn config(towers: bool) -> ServerConfig {
    ServerConfig {
        models: vec![ServedModel {
            name: MODEL.into(),
            spec: fixture("gemma4_tiny_audio.gguf").display().to_string(),
            projector: towers.then(|| fixture("gemma4_tiny_audio_mmproj.gguf")),
        }],
        parallel: 2,
        context: 1024,
        ..ServerConfig::default()
    }
}

/// Starts a server on a free port in a thread of its own; its address.
pub fn start(config: ServerConfig) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, wgemma_server::router(&config))
                .await
                .unwrap();
        });
    });
    rx.recv().unwrap()
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into()
}

/// POSTs `body` (JSON text) to `path`: status and body text.
pub fn post(addr: SocketAddr, path: &str, body: &str, key: Option<&str>) -> (u16, String) {
    let mut req = agent()
        .post(format!("http://{addr}{path}"))
        .header("Content-Type", "application/json");
    if let Some(k) = key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    let mut resp = req.send(body).expect("the server answers");
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap())
}

pub fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// A loaded model's counter from `GET /metrics`.
pub fn metric(addr: SocketAddr, model: &str, name: &str) -> u64 {
    let mut resp = agent()
        .get(format!("http://{addr}/metrics"))
        .call()
        .unwrap();
    let text = resp.body_mut().read_to_string().unwrap();
    let prefix = format!("{name}{{model=\"{model}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

/// Sends a streamed chat request on a connection of its own, reads up to its first event,
/// and closes the connection.
pub fn hang_up_after_the_first_event(addr: SocketAddr, body: &str) {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut reader, &mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    conn.shutdown(std::net::Shutdown::Both).unwrap();
}
