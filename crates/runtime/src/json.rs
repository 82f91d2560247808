//! Requests, session options and events as JSON: the shapes the JS API exchanges with the
//! worker, kept here (not behind `cfg(wasm32)`) so native tests and `cargo xtask
//! browser-test`'s native run parse exactly what the browser parses.
//!
//! A request: `{"messages": [{"role": "user", "content": "..."}]}` (or `"prompt": "text"`,
//! fed without a chat template, or `"tokens": [2, 651]`), plus optional `maxTokens`,
//! `temperature`, `topK`, `topP`, `minP`, `repeatPenalty`, `frequencyPenalty`,
//! `presencePenalty`, `penaltyLastN`, `seed`, `stop` (strings), `parseSpecial` (whether
//! control-token text typed in the messages becomes control tokens), `stopLoops` (stop a
//! reply that repeats itself in a loop) and `ignoreEos` (generate past end-of-turn tokens to
//! `maxTokens`); all false by default.
//!
//! Images and audio clips travel beside the JSON (bytes have no place in it), each kind in
//! prompt order: a message's `"images": N` and `"audio": N` open it with N image, then N audio
//! placeholders, and its `content` may be a list of parts, `{"type": "text", "text": "..."}`,
//! `{"type": "image"}` and `{"type": "audio"}`, each image or audio part a placeholder in
//! place; a text or token prompt holds its placeholders (`<|image|>`, `<|audio|>`) itself.
//!
//! A DiffusionGemma model reads the prompt, `maxTokens`, `seed` and `parseSpecial` of the same
//! shape, and `steps` (denoising steps a block at most) and `entropyBound`.

use serde_json::{Map, Value, json};
use wgemma_text::chat::{AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, Message, Role};
use wgemma_text::{SamplingParams, SessionOptions};

use crate::error::Error;
use crate::session::{Event, GenerateRequest, Prompt, StepProfile, StopReason, Timings};

fn bad(msg: impl Into<String>) -> Error {
    Error::Request(msg.into())
}

fn object(v: &Value) -> Result<&Map<String, Value>, Error> {
    v.as_object().ok_or_else(|| bad("expected a JSON object"))
}

fn number(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, Error> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| bad(format!("`{key}` must be a number"))),
    }
}

/// A non-negative whole number no larger than `max`.
fn count(o: &Map<String, Value>, key: &str, max: u64) -> Result<Option<u64>, Error> {
    match number(o, key)? {
        None => Ok(None),
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= max as f64 => Ok(Some(x as u64)),
        Some(x) => Err(bad(format!(
            "`{key}` must be a whole number from 0 to {max}, not {x}"
        ))),
    }
}

/// An optional boolean, false when absent.
fn flag(o: &Map<String, Value>, key: &str) -> Result<bool, Error> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(format!("`{key}` must be true or false"))),
    }
}

fn role(name: &str) -> Result<Role, Error> {
    match name {
        "system" => Ok(Role::System),
        "user" => Ok(Role::User),
        "assistant" | "model" => Ok(Role::Assistant),
        r => Err(bad(format!("unknown role `{r}` (system, user, assistant)"))),
    }
}

/// A message's text: `content` as a string, or its parts joined, each image or audio part its
/// placeholder.
fn content(m: &Map<String, Value>) -> Result<String, Error> {
    let need = || bad("every message needs a `content`: a string or a list of parts");
    match m.get("content").ok_or_else(need)? {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts.iter().try_fold(String::new(), |mut out, part| {
            let part = object(part)?;
            match part.get("type").and_then(Value::as_str) {
                Some("text") => out.push_str(
                    part.get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("a text part needs a string `text`"))?,
                ),
                Some("image") => out.push_str(IMAGE_PLACEHOLDER),
                Some("audio") => out.push_str(AUDIO_PLACEHOLDER),
                t => {
                    return Err(bad(format!(
                        "a content part of type {t:?} (text, image, audio)"
                    )));
                }
            }
            Ok(out)
        }),
        _ => Err(need()),
    }
}

/// The most images (or clips) a message's `images` (`audio`) count may ask for: more than any
/// context holds (each is at least 3 tokens with its markers), few enough that the
/// placeholders cost nothing to write out.
const MAX_IMAGES_PER_MESSAGE: u64 = 4096;

fn message(m: &Value) -> Result<Message, Error> {
    let m = object(m)?;
    let name = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("every message needs a string `role`"))?;
    let images = count(m, "images", MAX_IMAGES_PER_MESSAGE)?.unwrap_or(0);
    let audio = count(m, "audio", MAX_IMAGES_PER_MESSAGE)?.unwrap_or(0);
    Ok(Message::new(role(name)?, content(m)?)
        .with_images(images as usize)
        .with_audio(audio as usize))
}

