//! A text diffusion model behind the server (DiffusionGemma's tiny random fixture): both APIs,
//! whole and streamed, reply with the text the runtime gives the same conversation and seed
//! alone; what such a model cannot do is refused with a 400, and the model serves on; with a
//! vision tower (the tiny model with the vision fixtures' projector) it reads images.

use futures::StreamExt;
use serde_json::{Value, json};
use wgemma::{DiffusionGenerate, DiffusionModel, Event, LoadOptions, Message, Prompt, Role};
use wgemma_server::{ServedModel, ServerConfig};

mod common;

use wgemma_test_support::dg_vision;

use common::{hang_up_after_the_first_event, json_of, metric, post, sse_data, start};

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../diffusion/tests/fixtures/dg_tiny.gguf"
);
const CONTEXT: usize = 256;

/// The reply the runtime gives `words` from a user with `seed`, `max_tokens` long at most.
fn alone(words: &str, seed: u64, max_tokens: usize) -> (String, usize) {
    let model =
        pollster::block_on(DiffusionModel::load_file(PATH, LoadOptions::default())).unwrap();
    let mut chat = model.session(CONTEXT, None).unwrap();
    let req = DiffusionGenerate {
        max_tokens,
        ..DiffusionGenerate::new(Prompt::Chat(vec![Message::new(Role::User, words)]), seed)
    };
    let events: Vec<Event> = pollster::block_on(chat.generate(req).map(|e| e.unwrap()).collect());
    let tokens: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Token { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    (tokens.concat(), tokens.len())
}

/// POSTs an OpenAI chat request: status and body text.
fn post_chat(addr: std::net::SocketAddr, body: Value) -> (u16, String) {
    post(addr, "/v1/chat/completions", &body.to_string(), None)
}

fn chat(words: &str, stream: bool, extra: Value) -> Value {
    let mut body = json!({
        "model": "dg",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 24,
        "seed": 7,
        "stream": stream,
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

fn server() -> std::net::SocketAddr {
    start(ServerConfig {
        models: vec![ServedModel {
            name: "dg".into(),
            spec: PATH.into(),
            projector: None,
        }],
        parallel: 2,
        context: CONTEXT,
        ..ServerConfig::default()
    })
}

#[test]
fn a_diffusion_model_answers_as_the_runtime_does() {
    let addr = server();
    let (want, n) = alone("Hello there", 7, 24);
    assert!(n > 0 && n <= 24, "{n} tokens");

    let (status, body) = post_chat(addr, chat("Hello there", false, json!({})));
    assert_eq!(status, 200, "{body}");
    let whole = json_of(&body);
    assert_eq!(whole["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(whole["usage"]["completion_tokens"], n);

    let (status, body) = post_chat(addr, chat("Hello there", true, json!({})));
    assert_eq!(status, 200, "{body}");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let streamed: String = data[..data.len() - 1]
        .iter()
        .filter_map(|d| {
            json_of(d)["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, want);

    let ollama = json!({
        "model": "dg",
        "messages": [{"role": "user", "content": "Hello there"}],
        "options": {"seed": 7, "num_predict": 24},
        "stream": false,
    });
    let (status, body) = post(addr, "/api/chat", &ollama.to_string(), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["message"]["content"], want.as_str());

    // What a text diffusion model cannot do: refused, and the model serves on.
    for extra in [
        json!({"logprobs": true, "top_logprobs": 2}),
        json!({"stop": ["x"]}),
    ] {
        let (status, body) = post_chat(addr, chat("Hi", false, extra.clone()));
        assert_eq!(status, 400, "{extra}: {body}");
        assert_eq!(json_of(&body)["error"]["code"], "bad_request", "{body}");
    }
    // A prompt longer than the context.
    let long = "word ".repeat(2 * CONTEXT);
    let (status, body) = post_chat(addr, chat(&long, false, json!({})));
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        json_of(&body)["error"]["code"],
        "context_overflow",
        "{body}"
    );
    let (status, body) = post_chat(addr, chat("Hello there", false, json!({})));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json_of(&body)["choices"][0]["message"]["content"],
        want.as_str()
    );
}

/// A client that hangs up mid-reply stops its generation within a step: nothing stays
/// pending, it counts as cancelled, and the next request is served.
#[test]
fn a_diffusion_client_that_goes_away_stops_its_generation() {
    let addr = server();
    let long = chat("Write a long story", true, json!({"max_tokens": 200}));
    hang_up_after_the_first_event(addr, &long.to_string());
    let waited = std::time::Instant::now();
    while metric(addr, "dg", "wgemma_requests_pending") > 0 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(120),
            "the generation went on"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(metric(addr, "dg", "wgemma_requests_cancelled_total"), 1);
    assert!(metric(addr, "dg", "wgemma_generated_tokens_total") < 200);
    let (status, body) = post_chat(addr, chat("Hello there", false, json!({})));
    assert_eq!(status, 200, "{body}");
    // Counted once its end went out, just after the reply could be read.
    while metric(addr, "dg", "wgemma_requests_finished_total") < 1 {
        assert!(waited.elapsed() < std::time::Duration::from_secs(120));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(metric(addr, "dg", "wgemma_requests_cancelled_total"), 1);
}

/// An image part (at the low budget, 70 soft tokens: the default's would not fit 256
/// positions) in an OpenAI chat request to a diffusion model with a vision tower: read, and
/// counted in the prompt's tokens (its soft tokens and two markers); to one without, a 400.
#[test]
fn a_diffusion_model_with_a_vision_tower_reads_images() {
    use base64::Engine;
    let addr = start(ServerConfig {
        models: vec![
            ServedModel {
                name: "dgv".into(),
                spec: dg_vision::MODEL.into(),
                projector: Some(dg_vision::MMPROJ.into()),
            },
            ServedModel {
                name: "dg".into(),
                spec: PATH.into(),
                projector: None,
            },
        ],
        parallel: 1,
        context: CONTEXT,
        ..ServerConfig::default()
    });
    let png = std::fs::read(dg_vision::IMAGE).unwrap();
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    );
    let body = |model: &str, image: bool| {
        let mut content = vec![json!({"type": "text", "text": "Describe it"})];
        if image {
            content.insert(
                0,
                json!({"type": "image_url", "image_url": {"url": url, "detail": "low"}}),
            );
        }
        json!({"model": model, "messages": [{"role": "user", "content": content}],
               "max_tokens": 16, "seed": 3})
    };
    let prompt = |text: &str| json_of(text)["usage"]["prompt_tokens"].as_u64().unwrap();
    let (status, without) = post_chat(addr, body("dgv", false));
    assert_eq!(status, 200, "{without}");
    let (status, with) = post_chat(addr, body("dgv", true));
    assert_eq!(status, 200, "{with}");
    assert_eq!(prompt(&with), prompt(&without) + 72, "{with} / {without}");
    let (status, text) = post_chat(addr, body("dg", true));
    assert_eq!(
        (status, json_of(&text)["error"]["code"].clone()),
        (400, json!("no_vision")),
        "{text}"
    );
}
