//! `cargo xtask bench-serve (--model M | --url URL)`: an OpenAI-compatible server under
//! concurrent streams, as users load one: for each concurrency N, N clients at once each send
//! a `prompt`-token completion (token ids, distinct per client and round, so no prefix cache
//! serves them) streamed by SSE, greedy, `decode` tokens long (`ignore_eos`). Per N: time to
//! first token p50/p95, the streams' decode rates summed, and all generated tokens over the
//! round's wall time. With `--model` it serves the file itself (`wgemma serve` in this
//! process, `--parallel` = the largest N); with `--url` it drives another server (llama-server)
//! the same way. Each N runs `reps` rounds; the last is reported (the first warms up).

use std::io::{BufRead, BufReader};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::TaskError;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file to serve in this process.
    #[arg(long, conflicts_with = "url")]
    model: Option<std::path::PathBuf>,
    /// A running server's base address (`http://127.0.0.1:8080`).
    #[arg(long)]
    url: Option<String>,
    /// The label of this server in the output.
    #[arg(long, default_value = "wgemma")]
    server: String,
    /// Concurrent streams, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 256)]
    decode: usize,
    /// Prompt ids are drawn below this (the model's vocabulary, or less).
    #[arg(long, default_value_t = 200_000)]
    vocab: u32,
    /// Rounds per concurrency; the last is reported.
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// One JSON object per concurrency.
    #[arg(long)]
    json: bool,
}

/// One stream's times (seconds from the round's start) and tokens.
struct Stream {
    first: f64,
    end: f64,
    tokens: usize,
}

/// One round's figures.
struct Round {
    ttft_p50_ms: f64,
    ttft_p95_ms: f64,
    stream_tok_s_sum: f64,
    throughput_tok_s: f64,
    wall_s: f64,
    tokens: usize,
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let most = a.concurrency.iter().copied().max().unwrap_or(1);
    let base = match (&a.model, &a.url) {
        (Some(model), _) => serve_here(model, most, a.prompt + a.decode + 16)?,
        (None, Some(url)) => url.trim_end_matches('/').to_string(),
        (None, None) => return Err("give --model or --url".into()),
    };
    wait_ready(&base)?;
    let mut round_seed = 0;
    for &n in &a.concurrency {
        let mut last = None;
        for _ in 0..a.reps.max(1) {
            round_seed += 1;
            last = Some(round(&a, &base, n, round_seed)?);
        }
        let Some(r) = last else { continue };
        if a.json {
            println!(
                "{}",
                json!({
                    "server": a.server, "concurrency": n, "prompt_tokens": a.prompt,
                    "decode_tokens": a.decode, "ttft_p50_ms": r.ttft_p50_ms,
                    "ttft_p95_ms": r.ttft_p95_ms, "stream_tok_s_sum": r.stream_tok_s_sum,
                    "throughput_tok_s": r.throughput_tok_s, "wall_s": r.wall_s,
                    "tokens": r.tokens,
                })
            );
        } else {
            println!(
                "{}: {n:>3} streams  TTFT p50 {:>8.1} ms  p95 {:>8.1} ms  decode {:>8.1} tok/s (streams summed)  {:>8.1} tok/s over {:.2} s",
                a.server,
                r.ttft_p50_ms,
                r.ttft_p95_ms,
                r.stream_tok_s_sum,
                r.throughput_tok_s,
                r.wall_s
            );
        }
    }
    Ok(())
}

/// Starts `wgemma serve` on `model` in this process, on a free loopback port; its address.
fn serve_here(
    model: &std::path::Path,
    parallel: usize,
    context: usize,
) -> Result<String, TaskError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = wgemma_server::ServerConfig {
        port,
        models: vec![wgemma_server::ServedModel {
            name: "bench".into(),
            spec: model.display().to_string(),
            projector: None,
        }],
        parallel,
        context,
        queue: parallel,
        idle_unload: None,
        gpu: wgemma::ContextOptions::default().with_env(),
        ..Default::default()
    };
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        if let Err(e) = runtime.block_on(wgemma_server::serve(config)) {
            eprintln!("bench-serve: the server stopped: {e}");
        }
    });
    Ok(format!("http://127.0.0.1:{port}"))
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(900)))
        .build()
        .into()
}

