//! Ollama's API: `POST /api/chat` and `/api/generate` (NDJSON streamed by default, or whole),
//! `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`.

use std::convert::Infallible;
use std::time::{Duration, Instant, SystemTime};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use wgemma::gguf::read_file_header;
use wgemma::{ImageInput, ModelInfo, ModelSource, Prompt, Role, StopReason, Timings};

use crate::error::{ApiError, Dialect};
use crate::generation::{Generation, Piece, Reply};
use crate::logprobs;
use crate::request::{
    Ask, Media, Sampling, base64_bytes, boolean, chat_logprobs, message, number, object, role,
    stop_strings, string, whole,
};
use crate::{AppState, json_body};

/// The Ollama version this API follows (clients read it to pick features).
const OLLAMA_VERSION: &str = "0.12.0";

pub async fn chat(state: AppState, body: Result<Bytes, BytesRejection>) -> Response {
    respond(state, body, Endpoint::Chat)
        .await
        .unwrap_or_else(|e| e.speaking(Dialect::Ollama).into_response())
}

pub async fn generate(state: AppState, body: Result<Bytes, BytesRejection>) -> Response {
    respond(state, body, Endpoint::Generate)
        .await
        .unwrap_or_else(|e| e.speaking(Dialect::Ollama).into_response())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Generate,
}

async fn respond(
    State(app): AppState,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = json_body(body)?;
    let o = object(&body)?;
    let name = string(o, "model")?
        .ok_or_else(|| ApiError::bad_request("`model` is required"))?
        .to_string();
    let stream = boolean(o, "stream")?.unwrap_or(true);
    let keep_alive = keep_alive(o)?;
    let ask = match endpoint {
        Endpoint::Chat => chat_ask(o)?,
        Endpoint::Generate => generate_ask(o)?,
    };
    let model = app.registry.get(&name).await?;
    if let Some(k) = keep_alive {
        model.set_keep_alive(k);
    }
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let Some(ask) = ask else {
        // No prompt: Ollama's way to load a model (or, with keep_alive 0, unload it).
        let done = json!({"model": name, "created_at": rfc3339(SystemTime::now()),
            "done": true, "done_reason": if keep_alive == Some(Duration::ZERO) { "unload" } else { "load" }});
        let mut done = done;
        put_text(&mut done, endpoint, "");
        return Ok(Json(done).into_response());
    };
    let ask_logprobs = ask.logprobs.is_some();
    let generation = Generation::start(model, ask, started, load_ms).await?;
    if stream {
        Ok(ndjson(generation, name, endpoint))
    } else {
        let load_ms = generation.load_ms;
        let asked = ask_logprobs;
        let model = generation.model.clone();
        let Reply {
            text,
            reason,
            timings,
            logprobs: lps,
        } = generation.collect().await?;
        let mut done = final_line(&name, endpoint, reason, &timings, started, load_ms);
        put_text(&mut done, endpoint, &text);
        if asked {
            done["logprobs"] = logprobs::entries(model.model.tokenizer(), &lps);
        }
        Ok(Json(done).into_response())
    }
}

/// `keep_alive`: seconds, or a duration such as `"5m"`; negative keeps the model loaded.
fn keep_alive(o: &Map<String, Value>) -> Result<Option<Duration>, ApiError> {
    let bad = || ApiError::bad_request("`keep_alive` must be seconds or a duration like \"5m\"");
    let secs = match o.get("keep_alive") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(bad)?,
        Some(Value::String(s)) => {
            let s = s.trim();
            let (sign, magnitude) = s.strip_prefix('-').map_or((1.0, s), |m| (-1.0, m));
            let secs = match magnitude.parse::<f64>() {
                Ok(x) => x,
                Err(_) => humantime::parse_duration(magnitude)
                    .map_err(|_| bad())?
                    .as_secs_f64(),
            };
            sign * secs
        }
        Some(_) => return Err(bad()),
    };
    if !secs.is_finite() {
        return Err(bad());
    }
    Ok(Some(if secs < 0.0 {
        Duration::MAX
    } else {
        Duration::from_secs_f64(secs.min(1e9))
    }))
}

/// What `options` (Ollama's names) and `format` ask of a reply.
struct Settings {
    sampling: Sampling,
    max_tokens: Option<u64>,
    stop: Vec<String>,
    /// An instruction for the format asked (there is no constrained sampling yet).
    hint: Option<String>,
}

