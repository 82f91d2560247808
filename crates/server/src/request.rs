//! What both APIs' requests become: a runtime [`GenerateRequest`] with the model's recommended
//! sampling under the request's own settings, its messages, images and audio clips.

use base64::Engine;
use serde_json::{Map, Value};
use wgemma::{
    AUDIO_PLACEHOLDER, AudioInput, GenerateRequest, IMAGE_PLACEHOLDER, ImageInput, Message, Prompt,
    Role, SamplingParams,
};

use crate::error::ApiError;
use crate::models::Loaded;

/// The largest file a `file://` image or audio URL may name.
const MAX_MEDIA_FILE_BYTES: u64 = 64 << 20;
/// The most images, and the most audio clips, one request may hold: each is decoded (a clip
/// up to 10 minutes into features) before the request is queued.
pub const MAX_MEDIA_PER_REQUEST: usize = 64;

/// A request's JSON object.
pub fn object(v: &Value) -> Result<&Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))
}

/// Parses a body as JSON.
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))
}

/// An optional finite number.
pub fn number(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("`{key}` must be a number"))),
    }
}

/// An optional whole number from 0 to `max`.
pub fn whole(o: &Map<String, Value>, key: &str, max: u64) -> Result<Option<u64>, ApiError> {
    match number(o, key)? {
        None => Ok(None),
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= max as f64 => Ok(Some(x as u64)),
        Some(x) => Err(ApiError::bad_request(format!(
            "`{key}` must be a whole number from 0 to {max}, not {x}"
        ))),
    }
}

/// An optional string.
pub fn string<'a>(o: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be a string"))),
    }
}

/// An optional boolean.
pub fn boolean(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(format!(
            "`{key}` must be true or false"
        ))),
    }
}

/// `stop`: one string or a list of them.
pub fn stop_strings(o: &Map<String, Value>, key: &str) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::bad_request(format!("`{key}` must be a string or a list of strings"));
    match o.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .filter(|s| s.as_ref().map_or(true, |s| !s.is_empty()))
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// The sampling settings a request may give (each API names them its own way).
#[derive(Clone, Debug, Default)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u64>,
    pub min_p: Option<f64>,
    pub seed: Option<u64>,
    pub repeat_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub penalty_last_n: Option<u64>,
}

impl Sampling {
    /// The model's recommendation with these settings over it, checked.
    fn params(&self, model: &Loaded) -> Result<SamplingParams, ApiError> {
        let seed = self.seed.unwrap_or_else(wgemma::fresh_seed);
        let mut p = model.hints.apply(SamplingParams::gemma(seed));
        let f = |v: Option<f64>, d: f32| v.map_or(d, |x| x as f32);
        p.temperature = f(self.temperature, p.temperature);
        p.top_p = f(self.top_p, p.top_p);
        p.min_p = f(self.min_p, p.min_p);
        p.repeat_penalty = f(self.repeat_penalty, p.repeat_penalty);
        p.frequency_penalty = f(self.frequency_penalty, p.frequency_penalty);
        p.presence_penalty = f(self.presence_penalty, p.presence_penalty);
        if let Some(k) = self.top_k {
            p.top_k = k as usize;
        }
        if let Some(n) = self.penalty_last_n {
            p.penalty_last_n = n as usize;
        }
        p.validate()
            .map_err(|e| ApiError::bad_request(format!("{} {}: {}", e.name, e.value, e.rule)))?;
        Ok(p)
    }
}

/// A prompt's images and audio clips, in prompt order.
#[derive(Default)]
pub struct Media {
    pub images: Vec<ImageInput>,
    /// Audio files' bytes, decoded by [`Ask::into_request`].
    pub audio: Vec<Vec<u8>>,
}

impl Media {
    /// Refuses one more image or clip past [`MAX_MEDIA_PER_REQUEST`] of its kind.
    pub fn room_for(&self, audio: bool) -> Result<(), ApiError> {
        let (n, what) = if audio {
            (self.audio.len(), "audio clips")
        } else {
            (self.images.len(), "images")
        };
        if n >= MAX_MEDIA_PER_REQUEST {
            return Err(ApiError::bad_request(format!(
                "more than {MAX_MEDIA_PER_REQUEST} {what} in one request"
            )));
        }
        Ok(())
    }
}

/// What a request asks for, before it becomes a [`GenerateRequest`].
pub struct Ask {
    pub prompt: Prompt,
    pub media: Media,
    pub sampling: Sampling,
    pub max_tokens: Option<u64>,
    pub stop: Vec<String>,
    /// Log-probabilities of each token and of this many top tokens (OpenAI's `logprobs`).
    pub logprobs: Option<u32>,
    /// Generate past end-of-turn tokens (llama-server's and vLLM's `ignore_eos`).
    pub ignore_eos: bool,
}

impl Ask {
    pub fn has_media(&self) -> bool {
        !self.media.images.is_empty() || !self.media.audio.is_empty()
    }

    /// The runtime's request, its images and audio decoded: slow for large files, so a
    /// caller with media runs it on a blocking thread ([`Ask::has_media`]).
    pub fn into_request(self, model: &Loaded) -> Result<GenerateRequest, ApiError> {
        let mut req = GenerateRequest::new(self.prompt);
        req.sampling = self.sampling.params(model)?;
        // Unbounded unless asked: the reply ends at its end of turn or at the context's end.
        req.max_tokens = self
            .max_tokens
            .map_or(model.context, |n| (n as usize).min(model.context));
        req.stop = self.stop;
        req.images = self
            .media
            .images
            .iter()
            .map(|i| i.decoded().map_err(|e| ApiError::runtime(&e)))
            .collect::<Result<_, _>>()?;
        req.audio = self
            .media
            .audio
            .iter()
            .map(|b| AudioInput::from_bytes(b).map_err(|e| ApiError::runtime(&e)))
            .collect::<Result<_, _>>()?;
        req.logprobs = self.logprobs;
        req.ignore_eos = self.ignore_eos;
        Ok(req)
    }
}