fn prompt(o: &Map<String, Value>) -> Result<Prompt, Error> {
    if let Some(m) = o.get("messages") {
        let list = m
            .as_array()
            .ok_or_else(|| bad("`messages` must be an array"))?;
        let messages = list.iter().map(message).collect::<Result<Vec<_>, _>>()?;
        return Ok(Prompt::Chat(messages));
    }
    if let Some(p) = o.get("prompt") {
        let text = p.as_str().ok_or_else(|| bad("`prompt` must be a string"))?;
        return Ok(Prompt::Text(text.to_string()));
    }
    if let Some(t) = o.get("tokens") {
        let ids = t
            .as_array()
            .ok_or_else(|| bad("`tokens` must be an array"))?
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| bad("`tokens` must hold token ids"))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        return Ok(Prompt::Tokens(ids));
    }
    Err(bad("a request needs `messages`, `prompt` or `tokens`"))
}

impl GenerateRequest {
    /// Parses a request object (see the module documentation).
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let o = object(v)?;
        let mut req = GenerateRequest::new(prompt(o)?);
        let d = SamplingParams::default();
        let float =
            |k: &str, default: f32| Ok::<f32, Error>(number(o, k)?.map_or(default, |x| x as f32));
        req.sampling = SamplingParams {
            temperature: float("temperature", d.temperature)?,
            top_k: count(o, "topK", u32::MAX.into())?.map_or(d.top_k, |k| k as usize),
            top_p: float("topP", d.top_p)?,
            min_p: float("minP", d.min_p)?,
            repeat_penalty: float("repeatPenalty", d.repeat_penalty)?,
            frequency_penalty: float("frequencyPenalty", d.frequency_penalty)?,
            presence_penalty: float("presencePenalty", d.presence_penalty)?,
            penalty_last_n: count(o, "penaltyLastN", 1 << 20)?
                .map_or(d.penalty_last_n, |n| n as usize),
            seed: count(o, "seed", (1 << 53) - 1)?.unwrap_or(d.seed),
        };
        req.sampling.validate()?;
        req.parse_special = flag(o, "parseSpecial")?;
        req.stop_loops = flag(o, "stopLoops")?;
        req.ignore_eos = flag(o, "ignoreEos")?;
        req.logprobs =
            count(o, "logprobs", wgemma_text::MAX_TOP_LOGPROBS.into())?.map(|n| n as u32);
        if let Some(n) = count(o, "maxTokens", u32::MAX.into())? {
            req.max_tokens = n as usize;
        }
        if let Some(s) = o.get("stop") {
            req.stop = s
                .as_array()
                .ok_or_else(|| bad("`stop` must be an array of strings"))?
                .iter()
                .map(|x| {
                    x.as_str()
                        .filter(|x| !x.is_empty())
                        .map(str::to_string)
                        .ok_or_else(|| bad("`stop` must hold non-empty strings"))
                })
                .collect::<Result<_, Error>>()?;
        }
        Ok(req)
    }
}

/// Parses session options: `{"context": 4096, "maxBatch": 256}`, both optional.
pub fn session_options_from_json(v: &Value) -> Result<SessionOptions, Error> {
    let d = SessionOptions::default();
    if v.is_null() {
        return Ok(d);
    }
    let o = object(v)?;
    let positive = |k: &str, default: usize| match count(o, k, 1 << 24)? {
        Some(0) => Err(bad(format!("`{k}` must be at least 1"))),
        Some(n) => Ok(n as usize),
        None => Ok(default),
    };
    Ok(SessionOptions {
        context: positive("context", d.context)?,
        max_batch: positive("maxBatch", d.max_batch)?,
    })
}

impl StopReason {
    /// The name the JS API uses.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::EndOfGeneration => "end",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopString => "stop_string",
            StopReason::Cancelled => "aborted",
            StopReason::ContextFull => "context_full",
            StopReason::Loop => "loop",
        }
    }
}

impl crate::diffusion::DiffusionGenerate {
    /// A DiffusionGemma request from the JS API's JSON: the prompt, `maxTokens`, `seed`,
    /// `parseSpecial`, and over `defaults` (the model's sampler) `steps` and `entropyBound`.
    pub fn from_json(v: &Value, defaults: wgemma_diffusion::EntropyBound) -> Result<Self, Error> {
        let o = object(v)?;
        let base = GenerateRequest::from_json(v)?;
        let mut sampler = defaults;
        if let Some(n) = count(o, "steps", 1000)? {
            sampler.max_steps = n as u32;
        }
        if let Some(b) = number(o, "entropyBound")? {
            sampler.entropy_bound = b as f32;
        }
        sampler.check().map_err(bad)?;
        Ok(Self {
            prompt: base.prompt,
            max_tokens: base.max_tokens,
            sampler: Some(sampler),
            seed: base.sampling.seed,
            parse_special: base.parse_special,
            images: base.images,
        })
    }
}

