//! The models a server holds: resolved by name (an Ollama name or a GGUF path) and loaded on
//! first use, each with its sessions, the threads that run them and a bounded queue of
//! requests in front of them; unloaded after a while unused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc as tmpsc;
use wgemma::{
    ContextOptions, Event, GenerateRequest, LoadOptions, Model, ModelSource, SamplingHints,
    SessionOptions,
};

use crate::error::ApiError;

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

/// One generation for a session thread: the request, and where its events go. A closed
/// channel (the client went away) stops the generation at its next step.
pub struct Job {
    pub request: GenerateRequest,
    pub events: tmpsc::Sender<Result<Event, wgemma::Error>>,
}

/// A job as queued: counted as pending until its session is done with it.
struct Queued {
    job: Job,
    _pending: Pending,
}

/// A loaded model and the sessions that serve it.
pub struct Loaded {
    pub name: String,
    pub model: Model,
    /// Sampling settings the model recommends (its Ollama parameters, else its GGUF's).
    pub hints: SamplingHints,
    pub context: usize,
    jobs: mpsc::SyncSender<Queued>,
    /// Requests queued or running.
    pending: Arc<AtomicUsize>,
    queue: usize,
    last_used: Mutex<Instant>,
    /// How long to stay loaded unused: the server's setting until a request's `keep_alive`
    /// says otherwise (`None`: forever).
    keep_alive: Mutex<Option<Duration>>,
    pub counters: Arc<Counters>,
}

/// What a model's sessions have done since it loaded (`GET /metrics`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Generations that ran to their end.
    pub finished: AtomicU64,
    /// Generations stopped because their client went away.
    pub cancelled: AtomicU64,
    /// Generations that failed.
    pub failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    /// Of those, the ones the cache already held.
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Time spent on prompts and on generating, in microseconds.
    pub prompt_us: AtomicU64,
    pub decode_us: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn record_done(&self, t: &wgemma::Timings) {
        Self::add(&self.finished, 1);
        Self::add(&self.prompt_tokens, t.prompt_tokens as u64);
        Self::add(&self.cached_tokens, t.cached_tokens as u64);
        Self::add(&self.generated_tokens, t.generated_tokens as u64);
        Self::add(&self.prompt_us, (t.prompt_ms * 1e3) as u64);
        Self::add(&self.decode_us, (t.decode_ms * 1e3) as u64);
    }
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

    /// Queues `job`; refused when `queue` requests already wait.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        *lock(&self.last_used) = Instant::now();
        self.pending.fetch_add(1, Ordering::Relaxed);
        let queued = Queued {
            job,
            _pending: Pending(self.pending.clone()),
        };
        match self.jobs.try_send(queued) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Full(_)) => Err(ApiError::busy(self.queue)),
            Err(mpsc::TrySendError::Disconnected(_)) => {
                Err(ApiError::internal("the model's sessions have stopped"))
            }
        }
    }

    /// Requests queued or running now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    fn idle_for(&self) -> Duration {
        lock(&self.last_used).elapsed()
    }
}

/// Counts a request as pending until it is dropped (its session is done with it).
struct Pending(Arc<AtomicUsize>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
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
}

impl Registry {
    pub fn new(configured: Vec<ServedModel>, settings: ModelSettings) -> Self {
        Self {
            configured,
            settings,
            slots: Mutex::new(HashMap::new()),
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
        let mut guard = slot.lock().await;
        if let Some(loaded) = guard.as_ref() {
            return Ok(loaded.clone());
        }
        let settings = self.settings.clone();
        let loaded = tokio::task::spawn_blocking(move || load(served, &settings))
            .await
            .map_err(|e| ApiError::internal(format!("loading stopped: {e}")))??;
        let loaded = Arc::new(loaded);
        *guard = Some(loaded.clone());
        Ok(loaded)
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
        let slots: Vec<_> = lock(&self.slots).values().cloned().collect();
        slots
            .iter()
            .filter_map(|s| s.try_lock().ok().and_then(|g| g.clone()))
            .collect()
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
    let model = pollster::block_on(Model::load_file(&source.model, opts))
        .map_err(|e| ApiError::internal(format!("loading {}: {e}", source.model.display())))?;
    let info = model.info();
    let hints = source.sampling_hints().or(info.sampling.clone());
    let context = settings.context.min(model.config().context_length).max(1);
    let (jobs, rx) = mpsc::sync_channel(settings.queue);
    let rx = Arc::new(Mutex::new(rx));
    let counters = Arc::new(Counters::default());
    for i in 0..settings.parallel.max(1) {
        let session = model
            .session(SessionOptions {
                context,
                ..SessionOptions::default()
            })
            .map_err(|e| ApiError::runtime(&e))?;
        let (rx, counters) = (rx.clone(), counters.clone());
        std::thread::Builder::new()
            .name(format!("wgemma-session-{i}"))
            .spawn(move || serve_jobs(session, &rx, &counters))
            .map_err(|e| ApiError::internal(format!("starting a session thread: {e}")))?;
    }
    tracing::info!(model = %served.name, context, parallel = settings.parallel, "loaded");
    Ok(Loaded {
        name: served.name,
        model,
        hints,
        context,
        jobs,
        pending: Arc::new(AtomicUsize::new(0)),
        queue: settings.queue,
        last_used: Mutex::new(Instant::now()),
        keep_alive: Mutex::new(settings.idle_unload),
        counters,
    })
}

/// A session thread: takes jobs until the model is unloaded (its queue's sender dropped).
fn serve_jobs(
    mut session: wgemma::Session,
    jobs: &Mutex<mpsc::Receiver<Queued>>,
    counters: &Counters,
) {
    loop {
        let queued = lock(jobs).recv();
        let Ok(queued) = queued else { return };
        pollster::block_on(run_job(&mut session, queued.job, counters));
    }
}

async fn run_job(session: &mut wgemma::Session, job: Job, counters: &Counters) {
    let stream = session.generate(job.request);
    futures::pin_mut!(stream);
    let mut tokens = 0u64;
    while let Some(event) = stream.next().await {
        match &event {
            Ok(Event::Token { .. }) => tokens += 1,
            Ok(Event::Done { timings, .. }) => counters.record_done(timings),
            Err(_) => Counters::add(&counters.failed, 1),
        }
        let last = !matches!(event, Ok(Event::Token { .. }));
        if job.events.send(event).await.is_err() {
            // The client went away: dropping the stream ends the generation here.
            Counters::add(&counters.cancelled, 1);
            Counters::add(&counters.generated_tokens, tokens);
            return;
        }
        if last {
            return;
        }
    }
}