/// A message role by either API's name.
pub fn role(name: &str) -> Result<Role, ApiError> {
    match name {
        "system" | "developer" => Ok(Role::System),
        "user" => Ok(Role::User),
        "assistant" | "model" => Ok(Role::Assistant),
        r => Err(ApiError::bad_request(format!(
            "unknown role `{r}` (system, developer, user, assistant)"
        ))),
    }
}

/// OpenAI's message content: a string, null, or parts (`text`, `image_url`, `input_audio`),
/// each image or clip a placeholder in place, its data appended to `media`.
pub fn openai_content(content: Option<&Value>, media: &mut Media) -> Result<String, ApiError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(ApiError::bad_request(
                "`content` must be a string or a list of parts",
            ));
        }
    };
    let mut out = String::new();
    for part in parts {
        let part = object(part)?;
        match string(part, "type")? {
            Some("text") => out.push_str(
                string(part, "text")?
                    .ok_or_else(|| ApiError::bad_request("a text part needs a string `text`"))?,
            ),
            Some("image_url") => {
                let (url, detail) = match part.get("image_url") {
                    Some(Value::String(u)) => (u.as_str(), None),
                    Some(Value::Object(o)) => {
                        (string(o, "url")?.unwrap_or_default(), string(o, "detail")?)
                    }
                    _ => ("", None),
                };
                media.room_for(false)?;
                let image = ImageInput::from_bytes(media_bytes(url)?);
                media.images.push(image.with_budget(image_budget(detail)?));
                out.push_str(IMAGE_PLACEHOLDER);
            }
            Some("input_audio") => {
                let a = part
                    .get("input_audio")
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        ApiError::bad_request("an input_audio part needs `input_audio`")
                    })?;
                let data = string(a, "data")?
                    .ok_or_else(|| ApiError::bad_request("`input_audio` needs base64 `data`"))?;
                media.room_for(true)?;
                media.audio.push(base64_bytes(data)?);
                out.push_str(AUDIO_PLACEHOLDER);
            }
            t => {
                return Err(ApiError::bad_request(format!(
                    "a content part of type {t:?} (text, image_url, input_audio)"
                )));
            }
        }
    }
    Ok(out)
}

/// The soft tokens an image becomes for OpenAI's `detail`: `low` 70, `high` 1120 (Gemma 4's
/// fewest and most), `auto` or none the default (280).
fn image_budget(detail: Option<&str>) -> Result<u32, ApiError> {
    match detail {
        None | Some("auto") => Ok(wgemma::DEFAULT_IMAGE_TOKENS),
        Some("low") => Ok(70),
        Some("high") => Ok(1120),
        Some(d) => Err(ApiError::bad_request(format!(
            "`detail` {d:?} (low, high, auto)"
        ))),
    }
}

/// The bytes behind an image URL: a `data:` URI's (base64) or a local file's (`file://`).
fn media_bytes(url: &str) -> Result<Vec<u8>, ApiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (head, data) = rest
            .split_once(',')
            .ok_or_else(|| ApiError::bad_request("a data: URL needs a comma before its data"))?;
        if !head.ends_with(";base64") {
            return Err(ApiError::bad_request("a data: URL must be base64"));
        }
        return base64_bytes(data);
    }
    if let Some(path) = url.strip_prefix("file://") {
        return read_media_file(path, url);
    }
    Err(ApiError::bad_request(
        "an image URL must be a data: URI or a local file:// URL (this server fetches nothing)",
    ))
}

/// A regular file's bytes, at most [`MAX_MEDIA_FILE_BYTES`] (a FIFO would block and
/// `/dev/zero` never end, whatever their sizes say).
fn read_media_file(path: &str, url: &str) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    let bad = |e: &dyn std::fmt::Display| ApiError::bad_request(format!("{url}: {e}"));
    let meta = std::fs::metadata(path).map_err(|e| bad(&e))?;
    if !meta.is_file() {
        return Err(bad(&"not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_MEDIA_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| bad(&e))?;
    if bytes.len() as u64 > MAX_MEDIA_FILE_BYTES {
        return Err(bad(&format!("larger than {MAX_MEDIA_FILE_BYTES} bytes")));
    }
    Ok(bytes)
}

/// Standard base64, padded or not, whitespace ignored.
pub fn base64_bytes(data: &str) -> Result<Vec<u8>, ApiError> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    LENIENT
        .decode(clean)
        .map_err(|e| ApiError::bad_request(format!("bad base64: {e}")))
}

/// A chat message with `images` images and `audio` clips opening it (Ollama's form).
pub fn message(role: Role, content: String, images: usize, audio: usize) -> Message {
    Message::new(role, content)
        .with_images(images)
        .with_audio(audio)
}

/// Chat's `logprobs` (a flag) and `top_logprobs` (0 to 20), as OpenAI's chat and Ollama's
/// APIs both take them: the top tokens to report, where asked.
pub fn chat_logprobs(o: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    let top = whole(o, "top_logprobs", u64::from(wgemma::MAX_TOP_LOGPROBS))?;
    match (boolean(o, "logprobs")?.unwrap_or(false), top) {
        (true, top) => Ok(Some(top.unwrap_or(0) as u32)),
        (false, None) => Ok(None),
        (false, Some(_)) => Err(ApiError::bad_request(
            "`top_logprobs` needs `logprobs`: true",
        )),
    }
}
