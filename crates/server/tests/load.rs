//! The server under load: 100 streams at once (a third hanging up after their first event)
//! with malformed, oversized, unauthorised and unknown-model requests among them, while
//! another client lists the models throughout. Every stream that completes gets the text the
//! same request gets alone; afterwards nothing is pending and every generation is accounted
//! for as finished or cancelled.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wgemma_server::ServerConfig;

const KEY: &str = "load-key";
const STREAMS: usize = 100;

mod common;

fn start() -> SocketAddr {
    common::start(ServerConfig {
        api_key: Some(KEY.into()),
        parallel: 4,
        queue: 2 * STREAMS,
        context: 256,
        max_body_bytes: 1 << 20,
        ..common::config(false)
    })
}

/// Sends `body` to `path` with `Content-Length: declared` (the body's own length unless
/// given); the response's status line and the reader over the rest.
fn send(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    declared: Option<usize>,
    key: &str,
) -> (String, BufReader<TcpStream>) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        declared.unwrap_or(body.len())
    );
    conn.write_all(head.as_bytes()).unwrap();
    // A server that answers before reading the whole body may close early: that is fine.
    let _ = conn.write_all(body);
    let mut reader = BufReader::new(conn);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    (status, reader)
}

fn status_code(line: &str) -> u16 {
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn request(i: usize, stream: bool) -> String {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": format!("Request number {i}: say something.")}],
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": i,
        "stream": stream,
    })
    .to_string()
}

/// The text of a streamed reply (the SSE `data:` lines of a chunked body), or `None` when the
/// stream did not end with `[DONE]`.
fn read_stream(reader: &mut BufReader<TcpStream>) -> Option<String> {
    let mut text = String::new();
    let mut done = false;
    for line in reader.lines() {
        let line = line.ok()?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).ok()?;
        if let Some(t) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    done.then_some(text)
}

fn whole_reply(addr: SocketAddr, i: usize) -> String {
    let (status, mut reader) = send(
        addr,
        "/v1/chat/completions",
        request(i, false).as_bytes(),
        None,
        KEY,
    );
    assert_eq!(status_code(&status), 200, "{status}");
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let body = rest.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {rest}"));
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn metric(addr: SocketAddr, name: &str) -> u64 {
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(conn, "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    let prefix = format!("{name}{{model=\"tiny\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

fn models_answer(addr: SocketAddr) -> bool {
    let Ok(mut conn) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = write!(
        conn,
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n"
    );
    let mut text = String::new();
    conn.read_to_string(&mut text).is_ok()
        && text.starts_with("HTTP/1.1 200")
        && text.contains("\"tiny\"")
}

#[test]
fn a_hundred_streams_with_hang_ups_and_bad_requests() {
    let addr = start();
    // Loads the model before the clock starts.
    let _ = whole_reply(addr, 0);
    let stop = AtomicBool::new(false);
    let listings = AtomicUsize::new(0);
    let started = Instant::now();
    let streamed: Vec<(usize, Option<String>)> = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                assert!(
                    models_answer(addr),
                    "/v1/models stopped answering under load"
                );
                listings.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let bad = s.spawn(|| {
            let cases: [(&[u8], Option<usize>, &str, u16); 4] = [
                (b"{\"model\": \"tiny\", \"messages\": [", None, KEY, 400),
                (b"{}", Some(100 << 20), KEY, 413),
                (
                    br#"{"model": "nope:1b", "messages": [{"role": "user", "content": "x"}]}"#,
                    None,
                    KEY,
                    404,
                ),
                (
                    br#"{"model": "tiny", "messages": [{"role": "user", "content": "x"}]}"#,
                    None,
                    "wrong",
                    401,
                ),
            ];
            for (body, declared, key, want) in cases {
                let (status, _) = send(addr, "/v1/chat/completions", body, declared, key);
                assert_eq!(status_code(&status), want, "{status}");
            }
        });
        let handles: Vec<_> = (1..=STREAMS)
            .map(|i| {
                s.spawn(move || {
                    let (status, mut reader) = send(
                        addr,
                        "/v1/chat/completions",
                        request(i, true).as_bytes(),
                        None,
                        KEY,
                    );
                    assert_eq!(status_code(&status), 200, "{status}");
                    if i % 3 == 0 {
                        let mut line = String::new();
                        while !line.starts_with("data: ") {
                            line.clear();
                            assert!(reader.read_line(&mut line).unwrap() > 0);
                        }
                        return (i, None);
                    }
                    (i, Some(read_stream(&mut reader).expect("a whole stream")))
                })
            })
            .collect();
        bad.join().unwrap();
        let out = handles.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        out
    });
    let took = started.elapsed();
    assert!(listings.load(Ordering::Relaxed) > 0);
    let waited = Instant::now();
    while metric(addr, "wgemma_requests_pending") > 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "generations left running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (finished, cancelled) = (
        metric(addr, "wgemma_requests_finished_total"),
        metric(addr, "wgemma_requests_cancelled_total"),
    );
    // The warm-up, the streams, each once; a hang-up may come after its reply's end.
    assert_eq!(
        finished + cancelled,
        1 + STREAMS as u64,
        "{finished} + {cancelled}"
    );
    assert!(cancelled <= (STREAMS / 3) as u64);
    for (i, text) in streamed {
        if let Some(text) = text {
            assert_eq!(text, whole_reply(addr, i), "request {i}");
        }
    }
    eprintln!("{STREAMS} streams in {took:?}; {cancelled} cancelled");
}
