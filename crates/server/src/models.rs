//! The models a server holds: resolved by name (an Ollama name or a GGUF path) and loaded on
//! first use, each with its sessions (`sessions.rs`); unloaded after a while unused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wgemma::{
    ContextOptions, DiffusionModel, LoadOptions, Model, ModelInfo, ModelSource, Prompt,
    SamplingHints, Tokenizer,
};

use crate::error::ApiError;
use crate::sessions::{Job, Sessions};

/// A model the server offers by name before any request asks for it.
#[derive(Clone, Debug)]
pub struct ServedModel {
    /// What clients call it (`gemma3:270m`, a file name).
    pub name: String,
    /// Where it is: a GGUF path or an Ollama name ([`ModelSource::resolve`]).
    pub spec: String,
    /// A llama.cpp projector (mmproj GGUF) with the model's vision or audio tower, where the
    /// model file lacks them.
    pub projector: Option<std::path::PathBuf>,
}

/// How each model is run.
#[derive(Clone, Debug)]
pub struct ModelSettings {
    /// Sessions per model: requests served at once, each with its own KV cache.
    pub parallel: usize,
    /// Tokens of context a session holds.
    pub context: usize,
    /// Requests that may wait for a session; more are refused (503).
    pub queue: usize,
    /// Unload a model unused this long (`None`: keep it).
    pub idle_unload: Option<Duration>,
    pub gpu: ContextOptions,
}

/// A model as loaded: one that writes a token at a time (its requests batched), or a text
/// diffusion model (DiffusionGemma: a block at a time, one request after another).
#[derive(Clone)]
pub enum LoadedModel {
    Text(Model),
    Diffusion(DiffusionModel),
}

impl LoadedModel {
    pub fn tokenizer(&self) -> &Tokenizer {
        match self {
            LoadedModel::Text(m) => m.tokenizer(),
            LoadedModel::Diffusion(m) => m.tokenizer(),
        }
    }

    pub fn info(&self) -> &ModelInfo {
        match self {
            LoadedModel::Text(m) => m.info(),
            LoadedModel::Diffusion(m) => m.info(),
        }
    }

    pub fn gpu_bytes(&self) -> u64 {
        match self {
            LoadedModel::Text(m) => m.gpu_bytes(),
            LoadedModel::Diffusion(m) => m.gpu_bytes(),
        }
    }

    /// The most positions a session of the model holds.
    pub fn context_length(&self) -> usize {
        match self {
            LoadedModel::Text(m) => m.config().context_length,
            LoadedModel::Diffusion(m) => m.config().text.context_length,
        }
    }

    /// The prompt's tokens, by which a request goes to the session whose cache holds their
    /// start; none for a diffusion model, whose sessions keep no cache between requests.
    fn cache_key(&self, prompt: &Prompt, parse_special: bool) -> Vec<u32> {
        match self {
            LoadedModel::Text(m) => m.prompt_tokens(prompt, parse_special).unwrap_or_default(),
            LoadedModel::Diffusion(_) => Vec::new(),
        }
    }
}

/// A loaded model and the sessions that serve it.
pub struct Loaded {
    pub name: String,
    pub model: LoadedModel,
    /// Sampling settings the model recommends (its Ollama parameters, else its GGUF's).
    pub hints: SamplingHints,
    pub context: usize,
    pub sessions: Arc<Sessions>,
    last_used: Mutex<Instant>,
    /// How long to stay loaded unused: the server's setting until a request's `keep_alive`
    /// says otherwise (`None`: forever).
    keep_alive: Mutex<Option<Duration>>,
}

impl Loaded {
    /// Stay loaded this long after the last request (`Duration::MAX`: forever).
    pub fn set_keep_alive(&self, d: Duration) {
        *lock(&self.keep_alive) = (d != Duration::MAX).then_some(d);
    }

    /// When the model unloads if nothing asks for it (`None`: never).
    pub fn expires_at(&self) -> Option<std::time::SystemTime> {
        let limit = (*lock(&self.keep_alive))?;
        let left = limit.saturating_sub(self.idle_for());
        std::time::SystemTime::now().checked_add(left)
    }

    fn expired(&self) -> bool {
        lock(&self.keep_alive).is_some_and(|limit| self.idle_for() >= limit)
    }