/// Waits (up to 10 minutes: a model may load first) until the server lists its models.
fn wait_ready(base: &str) -> Result<(), TaskError> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(600) {
        if let Ok(r) = agent().get(format!("{base}/v1/models")).call() {
            if r.status() == 200 {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(format!("{base} did not answer /v1/models within 10 minutes").into())
}

/// `n` streams at once; their figures.
fn round(a: &Args, base: &str, n: usize, seed: u32) -> Result<Round, TaskError> {
    let barrier = Arc::new(Barrier::new(n));
    let start = Instant::now();
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let barrier = barrier.clone();
            let url = format!("{base}/v1/completions");
            let body = json!({
                "model": "bench",
                "prompt": prompt_ids(a.prompt, seed * 1000 + i as u32, a.vocab),
                "max_tokens": a.decode,
                "temperature": 0,
                "ignore_eos": true,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
            .to_string();
            std::thread::spawn(move || {
                barrier.wait();
                one_stream(&url, &body, start).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut streams = Vec::with_capacity(n);
    for c in clients {
        streams.push(c.join().map_err(|_| "a client thread panicked")??);
    }
    let wall_s = streams.iter().map(|s| s.end).fold(0.0, f64::max);
    let mut ttft: Vec<f64> = streams.iter().map(|s| s.first * 1e3).collect();
    ttft.sort_by(f64::total_cmp);
    let tokens: usize = streams.iter().map(|s| s.tokens).sum();
    Ok(Round {
        ttft_p50_ms: percentile(&ttft, 0.50),
        ttft_p95_ms: percentile(&ttft, 0.95),
        stream_tok_s_sum: streams
            .iter()
            .map(|s| s.tokens.saturating_sub(1) as f64 / (s.end - s.first).max(1e-9))
            .sum(),
        throughput_tok_s: tokens as f64 / wall_s.max(1e-9),
        wall_s,
        tokens,
    })
}

/// The value at fraction `p` of sorted `v` (nearest rank).
fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Token ids of plain pieces (above the control and byte tokens), different for each `seed`.
fn prompt_ids(n: usize, seed: u32, vocab: u32) -> Vec<u32> {
    let span = vocab.saturating_sub(300).max(1);
    (0..n as u32)
        .map(|i| 300 + (i.wrapping_mul(7919) + seed.wrapping_mul(104_729)) % span)
        .collect()
}

/// Sends one streamed completion; when its first token came, when it ended, and its tokens
/// (as the server counts them, else the chunks that carried text).
fn one_stream(url: &str, body: &str, start: Instant) -> Result<Stream, String> {
    let resp = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body)
        .map_err(|e| format!("{url}: {e}"))?;
    if resp.status() != 200 {
        let status = resp.status();
        let text = resp.into_body().read_to_string().unwrap_or_default();
        return Err(format!("{url}: {status}: {text}"));
    }
    let reader = BufReader::new(resp.into_body().into_reader());
    let (mut first, mut chunks, mut usage) = (None, 0usize, None);
    for line in reader.lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
        // The usage the server reports (OpenAI's), else llama-server's own timings: a chunk
        // may carry several tokens (llama-server holds back bytes of an unfinished UTF-8
        // character and sends them with the next).
        let counted = v["usage"]["completion_tokens"]
            .as_u64()
            .or_else(|| v["timings"]["predicted_n"].as_u64());
        if let Some(n) = counted {
            usage = Some(n as usize);
        }
        if v["choices"][0]["text"].as_str().is_some() && v["choices"][0]["finish_reason"].is_null()
        {
            first.get_or_insert_with(|| start.elapsed().as_secs_f64());
            chunks += 1;
        }
    }
    let end = start.elapsed().as_secs_f64();
    Ok(Stream {
        first: first.unwrap_or(end),
        end,
        tokens: usage.unwrap_or(chunks),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 10.0);
        assert_eq!(percentile(&v, 0.95), 19.0);
        assert_eq!(percentile(&[3.0], 0.95), 3.0);
    }

    #[test]
    fn prompts_differ_per_seed_and_stay_in_the_vocabulary() {
        let a = prompt_ids(512, 1, 512);
        let b = prompt_ids(512, 2, 512);
        assert_ne!(a, b);
        assert!(a.iter().chain(&b).all(|&t| (300..512).contains(&t)));
    }
}
