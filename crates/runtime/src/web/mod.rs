//! The browser binding (wasm-bindgen): what `web/worker.js` calls. The worker owns the model
//! and its sessions; the page talks to the worker through `web/wgemma.js`, so a GPU step or a
//! download never blocks the page. Errors reject with `{code, message}` objects. Images and
//! audio clips come as JS objects beside the JSON request (`image` and `audio` modules).

mod audio;
mod image;
mod range;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use futures::StreamExt;
use js_sys::{Float32Array, Function, Object, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;
use wgemma_text::{LoadProgress, PleRows, SessionOptions};

use crate::clock::now_ms;
use crate::json::session_options_from_json;
use crate::{
    CancelHandle, ContextOptions, DiffusionChat, DiffusionGenerate, DiffusionModel, Error, Event,
    GenerateRequest, LoadOptions, Model, Session, is_diffusion,
};
use audio::{audio_input, audio_inputs};
use image::{image_input, image_inputs};
use range::{JsRangeSource, js_message};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

/// A panic is a bug; its message goes to the console instead of a bare `unreachable` trap.
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| console_error(&info.to_string())));
}

fn js_value(v: &serde_json::Value) -> JsValue {
    js_sys::JSON::parse(&v.to_string()).unwrap_or(JsValue::NULL)
}

fn reject(e: &Error) -> JsValue {
    js_value(&e.to_json())
}

/// A request error (a JS argument of the wrong shape).
fn bad(msg: impl Into<String>) -> Error {
    Error::Request(msg.into())
}

/// `v[key]`, `None` where it is absent, undefined or null.
fn field(v: &JsValue, key: &str) -> Option<JsValue> {
    Reflect::get(v, &JsValue::from_str(key))
        .ok()
        .filter(|x| !x.is_undefined() && !x.is_null())
}

fn parse_json(text: &str) -> Result<serde_json::Value, Error> {
    serde_json::from_str(text).map_err(|e| Error::Request(format!("not JSON: {e}")))
}

/// Sets the `WGEMMA_*` tuning and debugging switches (a JSON object of strings, as the
/// environment variables of the README) that models loaded after this read: the page's
/// stand-in for a process environment.
#[wasm_bindgen(js_name = setKnobs)]
pub fn set_knobs(json: &str) -> Result<(), JsValue> {
    let knobs: std::collections::HashMap<String, String> = serde_json::from_str(json)
        .map_err(|e| reject(&bad(format!("knobs must be an object of strings: {e}"))))?;
    wgemma_kernels::knobs::set(knobs);
    Ok(())
}

/// A model that writes a token at a time, or a DiffusionGemma model (a block at a time).
#[derive(Clone)]
enum Engine {
    Text(Model),
    Diffusion(DiffusionModel),
}

/// A loaded model, owned by the worker.
#[wasm_bindgen]
pub struct WasmModel {
    engine: Engine,
}

/// A conversation of either kind of model.
enum Chat {
    Text(Session),
    Diffusion(DiffusionChat),
}

/// What a model of this kind cannot do.
fn not_for_diffusion(what: &str) -> JsValue {
    reject(&bad(format!(
        "{what}: not for a text diffusion (DiffusionGemma) model"
    )))
}

