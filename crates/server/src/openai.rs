//! OpenAI's API: `POST /v1/chat/completions`, `POST /v1/completions` (streamed as server-sent
//! events or whole) and `GET /v1/models`.

use std::convert::Infallible;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{Map, Value, json};
use wgemma::{Message, Prompt, Timings, TokenLogprobs};

use crate::error::ApiError;
use crate::generation::{Generation, Piece, Reply, finish_reason};
use crate::logprobs;
use crate::models::Loaded;
use crate::request::{
    Ask, Media, Sampling, boolean, chat_logprobs, number, object, openai_content, role,
    stop_strings, string, whole,
};
use crate::{AppState, json_body};

/// The most tokens a request may ask for.
const MAX_TOKENS_LIMIT: u64 = 1 << 24;

pub async fn chat_completions(state: AppState, body: Result<Bytes, BytesRejection>) -> Response {
    respond(state, body, Endpoint::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn completions(state: AppState, body: Result<Bytes, BytesRejection>) -> Response {
    respond(state, body, Endpoint::Completion)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Which of the two generation endpoints a request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }
}

async fn respond(
    State(app): AppState,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = json_body(body)?;
    let o = object(&body)?;
    let name = string(o, "model")?.unwrap_or_default().to_string();
    let ask = match endpoint {
        Endpoint::Chat => chat_ask(o)?,
        Endpoint::Completion => completion_ask(o)?,
    };
    let stream = boolean(o, "stream")?.unwrap_or(false);
    let include_usage = o
        .get("stream_options")
        .and_then(Value::as_object)
        .map(|s| boolean(s, "include_usage"))
        .transpose()?
        .flatten()
        .unwrap_or(false);
    let logprobs = ask.logprobs.is_some();
    let model = app.registry.get(&name).await?;
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let generation = Generation::start(model.clone(), ask, started, load_ms).await?;
    let meta = Meta {
        loaded: model,
        logprobs,
        id: format!(
            "{}-{:x}",
            if endpoint == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            wgemma::fresh_seed()
        ),
        created: unix_now(),
        model: if name.is_empty() {
            generation.model.name.clone()
        } else {
            name
        },
        endpoint,
    };
    if stream {
        Ok(sse(generation, meta, include_usage).into_response())
    } else {
        let reply = generation.collect().await?;
        Ok(Json(meta.whole(&reply)).into_response())
    }
}

/// The settings both endpoints share.
struct Common {
    sampling: Sampling,
    max_tokens: Option<u64>,
    stop: Vec<String>,
    ignore_eos: bool,
}

fn common(o: &Map<String, Value>) -> Result<Common, ApiError> {
    if let Some(n) = whole(o, "n", 1 << 16)? {
        if n != 1 {
            return Err(ApiError::unsupported(
                "`n` must be 1 (one choice a request)",
            ));
        }
    }
    if o.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
    {
        return Err(ApiError::unsupported("`tools` are not supported"));
    }
    let sampling = Sampling {
        temperature: number(o, "temperature")?,
        top_p: number(o, "top_p")?,
        top_k: whole(o, "top_k", 1 << 20)?,
        min_p: number(o, "min_p")?,
        seed: seed(o)?,
        repeat_penalty: number(o, "repeat_penalty")?,
        frequency_penalty: number(o, "frequency_penalty")?,
        presence_penalty: number(o, "presence_penalty")?,
        penalty_last_n: None,
    };
    let max_tokens = match whole(o, "max_completion_tokens", MAX_TOKENS_LIMIT)? {
        Some(n) => Some(n),
        None => whole(o, "max_tokens", MAX_TOKENS_LIMIT)?,
    };
    Ok(Common {
        sampling,
        max_tokens,
        stop: stop_strings(o, "stop")?,
        ignore_eos: boolean(o, "ignore_eos")?.unwrap_or(false),
    })
}

/// `seed`: any integer (negative ones as their two's complement).
fn seed(o: &Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match o.get("seed") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|i| i as u64))
            .map(Some)
            .ok_or_else(|| ApiError::bad_request("`seed` must be an integer")),
    }
}