fn settings(o: &Map<String, Value>) -> Result<Settings, ApiError> {
    let empty = Map::new();
    let opts = match o.get("options") {
        None | Some(Value::Null) => &empty,
        Some(v) => object(v)?,
    };
    let sampling = Sampling {
        temperature: number(opts, "temperature")?,
        top_p: number(opts, "top_p")?,
        top_k: whole(opts, "top_k", 1 << 20)?,
        min_p: number(opts, "min_p")?,
        seed: number(opts, "seed")?.map(|s| s as i64 as u64),
        repeat_penalty: number(opts, "repeat_penalty")?,
        frequency_penalty: number(opts, "frequency_penalty")?,
        presence_penalty: number(opts, "presence_penalty")?,
        penalty_last_n: whole(opts, "repeat_last_n", 1 << 20)?,
    };
    // num_predict: -1 (or absent) is unbounded, -2 fills the context.
    let max_tokens = match number(opts, "num_predict")? {
        None => None,
        Some(n) if n < 0.0 => None,
        Some(_) => whole(opts, "num_predict", 1 << 24)?,
    };
    let hint = match o.get("format") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => {
            Some("Reply with one valid JSON object and nothing else.".to_string())
        }
        Some(Value::Object(schema)) => Some(format!(
            "Reply with one valid JSON object that follows this JSON schema, and nothing else: {}",
            Value::Object(schema.clone())
        )),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`format` must be \"json\" or a JSON schema",
            ));
        }
    };
    Ok(Settings {
        sampling,
        max_tokens,
        stop: stop_strings(opts, "stop")?,
        hint,
    })
}

/// Base64 images (Ollama's `images`), decoded into `media`.
fn images(o: &Map<String, Value>, media: &mut Media) -> Result<usize, ApiError> {
    let list = match o.get("images") {
        None | Some(Value::Null) => return Ok(0),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::bad_request(
                "`images` must be a list of base64 strings",
            ));
        }
    };
    for image in list {
        media.room_for(false)?;
        let data = image
            .as_str()
            .ok_or_else(|| ApiError::bad_request("`images` must be a list of base64 strings"))?;
        media
            .images
            .push(ImageInput::from_bytes(base64_bytes(data)?));
    }
    Ok(list.len())
}

fn chat_ask(o: &Map<String, Value>) -> Result<Option<Ask>, ApiError> {
    let Settings {
        sampling,
        max_tokens,
        stop,
        hint,
    } = settings(o)?;
    let list = match o.get("messages") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::bad_request("`messages` must be a list")),
    };
    let mut media = Media::default();
    let mut messages = Vec::with_capacity(list.len() + 1);
    if let Some(hint) = hint {
        messages.push(message(Role::System, hint, 0, 0));
    }
    for m in list {
        let m = object(m)?;
        let name = string(m, "role")?
            .ok_or_else(|| ApiError::bad_request("every message needs a string `role`"))?;
        let content = string(m, "content")?.unwrap_or_default().to_string();
        let n = images(m, &mut media)?;
        messages.push(message(role(name)?, content, n, 0));
    }
    Ok(Some(Ask {
        logprobs: chat_logprobs(o)?,
        prompt: Prompt::Chat(messages),
        media,
        sampling,
        max_tokens,
        stop,
        ignore_eos: false,
    }))
}

fn generate_ask(o: &Map<String, Value>) -> Result<Option<Ask>, ApiError> {
    let Settings {
        sampling,
        max_tokens,
        stop,
        hint,
    } = settings(o)?;
    let prompt = string(o, "prompt")?.unwrap_or_default().to_string();
    let mut media = Media::default();
    let n = images(o, &mut media)?;
    if prompt.is_empty() && n == 0 {
        return Ok(None);
    }
    if o.get("suffix").is_some_and(|s| !s.is_null()) {
        return Err(ApiError::unsupported("`suffix` is not supported"));
    }
    let prompt = if boolean(o, "raw")?.unwrap_or(false) {
        if n > 0 {
            return Err(ApiError::bad_request("`raw` prompts take no `images`"));
        }
        Prompt::Text(prompt)
    } else {
        let mut messages = Vec::new();
        let system = [hint.as_deref(), string(o, "system")?]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("\n\n");
        if !system.is_empty() {
            messages.push(message(Role::System, system, 0, 0));
        }
        messages.push(message(Role::User, prompt, n, 0));
        Prompt::Chat(messages)
    };
    Ok(Some(Ask {
        logprobs: chat_logprobs(o)?,
        prompt,
        media,
        sampling,
        max_tokens,
        stop,
        ignore_eos: false,
    }))
}