#[wasm_bindgen]
impl WasmModel {
    /// Loads a model through `reader` (`{size, read(offset, length) -> Promise<Uint8Array>}`),
    /// with the vision tower of a llama.cpp projector file through `mmproj` (a reader too, or
    /// null), calling `on_progress(done, total)` (bytes of both) as the weights upload.
    /// `cpu_adapter` says the page found WebGPU running on the CPU (SwiftShader), which the
    /// engine cannot see. `table_on_gpu` uploads Gemma 4's per-layer embedding table whole
    /// ([`PleRows::Gpu`]) instead of fetching a row per token.
    pub async fn load(
        reader: JsValue,
        mmproj: JsValue,
        on_progress: Option<Function>,
        cpu_adapter: bool,
        table_on_gpu: bool,
    ) -> Result<WasmModel, JsValue> {
        let source = Arc::new(JsRangeSource::new(reader).map_err(|e| reject(&e.into()))?);
        let projector = if mmproj.is_null() || mmproj.is_undefined() {
            None
        } else {
            Some(JsRangeSource::new(mmproj).map_err(|e| reject(&e.into()))?)
        };
        let on_progress = on_progress.map(|f| {
            Box::new(move |p: LoadProgress| {
                // A throwing progress callback must not abort the load.
                let _ = f.call2(
                    &JsValue::NULL,
                    &JsValue::from_f64(p.done as f64),
                    &JsValue::from_f64(p.total as f64),
                );
            }) as Box<dyn FnMut(LoadProgress)>
        });
        let opts = LoadOptions {
            on_progress,
            // Gemma 4's per-layer embedding rows: on the GPU, or by range requests as
            // tokens are fed.
            rows: Some(if table_on_gpu {
                PleRows::Gpu
            } else {
                PleRows::Fetched(source.clone())
            }),
            gpu: ContextOptions {
                cpu_adapter,
                ..ContextOptions::default().with_env()
            },
            ..LoadOptions::default()
        };
        let (header, _) = wgemma_gguf::read_header(&*source)
            .await
            .map_err(|e| reject(&e.into()))?;
        let engine = if is_diffusion(&header) {
            let model =
                DiffusionModel::load_with_projector(&*source, projector.as_ref(), opts).await;
            Engine::Diffusion(model.map_err(|e| reject(&e))?)
        } else {
            let model = Model::load_with_projector(&*source, projector.as_ref(), opts).await;
            Engine::Text(model.map_err(|e| reject(&e))?)
        };
        Ok(WasmModel { engine })
    }

    /// What the file holds (as `wgemma info --json`, without the tensor list), the vision and
    /// audio towers loaded (from either file; null without one), the text diffusion settings
    /// (`diffusion`, null for other models) and the GPU it runs on.
    pub fn info(&self) -> JsValue {
        let (mut v, ctx, bytes) = match &self.engine {
            Engine::Text(m) => (m.info().to_json(), m.gpu_context().clone(), m.gpu_bytes()),
            Engine::Diffusion(m) => (m.info().to_json(), m.gpu_context().clone(), m.gpu_bytes()),
        };
        if let Some(o) = v.as_object_mut() {
            o.remove("tensors");
            let text = match &self.engine {
                Engine::Text(m) => Some(m),
                Engine::Diffusion(_) => None,
            };
            let vision = text.and_then(|m| m.vision()).map(|t| {
                let mut v = crate::info::vision_json(&t.cfg);
                v["imageTokens"] = serde_json::json!(wgemma_vision::TOKEN_BUDGETS);
                v["defaultImageTokens"] = serde_json::json!(crate::DEFAULT_IMAGE_TOKENS);
                v
            });
            o.insert("vision".into(), vision.unwrap_or_default());
            let audio = text.and_then(|m| m.audio()).map(|t| {
                let mut v = crate::info::audio_json(&t.cfg);
                v["maxSeconds"] = serde_json::json!(wgemma_audio::MAX_DURATION_SECS);
                v
            });
            o.insert("audio".into(), audio.unwrap_or_default());
            // Token ids run below this (prompts given as ids).
            let vocab = text.map(|m| m.config().n_vocab);
            o.insert("vocab".into(), serde_json::json!(vocab));
            o.insert(
                "gpu".into(),
                serde_json::json!({
                    "adapter": ctx.info.name,
                    "backend": ctx.info.backend.to_string(),
                    "deviceType": format!("{:?}", ctx.info.device_type),
                    "shaderF16": ctx.features.shader_f16,
                    "subgroups": ctx.features.subgroups,
                    "subgroupMinSize": ctx.features.subgroup_min_size,
                    "subgroupMaxSize": ctx.features.subgroup_max_size,
                    // The side of the subgroup matrices the tiled products take (0: none).
                    "subgroupMatrix": ctx.features.subgroup_matrix,
                    "weightBytes": bytes,
                }),
            );
        }
        js_value(&v)
    }

    /// One image's soft tokens (`image` as for `generate`): resolves to `{data: Float32Array,
    /// rows, width, ms}`, `rows` tokens of `width` values each, row by row.
    #[wasm_bindgen(js_name = encodeImage)]
    pub fn encode_image(&self, image: JsValue) -> Promise {
        let image = match image_input(&image) {
            Ok(i) => i,
            Err(e) => return Promise::reject(&reject(&e)),
        };
        let engine = self.engine.clone();
        future_to_promise(async move {
            let start = now_ms();
            let encoded = match &engine {
                Engine::Text(m) => m.encode_image_to_vec(&image).await,
                Engine::Diffusion(m) => m.encode_image_to_vec(&image).await,
            };
            soft_tokens_object(encoded, start)
        })
    }