impl Timings {
    pub fn to_json(&self) -> Value {
        json!({
            "promptTokens": self.prompt_tokens,
            "cachedTokens": self.cached_tokens,
            "promptMs": self.prompt_ms,
            "generatedTokens": self.generated_tokens,
            "decodeMs": self.decode_ms,
            "promptTokPerS": self.prompt_tok_per_s(),
            "decodeTokPerS": self.decode_tok_per_s(),
            "encodedImages": self.encoded_images,
            "encodedAudio": self.encoded_audio,
            "encodeMs": self.encode_ms,
            "blocks": self.blocks,
            "denoisingSteps": self.denoising_steps,
        })
    }
}

impl StepProfile {
    /// `{"what", "tokens", "totalUs", "kernels": [{"name", "dispatches", "us"}]}`.
    pub fn to_json(&self) -> Value {
        let kernels: Vec<Value> = self
            .kernels
            .iter()
            .map(|(name, n, us)| json!({ "name": name, "dispatches": n, "us": us }))
            .collect();
        json!({
            "what": self.what,
            "tokens": self.tokens,
            "totalUs": self.kernels.iter().map(|k| k.2).sum::<f64>(),
            "kernels": kernels,
        })
    }
}

impl Event {
    /// `{"type": "token", "id", "text"}` (with `"logprobs": {"logprob", "top": [[id,
    /// logprob], ...]}` where asked), `{"type": "draft", "block", "step", "text"}` or
    /// `{"type": "done", "reason", "timings"}`.
    pub fn to_json(&self) -> Value {
        match self {
            Event::Token { id, text, logprobs } => {
                let mut v = json!({ "type": "token", "id": id, "text": text });
                if let Some(lp) = logprobs {
                    let top: Vec<Value> = lp.top.iter().map(|(t, l)| json!([t, l])).collect();
                    v["logprobs"] = json!({ "logprob": lp.logprob, "top": top });
                }
                v
            }
            Event::Draft { block, step, text } => {
                json!({ "type": "draft", "block": block, "step": step, "text": text })
            }
            Event::Done { reason, timings } => json!({
                "type": "done",
                "reason": reason.name(),
                "timings": timings.to_json(),
            }),
        }
    }
}