/// The reply's text in the endpoint's field.
fn put_text(line: &mut Value, endpoint: Endpoint, text: &str) {
    match endpoint {
        Endpoint::Chat => line["message"] = json!({"role": "assistant", "content": text}),
        Endpoint::Generate => line["response"] = json!(text),
    }
}

/// The last line: Ollama's timings, in nanoseconds.
fn final_line(
    model: &str,
    endpoint: Endpoint,
    reason: StopReason,
    t: &Timings,
    started: Instant,
    load_ms: f64,
) -> Value {
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    let mut line = json!({
        "model": model,
        "created_at": rfc3339(SystemTime::now()),
        "done": true,
        "done_reason": if matches!(reason, StopReason::MaxTokens | StopReason::ContextFull) { "length" } else { "stop" },
        "total_duration": started.elapsed().as_nanos() as u64,
        "load_duration": ns(load_ms),
        "prompt_eval_count": t.prompt_tokens,
        "prompt_eval_duration": ns(t.prompt_ms),
        "eval_count": t.generated_tokens,
        "eval_duration": ns(t.decode_ms),
    });
    if endpoint == Endpoint::Generate {
        line["context"] = json!([]);
    }
    line
}

/// The reply as newline-delimited JSON: a line per piece of text, then the final one.
fn ndjson(generation: Generation, model: String, endpoint: Endpoint) -> Response {
    let started = generation.started;
    let load_ms = generation.load_ms;
    let lines = futures::stream::unfold(Some(generation), move |generation| {
        let model = model.clone();
        async move {
            let mut generation = generation?;
            let line = match generation.next().await? {
                Piece::Text {
                    text: t,
                    logprobs: lp,
                } => {
                    let mut line = json!({"model": model, "created_at": rfc3339(SystemTime::now()), "done": false});
                    put_text(&mut line, endpoint, &t);
                    if let Some(lp) = lp {
                        let tok = generation.model.model.tokenizer();
                        line["logprobs"] = logprobs::entries(tok, &[lp]);
                    }
                    Some(line)
                }
                Piece::Done { reason, timings } => {
                    let mut line = final_line(&model, endpoint, reason, &timings, started, load_ms);
                    put_text(&mut line, endpoint, "");
                    return Some((Ok::<_, Infallible>(Bytes::from(format!("{line}\n"))), None));
                }
                Piece::Failed(e) => {
                    let line = json!({"error": e.message});
                    return Some((Ok(Bytes::from(format!("{line}\n"))), None));
                }
            };
            let bytes = line.map_or_else(Bytes::new, |l| Bytes::from(format!("{l}\n")));
            Some((Ok(bytes), Some(generation)))
        }
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// What Ollama's listings say about a model file.
fn details(info: &ModelInfo) -> Value {
    let quant = info
        .dtypes
        .iter()
        .max_by_key(|(_, (_, bytes))| *bytes)
        .map(|(t, _)| t.name().to_string())
        .unwrap_or_default();
    json!({
        "format": "gguf",
        "family": info.architecture.clone().unwrap_or_default(),
        "families": [info.architecture.clone().unwrap_or_default()],
        "parameter_size": format!("{:.1}B", info.parameter_count as f64 / 1e9),
        "quantization_level": quant,
    })
}

/// A model's file, header and modification time, without loading it.
/// What `/api/show` and `/api/tags` say of a model: where it is, its header's facts, when
/// its file changed, and its chat template's text ([`template_text`]).
struct Described {
    source: ModelSource,
    info: ModelInfo,
    modified: SystemTime,
    template: String,
}

fn describe(spec: &str) -> Result<Described, ApiError> {
    let source = ModelSource::resolve(spec).map_err(|e| ApiError::model_not_found(spec, e))?;
    let header = read_file_header(&source.model)
        .map_err(|e| ApiError::model_not_found(spec, format!("{}: {e}", source.model.display())))?;
    let modified = std::fs::metadata(&source.model)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let template = template_text(&source, &header.metadata);
    Ok(Described {
        info: ModelInfo::new(&header),
        source,
        modified,
        template,
    })
}

/// A model's chat template as Ollama shows it: the template of its Ollama manifest (Go
/// template text), else its GGUF's `tokenizer.chat_template` (Jinja), else nothing. A
/// template file that cannot be read, or is larger than any template (1 MiB), is left out.
fn template_text(source: &ModelSource, meta: &wgemma::gguf::Metadata) -> String {
    const MOST: u64 = 1 << 20;
    let from_manifest = source.template.as_ref().and_then(|path| {
        let len = std::fs::metadata(path).ok()?.len();
        (len <= MOST)
            .then(|| std::fs::read_to_string(path).ok())
            .flatten()
    });
    from_manifest
        .or_else(|| {
            meta.opt_str("tokenizer.chat_template")
                .ok()
                .flatten()
                .map(str::to_string)
        })
        .unwrap_or_default()
}

pub async fn tags(State(app): AppState) -> Json<Value> {
    let models: Vec<Value> = app
        .registry
        .configured()
        .iter()
        .filter_map(|m| {
            let Described { info, modified, .. } = describe(&m.spec).ok()?;
            Some(json!({
                "name": m.name,
                "model": m.name,
                "modified_at": rfc3339(modified),
                "size": info.file_size,
                "digest": "",
                "details": details(&info),
            }))
        })
        .collect();
    Json(json!({ "models": models }))
}

pub async fn show(State(app): AppState, body: Result<Bytes, BytesRejection>) -> Response {
    let shown = async {
        let body = json_body(body)?;
        let o = object(&body)?;
        let name = string(o, "model")?
            .or(string(o, "name")?)
            .ok_or_else(|| ApiError::bad_request("`model` is required"))?;
        let spec = app
            .registry
            .configured()
            .iter()
            .find(|m| m.name == name)
            .map_or(name, |m| m.spec.as_str());
        let Described {
            source,
            info,
            modified,
            template,
        } = describe(spec)?;
        let mut capabilities = vec!["completion"];
        if info.vision.as_ref().is_some_and(Result::is_ok) || source.projector.is_some() {
            capabilities.push("vision");
        }
        if info.audio.as_ref().is_some_and(Result::is_ok) {
            capabilities.push("audio");
        }
        Ok::<_, ApiError>(Json(json!({
            "modelfile": "",
            "parameters": "",
            "template": template,
            "details": details(&info),
            "model_info": info.to_json(),
            "capabilities": capabilities,
            "modified_at": rfc3339(modified),
        })))
    };
    shown.await.map_or_else(
        |e| e.speaking(Dialect::Ollama).into_response(),
        IntoResponse::into_response,
    )
}

pub async fn ps(State(app): AppState) -> Json<Value> {
    let models: Vec<Value> = app
        .registry
        .loaded()
        .iter()
        .map(|l| {
            let info = l.model.info();
            json!({
                "name": l.name,
                "model": l.name,
                "size": l.model.gpu_bytes(),
                "size_vram": l.model.gpu_bytes(),
                "digest": "",
                "details": details(info),
                "expires_at": l.expires_at().map(rfc3339),
                "context_length": l.context,
            })
        })
        .collect();
    Json(json!({ "models": models }))
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_VERSION }))
}