    /// One audio clip's soft tokens (`audio` as for `generate`), as `encodeImage` gives an
    /// image's (a clip over 30 s: each chunk's tokens in turn).
    #[wasm_bindgen(js_name = encodeAudio)]
    pub fn encode_audio(&self, audio: JsValue) -> Promise {
        let Engine::Text(model) = &self.engine else {
            return Promise::reject(&not_for_diffusion("audio"));
        };
        let audio = match audio_input(&audio) {
            Ok(a) => a,
            Err(e) => return Promise::reject(&reject(&e)),
        };
        let model = model.clone();
        future_to_promise(async move {
            let start = now_ms();
            let encoded = model.encode_audio_to_vec(&audio).await;
            soft_tokens_object(encoded, start)
        })
    }

    /// A new conversation; `options` is JSON (`{"context": 4096, "maxBatch": 256}`) or empty.
    /// Its pipelines are compiled now (in Chrome's GPU process, while the page waits for a
    /// prompt), not on the first request.
    pub fn session(&self, options: &str) -> Result<WasmSession, JsValue> {
        let opts = if options.trim().is_empty() {
            SessionOptions::default()
        } else {
            parse_json(options)
                .and_then(|v| session_options_from_json(&v))
                .map_err(|e| reject(&e))?
        };
        let (chat, cancel) = match &self.engine {
            Engine::Text(m) => {
                let s = m.session(opts).map_err(|e| reject(&e))?;
                s.compile_pipelines().map_err(|e| reject(&e))?;
                let cancel = s.cancel_handle();
                (Chat::Text(s), cancel)
            }
            Engine::Diffusion(m) => {
                let s = m.session(opts.context, None).map_err(|e| reject(&e))?;
                let cancel = s.cancel_handle();
                (Chat::Diffusion(s), cancel)
            }
        };
        Ok(WasmSession {
            cancel,
            session: Rc::new(RefCell::new(Some(chat))),
            diffusion_defaults: match &self.engine {
                Engine::Diffusion(m) => Some(m.config().sampler),
                Engine::Text(_) => None,
            },
        })
    }
}

/// A conversation. While a generation runs, the session is lent to it; `cancel` still works.
#[wasm_bindgen]
pub struct WasmSession {
    session: Rc<RefCell<Option<Chat>>>,
    cancel: CancelHandle,
    /// A text diffusion model's sampler settings (what a request's `steps` and
    /// `entropyBound` change).
    diffusion_defaults: Option<wgemma_diffusion::EntropyBound>,
}