impl Error {
    /// `{"code", "message"}`: what the JS API rejects with.
    pub fn to_json(&self) -> Value {
        json!({ "code": self.code(), "message": self.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<GenerateRequest, Error> {
        GenerateRequest::from_json(&serde_json::from_str(s).expect("test JSON"))
    }

    #[test]
    fn a_chat_request_with_sampling() {
        let r = parse(
            r#"{"messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"}],
                "maxTokens": 12, "temperature": 0.7, "topK": 40, "topP": 0.9,
                "seed": 7, "stop": ["\n\n"], "stopLoops": true, "ignoreEos": true}"#,
        )
        .expect("valid request");
        let Prompt::Chat(m) = &r.prompt else {
            panic!("expected a chat prompt, got {:?}", r.prompt)
        };
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].role, m[1].content.as_str()), (Role::System, "Hi"));
        assert_eq!(r.max_tokens, 12);
        assert_eq!(
            (
                r.sampling.temperature,
                r.sampling.top_k,
                r.sampling.top_p,
                r.sampling.seed
            ),
            (0.7, 40, 0.9, 7)
        );
        assert_eq!(r.stop, vec!["\n\n".to_string()]);
        assert_eq!(r.sampling.min_p, SamplingParams::default().min_p);
        assert!(r.stop_loops && r.ignore_eos && !r.parse_special);
    }

    /// `images` opens a message with that many placeholders; image parts sit where they are.
    #[test]
    fn messages_with_images() {
        let r = parse(
            r#"{"messages": [{"role": "user", "content": "Hi", "images": 2},
                             {"role": "assistant", "content": "Two."},
                             {"role": "user", "content": [{"type": "text", "text": "A "},
                                                          {"type": "image"},
                                                          {"type": "text", "text": " and"}]}]}"#,
        )
        .expect("valid request");
        let Prompt::Chat(m) = &r.prompt else {
            panic!("expected a chat prompt, got {:?}", r.prompt)
        };
        assert_eq!((m[0].images, m[0].content.as_str()), (2, "Hi"));
        assert_eq!(m[1].images, 0);
        assert_eq!(m[2].content, format!("A {IMAGE_PLACEHOLDER} and"));
    }

    /// `audio` counts and audio parts, beside images.
    #[test]
    fn messages_with_audio() {
        let r = parse(
            r#"{"messages": [{"role": "user", "content": "Hi", "images": 1, "audio": 2},
                             {"role": "user", "content": [{"type": "audio"},
                                                          {"type": "text", "text": " said?"}]}]}"#,
        )
        .expect("valid request");
        let Prompt::Chat(m) = &r.prompt else {
            panic!("expected a chat prompt, got {:?}", r.prompt)
        };
        assert_eq!((m[0].images, m[0].audio), (1, 2));
        assert_eq!(m[1].content, format!("{AUDIO_PLACEHOLDER} said?"));
        let bad = parse(r#"{"messages": [{"role": "user", "content": "x", "audio": -1}]}"#);
        assert!(bad.is_err());
        let video = parse(r#"{"messages": [{"role": "user", "content": [{"type": "video"}]}]}"#);
        assert!(video.is_err());
    }

    #[test]
    fn text_and_token_prompts() {
        assert!(
            matches!(parse(r#"{"prompt": "Once"}"#).map(|r| r.prompt), Ok(Prompt::Text(t)) if t == "Once")
        );
        assert!(
            matches!(parse(r#"{"tokens": [2, 651]}"#).map(|r| r.prompt), Ok(Prompt::Tokens(t)) if t == [2, 651])
        );
    }

    #[test]
    fn bad_requests_are_errors_with_a_code() {
        for bad in [
            "[]",
            "{}",
            r#"{"prompt": 3}"#,
            r#"{"messages": [{"role": "robot", "content": "x"}]}"#,
            r#"{"messages": [{"role": "user"}]}"#,
            r#"{"tokens": [-1]}"#,
            r#"{"prompt": "x", "maxTokens": 1.5}"#,
            r#"{"prompt": "x", "maxTokens": -3}"#,
            r#"{"prompt": "x", "temperature": -1}"#,
            r#"{"prompt": "x", "topP": 1.5}"#,
            r#"{"prompt": "x", "repeatPenalty": 0}"#,
            r#"{"prompt": "x", "topK": 65}"#,
            r#"{"prompt": "x", "parseSpecial": 1}"#,
            r#"{"prompt": "x", "stopLoops": "yes"}"#,
            r#"{"prompt": "x", "topK": "many"}"#,
            r#"{"prompt": "x", "stop": [""]}"#,
            r#"{"messages": [{"role": "user", "content": "x", "images": -1}]}"#,
            r#"{"messages": [{"role": "user", "content": "x", "images": 4294967295}]}"#,
            r#"{"messages": [{"role": "user", "content": [{"type": "video"}]}]}"#,
            r#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#,
            r#"{"messages": [{"role": "user", "content": 7}]}"#,
        ] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.code(), "bad_request", "{bad}: {e}");
        }
    }

    #[test]
    fn session_options() {
        let o = session_options_from_json(&json!({"context": 512})).expect("valid");
        assert_eq!(
            (o.context, o.max_batch),
            (512, SessionOptions::default().max_batch)
        );
        assert!(session_options_from_json(&json!({"context": 0})).is_err());
        assert!(session_options_from_json(&json!({"maxBatch": 1e12})).is_err());
        let d = session_options_from_json(&Value::Null).expect("null is the default");
        assert_eq!(d.context, SessionOptions::default().context);
    }

    #[test]
    fn events_as_json() {
        let t = Event::Token {
            id: 5,
            text: "é".into(),
            logprobs: None,
        };
        assert_eq!(t.to_json(), json!({"type": "token", "id": 5, "text": "é"}));
        let t = Event::Token {
            id: 5,
            text: String::new(),
            logprobs: Some(wgemma_text::TokenLogprobs {
                token: 5,
                logprob: -0.5,
                top: vec![(5, -0.5), (9, -1.0)],
            }),
        };
        assert_eq!(
            t.to_json()["logprobs"],
            json!({"logprob": -0.5, "top": [[5, -0.5], [9, -1.0]]})
        );
        let d = Event::Done {
            reason: StopReason::Cancelled,
            timings: Timings::default(),
        }
        .to_json();
        assert_eq!(d["reason"], "aborted");
        assert_eq!(d["timings"]["generatedTokens"], 0);
        let t = Timings {
            encoded_images: 2,
            encode_ms: 12.5,
            ..Timings::default()
        };
        assert_eq!(
            (
                t.to_json()["encodedImages"].clone(),
                t.to_json()["encodeMs"].clone()
            ),
            (json!(2), json!(12.5))
        );
    }
}
