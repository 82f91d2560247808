//! The server as clients use it, over HTTP on loopback, with a tiny random Gemma 4 on the
//! CI's GPU API: both APIs whole and streamed (the same greedy text either way), their error
//! shapes and statuses, a client that goes away mid-stream, and concurrent requests that each
//! get what they would alone.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use wgemma_server::ServerConfig;

mod common;

use common::{
    MODEL, agent, fixture, hang_up_after_the_first_event, json_of, metric, post, sse_data, start,
};

fn config() -> ServerConfig {
    common::config(true)
}

/// The server all tests share (one model load).
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| start(config()))
}

fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    let mut resp = agent()
        .get(format!("http://{addr}{path}"))
        .call()
        .expect("the server answers");
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap(),
    )
}

fn chat_body(words: &str, max_tokens: u32, stream: bool) -> String {
    json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": words}],
        "max_tokens": max_tokens,
        // Drawn, from a fixed seed: the same request gives the same reply, and different
        // prompts different ones (the tiny model's greedy replies are all newlines).
        "temperature": 1.0,
        "seed": 7,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// The text and finish reason of streamed chat chunks.
fn streamed_chat(body: &str) -> (String, String, Value) {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| json_of(d)).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .unwrap_or_default()
        .to_string();
    let usage = chunks.last().unwrap()["usage"].clone();
    (text, finish, usage)
}

#[test]
fn openai_chat_whole_and_streamed_give_the_same_greedy_text() {
    let addr = server();
    let (status, body) = post(
        addr,
        "/v1/chat/completions",
        &chat_body("Hello there", 12, false),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let whole = json_of(&body);
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], MODEL);
    let text = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.is_empty());
    let finish = whole["choices"][0]["finish_reason"].as_str().unwrap();
    let completion_tokens = whole["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion_tokens), "{whole}");
    assert_eq!(finish == "length", completion_tokens == 12, "{whole}");
    assert!(whole["usage"]["prompt_tokens"].as_u64().unwrap() > 5);

    let (status, body) = post(
        addr,
        "/v1/chat/completions",
        &chat_body("Hello there", 12, true),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let (streamed, streamed_finish, usage) = streamed_chat(&body);
    assert_eq!(streamed, text);
    assert_eq!(streamed_finish, finish);
    assert_eq!(usage["completion_tokens"].as_u64(), Some(completion_tokens));
}

#[test]
fn openai_completions_take_a_plain_prompt() {
    let addr = server();
    let body =
        json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0});
    let (status, text) = post(addr, "/v1/completions", &body.to_string(), None);
    assert_eq!(status, 200, "{text}");
    let v = json_of(&text);
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["text"].is_string());
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 5);

    let (status, models) = get(addr, "/v1/models");
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], MODEL);
}

/// A completion's prompt as token ids is read as given (its usage counts them), ids outside the
/// vocabulary are a 400, and `ignore_eos` runs a reply that ends at its end of turn on to
/// `max_tokens`.
#[test]
fn completions_take_token_ids_and_ignore_eos() {
    let addr = server();
    let ids = [2, 261, 300, 301, 420, 77];
    let ask = |seed: u64, ignore_eos: bool| {
        let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 48, "temperature": 1.0,
                          "seed": seed, "ignore_eos": ignore_eos});
        let (status, text) = post(addr, "/v1/completions", &body.to_string(), None);
        assert_eq!(status, 200, "{text}");
        json_of(&text)
    };
    let first = ask(1, false);
    assert_eq!(first["usage"]["prompt_tokens"], ids.len());
    // A seed whose reply ends at an end of turn before 48 tokens.
    let (seed, ended) = (1..40)
        .map(|seed| (seed, ask(seed, false)))
        .find(|(_, v)| v["choices"][0]["finish_reason"] == "stop")
        .expect("some seed's reply ends at its end of turn");
    assert!(ended["usage"]["completion_tokens"].as_u64().unwrap() < 48);
    let longer = ask(seed, true);
    assert_eq!(longer["choices"][0]["finish_reason"], "length", "{longer}");
    assert_eq!(longer["usage"]["completion_tokens"], 48);
    let start = ended["choices"][0]["text"].as_str().unwrap();
    assert!(
        longer["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(start)
    );

    for prompt in [
        json!([2, 4_000_000_000u64]),
        json!([[2, 512]]),
        json!([]),
        json!([2, -1]),
        json!(3),
    ] {
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2});
        let (status, text) = post(addr, "/v1/completions", &body.to_string(), None);
        assert_eq!(status, 400, "{prompt}: {text}");
    }
}