/// `t` as RFC 3339 in UTC, as Ollama's timestamps are.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgemma::gguf::{Metadata, Value as GgufValue};

    fn source(template: Option<std::path::PathBuf>) -> ModelSource {
        ModelSource {
            model: "m.gguf".into(),
            projector: None,
            label: "m".into(),
            params: None,
            chat_template: template.is_some(),
            template,
        }
    }

    #[test]
    fn the_template_shown_is_the_manifests_else_the_ggufs() {
        let jinja = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}";
        let with = Metadata::from_entries(vec![(
            "tokenizer.chat_template".into(),
            GgufValue::String(jinja.into()),
        )])
        .unwrap();
        let without = Metadata::from_entries(Vec::new()).unwrap();
        assert_eq!(template_text(&source(None), &with), jinja);
        assert_eq!(template_text(&source(None), &without), "");
        let dir = std::env::temp_dir().join(format!("wgemma-show-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let go = dir.join("template");
        std::fs::write(&go, "{{ .Prompt }}").unwrap();
        assert_eq!(
            template_text(&source(Some(go.clone())), &with),
            "{{ .Prompt }}"
        );
        // An unreadable template file falls back to the GGUF's.
        let missing = dir.join("missing");
        assert_eq!(template_text(&source(Some(missing)), &with), jinja);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