fn chat_ask(o: &Map<String, Value>) -> Result<Ask, ApiError> {
    let c = common(o)?;
    let list = o
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_request("`messages` must be a non-empty list"))?;
    let mut media = Media::default();
    let mut messages = Vec::with_capacity(list.len() + 1);
    if let Some(hint) = format_hint(o)? {
        messages.push(Message::new(wgemma::Role::System, hint));
    }
    for m in list {
        let m = object(m)?;
        let name = string(m, "role")?
            .ok_or_else(|| ApiError::bad_request("every message needs a string `role`"))?;
        let content = openai_content(m.get("content"), &mut media)?;
        messages.push(Message::new(role(name)?, content));
    }
    Ok(Ask {
        prompt: Prompt::Chat(messages),
        media,
        sampling: c.sampling,
        max_tokens: c.max_tokens,
        stop: c.stop,
        logprobs: chat_logprobs(o)?,
        ignore_eos: c.ignore_eos,
    })
}

/// `response_format`: a JSON object asked for becomes an instruction to the model (there is
/// no constrained sampling yet).
fn format_hint(o: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(format) = o.get("response_format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let format = object(format)?;
    match string(format, "type")? {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(
            "Reply with one valid JSON object and nothing else.".into(),
        )),
        Some("json_schema") => {
            let schema = format
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .map(Value::to_string)
                .unwrap_or_default();
            Ok(Some(format!(
                "Reply with one valid JSON object that follows this JSON schema, and nothing else: {schema}"
            )))
        }
        Some(t) => Err(ApiError::bad_request(format!(
            "`response_format.type` {t:?} (text, json_object, json_schema)"
        ))),
    }
}

fn completion_ask(o: &Map<String, Value>) -> Result<Ask, ApiError> {
    let c = common(o)?;
    // The legacy `logprobs`: how many top tokens (at most 5), the sampled one's always.
    let logprobs = whole(o, "logprobs", 5)?.map(|n| n as u32);
    if boolean(o, "echo")?.unwrap_or(false) {
        return Err(ApiError::unsupported("`echo` is not supported"));
    }
    Ok(Ask {
        prompt: completion_prompt(o.get("prompt"))?,
        media: Media::default(),
        sampling: c.sampling,
        // OpenAI's completions default to 16 tokens.
        max_tokens: Some(c.max_tokens.unwrap_or(16)),
        stop: c.stop,
        logprobs,
        ignore_eos: c.ignore_eos,
    })
}

/// A completion's `prompt`: a string, a list of one string, or token ids (a list of integers,
/// or a list of one such list), as OpenAI's API allows.
fn completion_prompt(prompt: Option<&Value>) -> Result<Prompt, ApiError> {
    let bad = || ApiError::bad_request("`prompt` must be a string or token ids (or a list of one)");
    let ids = |list: &[Value]| -> Result<Prompt, ApiError> {
        list.iter()
            .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect::<Option<Vec<u32>>>()
            .filter(|ids| !ids.is_empty())
            .map(Prompt::Tokens)
            .ok_or_else(bad)
    };
    match prompt {
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(inner)] => ids(inner),
            list => ids(list),
        },
        _ => Err(bad()),
    }
}

/// What every chunk or response of one request repeats.
struct Meta {
    /// The model (its tokenizer names the tokens of log-probabilities).
    loaded: std::sync::Arc<Loaded>,
    /// The request asked for log-probabilities.
    logprobs: bool,
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
}

impl Meta {
    /// The `logprobs` of a choice holding `tokens`, whose text starts `offset` characters
    /// into the reply: null where the request did not ask.
    fn logprobs(&self, tokens: &[TokenLogprobs], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let tok = self.loaded.model.tokenizer();
        match self.endpoint {
            Endpoint::Chat => logprobs::chat(tok, tokens),
            Endpoint::Completion => logprobs::completion(tok, tokens, offset),
        }
    }