/// Log-probabilities: one entry a generated token (whole and streamed alike), each with its
/// top tokens most likely first and the sampled one among them when greedy; the completions'
/// legacy shape; bad settings refused.
#[test]
fn logprobs_come_with_each_token() {
    let addr = server();
    let mut body: Value = json_of(&chat_body("Tell me more", 6, false));
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    body["temperature"] = json!(0);
    let (status, text) = post(addr, "/v1/chat/completions", &body.to_string(), None);
    assert_eq!(status, 200, "{text}");
    let whole = json_of(&text);
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    let generated = whole["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    // The end-of-turn token ends the reply without being one of its tokens.
    assert!(
        (generated..=generated + 1).contains(&content.len()),
        "{whole}"
    );
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0, "{e}");
        // Greedy: the sampled token is the most likely one.
        assert_eq!(e["token"], top[0]["token"], "{e}");
        assert!(
            (e["logprob"].as_f64().unwrap() - lps[0]).abs() < 1e-6,
            "{e}"
        );
        assert!(e["bytes"].is_array());
    }
    body["stream"] = json!(true);
    let (status, text) = post(addr, "/v1/chat/completions", &body.to_string(), None);
    assert_eq!(status, 200, "{text}");
    let streamed: Vec<Value> = sse_data(&text)
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .map(|d| json_of(d))
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    // The same tokens (the second request reads less of its prompt, which the cache holds:
    // the same values to rounding).
    assert_eq!(streamed.len(), content.len());
    for (a, b) in streamed.iter().zip(&content) {
        assert_eq!(a["token"], b["token"]);
        let (x, y) = (
            a["logprob"].as_f64().unwrap(),
            b["logprob"].as_f64().unwrap(),
        );
        assert!((x - y).abs() < 1e-3, "{a} {b}");
    }
    // Completions: `logprobs` is the number of top tokens.
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4,
                      "temperature": 0, "logprobs": 2});
    let (status, text) = post(addr, "/v1/completions", &body.to_string(), None);
    assert_eq!(status, 200, "{text}");
    let lp = json_of(&text)["choices"][0]["logprobs"].clone();
    let n = lp["tokens"].as_array().unwrap().len();
    assert!(
        n >= 1 && lp["token_logprobs"].as_array().unwrap().len() == n,
        "{lp}"
    );
    assert!(
        lp["top_logprobs"][0].as_object().unwrap().len() <= 2,
        "{lp}"
    );
    assert_eq!(lp["text_offset"][0], 0);
    for bad in [
        json!({"logprobs": false, "top_logprobs": 2}),
        json!({"logprobs": true, "top_logprobs": 21}),
    ] {
        let mut body: Value = json_of(&chat_body("Hi", 2, false));
        body.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let (status, text) = post(addr, "/v1/chat/completions", &body.to_string(), None);
        assert_eq!(status, 400, "{bad}: {text}");
    }
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    let addr = server();
    let cases = [
        ("{not json", 400, "bad_request"),
        (r#"{"model": "tiny", "messages": []}"#, 400, "bad_request"),
        (
            r#"{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}"#,
            400,
            "unsupported",
        ),
        (
            r#"{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": -1}"#,
            400,
            "bad_request",
        ),
        (
            r#"{"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}"#,
            400,
            "bad_request",
        ),
        (
            r#"{"model": "no-such-model:7b", "messages": [{"role": "user", "content": "x"}]}"#,
            404,
            "model_not_found",
        ),
        (
            r#"{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}"#,
            400,
            "bad_request",
        ),
    ];
    for (body, want_status, want_code) in cases {
        let (status, text) = post(addr, "/v1/chat/completions", body, None);
        assert_eq!(status, want_status, "{body}: {text}");
        let v = json_of(&text);
        assert_eq!(v["error"]["code"], want_code, "{body}: {text}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    // More prompt than the context holds.
    let long = "word ".repeat(3000);
    let (status, text) = post(
        addr,
        "/v1/chat/completions",
        &chat_body(&long, 4, false),
        None,
    );
    assert_eq!(status, 400, "{text}");
    assert_eq!(json_of(&text)["error"]["code"], "context_overflow");
}

#[test]
fn keys_and_body_limits_are_enforced() {
    let addr = start(ServerConfig {
        api_key: Some("sekrit".into()),
        max_body_bytes: 4096,
        ..config()
    });
    let body = chat_body("Hi", 2, false);
    let (status, text) = post(addr, "/v1/chat/completions", &body, None);
    assert_eq!(
        (status, json_of(&text)["error"]["code"].clone()),
        (401, json!("invalid_api_key"))
    );
    let (status, text) = post(addr, "/api/chat", &body, Some("wrong"));
    assert_eq!(status, 401);
    assert!(
        json_of(&text)["error"].is_string(),
        "Ollama's shape: {text}"
    );
    let (status, text) = post(addr, "/v1/chat/completions", &body, Some("sekrit"));
    assert_eq!(status, 200, "{text}");
    let big = chat_body(&"x".repeat(10_000), 2, false);
    let (status, text) = post(addr, "/v1/chat/completions", &big, Some("sekrit"));
    assert_eq!(status, 413, "{text}");
    assert_eq!(json_of(&text)["error"]["code"], "body_too_large");
}

#[test]
fn ollama_chat_and_generate_stream_ndjson_and_match_whole_replies() {
    let addr = server();
    let chat = |stream: bool| {
        json!({"model": MODEL, "stream": stream,
               "messages": [{"role": "user", "content": "Tell me a story"}],
               "options": {"temperature": 0, "num_predict": 10}})
        .to_string()
    };
    let (status, whole) = post(addr, "/api/chat", &chat(false), None);
    assert_eq!(status, 200, "{whole}");
    let whole = json_of(&whole);
    assert_eq!(whole["done"], true);
    assert!(whole["eval_count"].as_u64().unwrap() <= 10);
    assert!(whole["total_duration"].as_u64().unwrap() > 0);
    let (status, lines) = post(addr, "/api/chat", &chat(true), None);
    assert_eq!(status, 200);
    let lines: Vec<Value> = lines.lines().map(json_of).collect();
    assert_eq!(lines.last().unwrap()["done"], true);
    assert_eq!(lines.last().unwrap()["eval_count"], whole["eval_count"]);
    let text: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(text, whole["message"]["content"].as_str().unwrap());

    let raw = json!({"model": MODEL, "prompt": "The sky is", "raw": true, "stream": false,
                     "options": {"temperature": 0, "num_predict": 4}});
    let (status, text) = post(addr, "/api/generate", &raw.to_string(), None);
    assert_eq!(status, 200, "{text}");
    assert!(json_of(&text)["response"].is_string());

    let (_, tags) = get(addr, "/api/tags");
    assert_eq!(tags["models"][0]["name"], MODEL);
    assert_eq!(tags["models"][0]["details"]["format"], "gguf");
    let (_, ps) = get(addr, "/api/ps");
    assert!(
        ps["models"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == MODEL)
    );
    let (_, version) = get(addr, "/api/version");
    assert!(version["version"].is_string());
    let (status, show) = post(
        addr,
        "/api/show",
        &json!({"model": MODEL}).to_string(),
        None,
    );
    assert_eq!(status, 200, "{show}");
    // The fixture's GGUF has no chat template (the template's text is unit-tested).
    assert_eq!(json_of(&show)["template"], "");
    assert!(
        json_of(&show)["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("completion"))
    );
    let (status, text) = post(
        addr,
        "/api/chat",
        r#"{"model": "tiny", "messages": 3}"#,
        None,
    );
    assert_eq!(status, 400);
    assert!(json_of(&text)["error"].is_string());
}

/// Clients that read the first chunk and hang up: the server stops those generations (they
/// count as cancelled, nothing stays pending) and serves the next request as before.
#[test]
fn a_client_that_goes_away_mid_stream_frees_its_session() {
    let addr = start(config());
    let (status, before) = post(
        addr,
        "/v1/chat/completions",
        &chat_body("Hello there", 12, false),
        None,
    );
    assert_eq!(status, 200, "{before}");
    for _ in 0..3 {
        hang_up_after_the_first_event(addr, &chat_body("Write a long poem", 900, true));
    }
    let waited = std::time::Instant::now();
    while metric(addr, MODEL, "wgemma_requests_pending") > 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "generations left running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(addr, MODEL, "wgemma_requests_cancelled_total"), 3);
    assert_eq!(metric(addr, MODEL, "wgemma_requests_finished_total"), 1);
    assert!(metric(addr, MODEL, "wgemma_generated_tokens_total") < 12 + 3 * 900);
    let (status, after) = post(
        addr,
        "/v1/chat/completions",
        &chat_body("Hello there", 12, false),
        None,
    );
    assert_eq!(status, 200, "{after}");
    let text = |body: &str| json_of(body)["choices"][0]["message"]["content"].clone();
    assert_eq!(text(&after), text(&before));
}

/// Requests at once, more than the sessions: each gets the reply it gets alone (greedy).
#[test]
fn concurrent_requests_each_get_their_own_reply() {
    let addr = server();
    let prompts = [
        "Alpha",
        "Bravo charlie",
        "Delta echo foxtrot",
        "Golf",
        "Hotel india",
    ];
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (status, body) = post(addr, "/v1/chat/completions", &chat_body(p, 8, false), None);
            assert_eq!(status, 200, "{body}");
            json_of(&body)["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(alone.iter().skip(1).any(|a| *a != alone[0]), "{alone:?}");
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let (status, body) =
                        post(addr, "/v1/chat/completions", &chat_body(p, 8, true), None);
                    assert_eq!(status, 200, "{body}");
                    streamed_chat(&body).0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
}

/// An audio clip as OpenAI's `input_audio` part and an image as a `data:` URL reach the model
/// (their soft tokens in the prompt); undecodable ones are clear 400s.
#[test]
fn audio_and_image_parts_reach_the_model() {
    let addr = server();
    let wav = std::fs::read(fixture("a16k.wav")).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&wav);
    let body = |part: Value| {
        json!({"model": MODEL, "max_tokens": 4, "temperature": 0,
               "messages": [{"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}]})
        .to_string()
    };
    let plain = json!({"model": MODEL, "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": "What is this?"}]});
    let (_, without) = post(addr, "/v1/chat/completions", &plain.to_string(), None);
    let audio = json!({"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}});
    let (status, with) = post(addr, "/v1/chat/completions", &body(audio), None);
    assert_eq!(status, 200, "{with}");
    let prompt = |b: &str| json_of(b)["usage"]["prompt_tokens"].as_u64().unwrap();
    // The clip's soft tokens and its two markers.
    assert!(prompt(&with) > prompt(&without) + 10, "{with} / {without}");
    let bad = json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}});
    let (status, text) = post(addr, "/v1/chat/completions", &body(bad), None);
    assert_eq!(
        (status, json_of(&text)["error"]["code"].clone()),
        (400, json!("bad_audio")),
        "{text}"
    );
    let png = base64::engine::general_purpose::STANDARD.encode(tiny_png());
    let url = format!("data:image/png;base64,{png}");
    // At the default budget the image's tokens would not fit this model's 256 positions.
    let image = json!({"type": "image_url", "image_url": {"url": url, "detail": "low"}});
    let (status, text) = post(addr, "/v1/chat/completions", &body(image), None);
    assert_eq!(status, 200, "{text}");
    assert!(prompt(&text) > prompt(&without) + 20, "{text}");
    let broken = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}});
    let (status, text) = post(addr, "/v1/chat/completions", &body(broken), None);
    assert_eq!(
        (status, json_of(&text)["error"]["code"].clone()),
        (400, json!("bad_image")),
        "{text}"
    );
}

/// A 2x2 PNG.
fn tiny_png() -> Vec<u8> {
    let mut out = Vec::new();
    image::RgbImage::from_pixel(2, 2, image::Rgb([200, 10, 10]))
        .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// More requests at once than a model's session and queue take: the rest are told to come
/// back (503, `queue_full`, Retry-After) at once, while those taken finish.
#[test]
fn a_full_queue_refuses_at_once() {
    let addr = start(ServerConfig {
        parallel: 1,
        queue: 1,
        ..config()
    });
    let results: Vec<(u16, String, Option<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(move || {
                    let mut resp = agent()
                        .post(format!("http://{addr}/v1/chat/completions"))
                        .header("Content-Type", "application/json")
                        .send(chat_body("Write a long poem", 200, false))
                        .unwrap();
                    let retry = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    let status = resp.status().as_u16();
                    (status, resp.body_mut().read_to_string().unwrap(), retry)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    assert!(!refused.is_empty() && refused.len() <= 5, "{results:?}");
    for (_, body, retry) in &refused {
        assert_eq!(json_of(body)["error"]["code"], "queue_full");
        assert_eq!(retry.as_deref(), Some("1"));
    }
    assert!(
        results.iter().all(|r| r.0 == 200 || r.0 == 503),
        "{results:?}"
    );
}

/// A conversation's next turn goes to the session that holds its start, even after another
/// request came between: most of its prompt is then read from the cache.
#[test]
fn a_conversation_returns_to_its_session() {
    let addr = start(config());
    let turn = |messages: &Value| {
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0});
        let (status, text) = post(addr, "/v1/chat/completions", &body.to_string(), None);
        assert_eq!(status, 200, "{text}");
        json_of(&text)
    };
    let mut conversation = json!([{"role": "user", "content": "My name is Ada and I like maps."}]);
    let first = turn(&conversation);
    let reply = first["choices"][0]["message"]["content"].clone();
    conversation.as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": reply}),
        json!({"role": "user", "content": "What do I like?"}),
    ]);
    let other = turn(&json!([{"role": "user", "content": "Something else entirely, please."}]));
    assert!(
        other["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            < 8
    );
    let second = turn(&conversation);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= first_prompt,
        "{cached} of the first turn's {first_prompt} cached: {second}"
    );
}