    /// Hands `job` to a session or queues it; refused when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        *lock(&self.last_used) = Instant::now();
        // The prompt's tokens pick the session whose cache holds its start; a prompt that
        // cannot be tokenized fails in the session, with the runtime's error.
        let tokens = self
            .model
            .cache_key(&job.request.prompt, job.request.parse_special);
        self.sessions.submit(job, &tokens)
    }

    /// Requests queued or running now.
    pub fn pending(&self) -> usize {
        self.sessions.pending()
    }

    /// Time since its last request started or, later, its last generation ended: a
    /// request longer than the keep-alive does not leave the model to unload at its end.
    fn idle_for(&self) -> Duration {
        let started = *lock(&self.last_used);
        started.max(self.sessions.last_done()).elapsed()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where one name's model lives once loaded.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Loaded>>>>;

/// The models by name: those configured, and any a request names that resolves.
pub struct Registry {
    configured: Vec<ServedModel>,
    settings: ModelSettings,
    /// One slot per name; a slot's lock is held while its model loads, so that two requests
    /// for a new model load it once.
    slots: Mutex<HashMap<String, Slot>>,
    /// The loaded models by name, apart from the slots' load locks, so that listings see a
    /// model while another request for it holds its slot.
    loaded: Arc<Mutex<HashMap<String, Arc<Loaded>>>>,
}

impl Registry {
    pub fn new(configured: Vec<ServedModel>, settings: ModelSettings) -> Self {
        Self {
            configured,
            settings,
            slots: Mutex::new(HashMap::new()),
            loaded: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The configured models' names, in order.
    pub fn configured(&self) -> &[ServedModel] {
        &self.configured
    }

    /// The model called `name` (the first configured one when `name` is empty), loaded if it
    /// is not yet.
    pub async fn get(&self, name: &str) -> Result<Arc<Loaded>, ApiError> {
        let served = self.lookup(name)?;
        let slot = lock(&self.slots)
            .entry(served.name.clone())
            .or_default()
            .clone();
        let mut guard = slot.lock_owned().await;
        if let Some(loaded) = guard.as_ref() {
            return Ok(loaded.clone());
        }
        let (settings, listed) = (self.settings.clone(), self.loaded.clone());
        // The load and its registration run in a task of their own, holding the slot: a
        // client that goes away while the model loads leaves it loaded for the next request
        // (which waits on the slot) rather than loaded twice.
        let task = tokio::spawn(async move {
            let loaded = tokio::task::spawn_blocking(move || load(served, &settings))
                .await
                .map_err(|e| ApiError::internal(format!("loading stopped: {e}")))??;
            let loaded = Arc::new(loaded);
            *guard = Some(loaded.clone());
            lock(&listed).insert(loaded.name.clone(), loaded.clone());
            Ok::<_, ApiError>(loaded)
        });
        task.await
            .map_err(|e| ApiError::internal(format!("loading stopped: {e}")))?
    }

    fn lookup(&self, name: &str) -> Result<ServedModel, ApiError> {
        if name.is_empty() {
            return self
                .configured
                .first()
                .cloned()
                .ok_or_else(|| ApiError::model_not_found(name, "no model is configured"));
        }
        if let Some(m) = self.configured.iter().find(|m| m.name == name) {
            return Ok(m.clone());
        }
        // An Ollama name or a path the server was not started with: the name is the spec.
        match ModelSource::resolve(name) {
            Ok(_) => Ok(ServedModel {
                name: name.to_string(),
                spec: name.to_string(),
                projector: None,
            }),
            Err(e) => Err(ApiError::model_not_found(name, e)),
        }
    }

    /// The models loaded now.
    pub fn loaded(&self) -> Vec<Arc<Loaded>> {
        lock(&self.loaded).values().cloned().collect()
    }

    /// Unloads the models unused for longer than their keep-alive with nothing pending.
    pub fn unload_idle(&self) {
        let slots: Vec<_> = lock(&self.slots).values().cloned().collect();
        for slot in slots {
            if let Ok(mut guard) = slot.try_lock() {
                let idle = guard
                    .as_ref()
                    .is_some_and(|l| l.pending() == 0 && l.expired());
                if idle {
                    if let Some(l) = guard.take() {
                        lock(&self.loaded).remove(&l.name);
                        tracing::info!(model = %l.name, "unloading an idle model");
                    }
                }
            }
        }
    }
}

/// Loads `served` and starts its session threads.
fn load(served: ServedModel, settings: &ModelSettings) -> Result<Loaded, ApiError> {
    let _span = tracing::info_span!("load", model = %served.name).entered();
    let source = ModelSource::resolve(&served.spec)
        .map_err(|e| ApiError::model_not_found(&served.name, e))?;
    let opts = LoadOptions {
        gpu: settings.gpu.clone(),
        mmproj: served.projector.clone().or(source.projector.clone()),
        ..LoadOptions::default()
    };
    let failed =
        |e: wgemma::Error| ApiError::internal(format!("loading {}: {e}", source.model.display()));
    let header = wgemma::gguf::read_file_header(&source.model)
        .map_err(|e| failed(wgemma::Error::Gguf(e)))?;
    let model = if wgemma::is_diffusion(&header) {
        let m = pollster::block_on(DiffusionModel::load_file(&source.model, opts));
        LoadedModel::Diffusion(m.map_err(failed)?)
    } else {
        LoadedModel::Text(
            pollster::block_on(Model::load_file(&source.model, opts)).map_err(failed)?,
        )
    };
    let hints = source.sampling_hints().or(model.info().sampling.clone());
    let context = settings.context.min(model.context_length()).max(1);
    let sessions = Sessions::start(&model, settings.parallel, context, settings.queue)?;
    tracing::info!(model = %served.name, context, parallel = settings.parallel, "loaded");
    Ok(Loaded {
        name: served.name,
        model,
        hints,
        context,
        sessions,
        last_used: Mutex::new(Instant::now()),
        keep_alive: Mutex::new(settings.idle_unload),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that goes away while its model loads leaves the load to finish: the model
    /// is listed as loaded, and the next request gets that one rather than loading it again.
    #[test]
    fn a_load_outlives_the_request_that_started_it() {
        let fixture = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../gemma4-audio/tests/fixtures/gemma4_tiny_audio.gguf");
        let registry = Arc::new(Registry::new(
            vec![ServedModel {
                name: "tiny".into(),
                spec: fixture.display().to_string(),
                projector: None,
            }],
            ModelSettings {
                parallel: 1,
                context: 256,
                queue: 4,
                idle_unload: None,
                gpu: ContextOptions::default().with_env(),
            },
        ));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let r = registry.clone();
            let gave_up =
                tokio::time::timeout(Duration::from_millis(1), async move { r.get("tiny").await })
                    .await;
            assert!(
                gave_up.is_err(),
                "the request gave up before the model loaded"
            );
            let start = Instant::now();
            while registry.loaded().is_empty() {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "the load stopped with its request"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let first = registry.loaded()[0].clone();
            let next = registry.get("tiny").await.unwrap();
            assert!(Arc::ptr_eq(&first, &next));
        });
    }
}