    fn whole(&self, reply: &Reply) -> Value {
        let (text, finish) = (&reply.text, finish_reason(reply.reason));
        let logprobs = self.logprobs(&reply.logprobs, 0);
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
        };
        let timings = &reply.timings;
        json!({
            "id": self.id,
            "object": self.endpoint.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(timings),
        })
    }

    /// One streamed chunk: `text` as the choice's delta (with its token's log-probabilities
    /// `lp`, its text `offset` characters into the reply), or the end when `finish` is given.
    fn chunk(
        &self,
        text: Option<&str>,
        lp: Option<(&TokenLogprobs, usize)>,
        finish: Option<&str>,
    ) -> Value {
        let logprobs = match lp {
            Some((lp, offset)) => self.logprobs(std::slice::from_ref(lp), offset),
            None => Value::Null,
        };
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None if finish.is_none() => json!({"role": "assistant", "content": ""}),
                    None => json!({}),
                };
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs})
            }
            Endpoint::Completion => json!({
                "index": 0,
                "text": text.unwrap_or_default(),
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
        };
        json!({
            "id": self.id,
            "object": self.endpoint.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    fn usage_chunk(&self, timings: &Timings) -> Value {
        json!({
            "id": self.id,
            "object": self.endpoint.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(timings),
        })
    }
}

fn usage(t: &Timings) -> Value {
    json!({
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.generated_tokens,
        "total_tokens": t.prompt_tokens + t.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
    })
}

/// The reply as server-sent events: a role chunk (chat), text chunks, the end, the usage
/// when asked, then `[DONE]`. A failure after the start ends the stream with an error event.
fn sse(
    generation: Generation,
    meta: Meta,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let data = |v: Value| SseEvent::default().data(v.to_string());
    // The state: the generation (until its end), the request's facts, whether the first
    // chunk went out, and the characters of text sent so far.
    let stream = futures::stream::unfold(
        (Some(generation), meta, false, 0usize),
        move |(generation, meta, opened, sent)| async move {
            let mut generation = generation?;
            if !opened && meta.endpoint == Endpoint::Chat {
                let first = vec![data(meta.chunk(None, None, None))];
                return Some((first, (Some(generation), meta, true, sent)));
            }
            let mut now_sent = sent;
            let events = match generation.next().await {
                None => return None,
                Some(Piece::Text {
                    text,
                    logprobs: None,
                }) if text.is_empty() => Vec::new(),
                Some(Piece::Text { text, logprobs }) => {
                    now_sent += text.chars().count();
                    let lp = logprobs.as_ref().map(|lp| (lp, sent));
                    vec![data(meta.chunk(Some(&text), lp, None))]
                }
                Some(Piece::Done { reason, timings }) => {
                    let finish = Some(finish_reason(reason));
                    let mut v = vec![data(meta.chunk(None, None, finish))];
                    if include_usage {
                        v.push(data(meta.usage_chunk(&timings)));
                    }
                    v.push(SseEvent::default().data("[DONE]"));
                    return Some((v, (None, meta, true, now_sent)));
                }
                Some(Piece::Failed(e)) => {
                    let body =
                        json!({"error": {"message": e.message, "type": e.kind, "code": e.code}});
                    return Some((vec![data(body)], (None, meta, true, now_sent)));
                }
            };
            Some((events, (Some(generation), meta, true, now_sent)))
        },
    );
    let flat =
        futures::StreamExt::flat_map(stream, |v| futures::stream::iter(v.into_iter().map(Ok)));
    Sse::new(flat).keep_alive(KeepAlive::default())
}

pub async fn models(State(app): AppState) -> Json<Value> {
    let mut names: Vec<String> = app
        .registry
        .configured()
        .iter()
        .map(|m| m.name.clone())
        .collect();
    for loaded in app.registry.loaded() {
        if !names.contains(&loaded.name) {
            names.push(loaded.name.clone());
        }
    }
    let data: Vec<Value> = names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": 0, "owned_by": "wgemma"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