#[wasm_bindgen]
impl WasmSession {
    /// Generates for `request` (JSON, see the runtime's `json` module) with `images` and
    /// `audio` (arrays of image and audio objects, each in prompt order, or null), calling
    /// `on_event(event)` for each token and the final `done`; resolves when generation ends.
    pub fn generate(
        &self,
        request: &str,
        images: JsValue,
        audio: JsValue,
        on_event: Function,
    ) -> Promise {
        // An abort that came after the previous generation had finished is stale.
        self.cancel.withdraw();
        if let Some(defaults) = self.diffusion_defaults {
            // Gemma 4 26B-A4B, which DiffusionGemma is made from, reads pictures, not sound.
            if js_sys::Array::is_array(&audio) && js_sys::Array::from(&audio).length() > 0 {
                return Promise::reject(&reject(&bad(
                    "audio with a text diffusion (DiffusionGemma) model: it has no audio tower",
                )));
            }
            let mut req = match parse_json(request)
                .and_then(|v| DiffusionGenerate::from_json(&v, defaults))
            {
                Ok(r) => r,
                Err(e) => return Promise::reject(&reject(&e)),
            };
            match image_inputs(&images) {
                Ok(i) => req.images = i,
                Err(e) => return Promise::reject(&reject(&e)),
            }
            return self.lend(async move |chat| {
                let Chat::Diffusion(d) = chat else {
                    return Err(reject(&bad("a text session")));
                };
                emit_events(d.generate(req), &on_event).await?;
                Ok(JsValue::UNDEFINED)
            });
        }
        let mut req = match parse_request(request) {
            Ok(r) => r,
            Err(e) => return Promise::reject(&e),
        };
        match (image_inputs(&images), audio_inputs(&audio)) {
            (Ok(i), Ok(a)) => (req.images, req.audio) = (i, a),
            (Err(e), _) | (_, Err(e)) => return Promise::reject(&reject(&e)),
        }
        self.lend(async move |chat| {
            let Chat::Text(session) = chat else {
                return Err(reject(&bad("a text diffusion session")));
            };
            emit_events(session.generate(req), &on_event).await?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Stops the running generation within one step (it ends with reason `aborted`).
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// GPU time per kernel of a prefill over the prompt of `request` (JSON, as for
    /// `generate`, with its `images` and `audio`: each tower's forward comes first) and of one
    /// decode step: `[{what, tokens, totalUs, kernels}]`, or null without timestamp queries.
    /// Leaves the conversation empty.
    pub fn profile(&self, request: &str, images: JsValue, audio: JsValue) -> Promise {
        let mut req = match parse_request(request) {
            Ok(r) => r,
            Err(e) => return Promise::reject(&e),
        };
        match (image_inputs(&images), audio_inputs(&audio)) {
            (Ok(i), Ok(a)) => (req.images, req.audio) = (i, a),
            (Err(e), _) | (_, Err(e)) => return Promise::reject(&reject(&e)),
        }
        self.lend(async move |chat| {
            // Text diffusion has no profile here: null, as without timestamp queries.
            let Chat::Text(session) = chat else {
                return Ok(JsValue::NULL);
            };
            let steps = session
                .profile_request(&req)
                .await
                .map_err(|e| reject(&e))?;
            Ok(steps.map_or(JsValue::NULL, |s| {
                js_value(&serde_json::Value::Array(
                    s.iter().map(|p| p.to_json()).collect(),
                ))
            }))
        })
    }

    /// Forgets the conversation.
    pub fn reset(&self) -> Promise {
        self.lend(async |chat| {
            // A text diffusion session starts afresh at every request anyway.
            if let Chat::Text(session) = chat {
                session.reset().await.map_err(|e| reject(&e))?;
            }
            Ok(JsValue::UNDEFINED)
        })
    }
}

impl WasmSession {
    /// Runs `work` with the session taken out of its slot (a call meanwhile is `busy`), then
    /// puts the session back whatever happened.
    fn lend<W>(&self, work: W) -> Promise
    where
        W: AsyncFnOnce(&mut Chat) -> Result<JsValue, JsValue> + 'static,
    {
        let slot = self.session.clone();
        future_to_promise(async move {
            let mut session = slot
                .borrow_mut()
                .take()
                .ok_or_else(|| reject(&Error::Busy))?;
            let result = work(&mut session).await;
            *slot.borrow_mut() = Some(session);
            result
        })
    }
}

/// `{data: Float32Array, rows, width, ms}` of soft tokens read back, `ms` since `start`.
fn soft_tokens_object(
    encoded: Result<(Vec<f32>, usize), Error>,
    start: f64,
) -> Result<JsValue, JsValue> {
    let (values, rows) = encoded.map_err(|e| reject(&e))?;
    let ms = now_ms() - start;
    let out = Object::new();
    let set = |k: &str, v: &JsValue| Reflect::set(&out, &JsValue::from_str(k), v);
    set("data", &Float32Array::from(&values[..]).into())?;
    set("rows", &JsValue::from_f64(rows as f64))?;
    set(
        "width",
        &JsValue::from_f64((values.len() / rows.max(1)) as f64),
    )?;
    set("ms", &JsValue::from_f64(ms))?;
    Ok(out.into())
}

fn parse_request(request: &str) -> Result<GenerateRequest, JsValue> {
    parse_json(request)
        .and_then(|v| GenerateRequest::from_json(&v))
        .map_err(|e| reject(&e))
}

/// Calls `on_event` with each event of `events` (as JSON objects).
async fn emit_events(
    events: impl futures::Stream<Item = Result<Event, Error>>,
    on_event: &Function,
) -> Result<(), JsValue> {
    let mut events = Box::pin(events);
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| reject(&e))?;
        on_event
            .call1(&JsValue::NULL, &js_value(&event.to_json()))
            .map_err(|e| {
                reject(&Error::Request(format!(
                    "the event callback threw: {}",
                    js_message(&e)
                )))
            })?;
    }
    Ok(())
}
