//! A model's sessions and which of them takes which request. The sessions are the slots of
//! one [`wgemma::Batch`], driven by a thread of their own: generations under way share each
//! decode step (continuous batching), each slot's KV cache is kept between requests. A request
//! goes to the idle slot whose cache holds the start of its prompt (the conversation it
//! continues), else the one idle longest; when none is idle it waits in a bounded queue that
//! slots take from in order as they finish.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use tokio::sync::mpsc as tmpsc;
use tokio::sync::mpsc::error::TrySendError;
use wgemma::{Batch, Event, GenerateRequest, Model, SessionOptions};

use crate::diffusion::DiffusionJobs;
use crate::error::ApiError;
use crate::models::LoadedModel;

/// One generation: the request, and where its events go. A closed channel (the client went
/// away) stops the generation at its next step.
pub struct Job {
    pub request: GenerateRequest,
    pub events: tmpsc::Sender<Result<Event, wgemma::Error>>,
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
    /// Of those, the ones a session's cache already held.
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Time spent on prompts and on generating, in microseconds.
    pub prompt_us: AtomicU64,
    pub decode_us: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn record_done(&self, t: &wgemma::Timings) {
        Self::add(&self.finished, 1);
        Self::add(&self.prompt_tokens, t.prompt_tokens as u64);
        Self::add(&self.cached_tokens, t.cached_tokens as u64);
        Self::add(&self.generated_tokens, t.generated_tokens as u64);
        Self::add(&self.prompt_us, (t.prompt_ms * 1e3) as u64);
        Self::add(&self.decode_us, (t.decode_ms * 1e3) as u64);
    }
}

/// A job on its way: counted as pending until its session is done with it.
pub(crate) struct Queued {
    pub(crate) job: Job,
    _pending: Pending,
}

pub(crate) struct Pending(Arc<AtomicUsize>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the scheduler knows of one slot.
struct Slot {
    /// The tokens its cache holds, as of its last job.
    cached: Vec<u32>,
    /// When it last finished a job.
    idle_since: Instant,
}

struct State {
    slots: Vec<Slot>,
    idle: Vec<usize>,
    waiting: VecDeque<Queued>,
    /// The engine's inbox: jobs given a slot.
    inbox: mpsc::Sender<(usize, Queued)>,
}

/// A model's sessions and their scheduler.
pub struct Sessions {
    state: Mutex<State>,
    queue: usize,
    pending: Arc<AtomicUsize>,
    pub counters: Counters,
}

impl Sessions {
    /// `parallel` sessions of `model` with `context` positions each, and the thread that
    /// runs their generations: a text model's steps batched across them, a diffusion
    /// model's requests one after another.
    pub fn start(
        model: &LoadedModel,
        parallel: usize,
        context: usize,
        queue: usize,
    ) -> Result<Arc<Self>, ApiError> {
        let (tx, rx) = mpsc::channel();
        match model {
            LoadedModel::Text(model) => {
                let opts = SessionOptions {
                    context,
                    ..SessionOptions::default()
                };
                let batch =
                    Batch::new(model, parallel.max(1), opts).map_err(|e| ApiError::runtime(&e))?;
                let this = Self::scheduler(batch.slots(), queue, tx);
                let engine = Engine::new(batch, model.clone(), opts);
                let me = Arc::downgrade(&this);
                spawn("wgemma-batch", move || engine.serve(&rx, &me))?;
                Ok(this)
            }
            LoadedModel::Diffusion(model) => {
                let jobs = DiffusionJobs::new(model, context)?;
                let this = Self::scheduler(parallel.max(1), queue, tx);
                let me = Arc::downgrade(&this);
                spawn("wgemma-diffusion", move || jobs.serve(&rx, &me))?;
                Ok(this)
            }
        }
    }

    /// The scheduler of `slots` slots, sending the jobs it gives them to `inbox`.
    fn scheduler(slots: usize, queue: usize, inbox: mpsc::Sender<(usize, Queued)>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                idle: (0..slots).collect(),
                slots: (0..slots)
                    .map(|_| Slot {
                        cached: Vec::new(),
                        idle_since: Instant::now(),
                    })
                    .collect(),
                waiting: VecDeque::new(),
                inbox,
            }),
            queue,
            pending: Arc::new(AtomicUsize::new(0)),
            counters: Counters::default(),
        })
    }

    /// Requests queued or running now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// When a slot last finished a job (or the sessions started).
    pub fn last_done(&self) -> Instant {
        let st = lock(&self.state);
        st.slots
            .iter()
            .map(|s| s.idle_since)
            .max()
            .unwrap_or_else(Instant::now)
    }

    /// Hands `job` (whose prompt is `tokens`) to a slot, or queues it; refused when `queue`
    /// requests already wait.
    pub fn submit(&self, job: Job, tokens: &[u32]) -> Result<(), ApiError> {
        let mut st = lock(&self.state);
        let queued = Queued {
            job,
            _pending: Pending(self.pending.clone()),
        };
        self.pending.fetch_add(1, Ordering::Relaxed);
        match choose(&st, tokens) {
            Some(pos) => {
                let i = st.idle.swap_remove(pos);
                st.inbox
                    .send((i, queued))
                    .map_err(|_| ApiError::internal("the generation thread has stopped"))
            }
            None if st.waiting.len() >= self.queue => Err(ApiError::busy(self.queue)),
            None => {
                st.waiting.push_back(queued);
                Ok(())
            }
        }
    }

    /// Slot `i` is done with its job, its cache now holding `cached`: the job waiting
    /// longest goes to it (through the inbox, which the generation thread reads next), or it
    /// goes idle.
    pub(crate) fn slot_done(&self, i: usize, cached: Vec<u32>) {
        let mut st = lock(&self.state);
        st.slots[i].cached = cached;
        st.slots[i].idle_since = Instant::now();
        match st.waiting.pop_front() {
            Some(next) => {
                let _ = st.inbox.send((i, next));
            }
            None => st.idle.push(i),
        }
    }
}

/// Starts a model's generation thread.
fn spawn(name: &str, run: impl FnOnce() + Send + 'static) -> Result<(), ApiError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(run)
        .map(drop)
        .map_err(|e| ApiError::internal(format!("starting the generation thread: {e}")))
}

/// The idle slot for a prompt of `tokens` (its position in `idle`): the one whose cache the
/// prompt continues (shares at least half of what it holds) with the longest shared start,
/// else the one idle longest, whose conversation is the least likely to come back.
fn choose(st: &State, tokens: &[u32]) -> Option<usize> {
    let shared = |i: usize| {
        let cached = &st.slots[i].cached;
        cached
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    };
    let continued = st
        .idle
        .iter()
        .enumerate()
        .filter(|&(_, &i)| {
            let n = shared(i);
            n > 0 && 2 * n >= st.slots[i].cached.len()
        })
        .max_by_key(|&(_, &i)| shared(i));
    continued
        .or_else(|| {
            st.idle
                .iter()
                .enumerate()
                .min_by_key(|&(_, &i)| st.slots[i].idle_since)
        })
        .map(|(pos, _)| pos)
}

/// A slot's job under way: its events not yet taken by the client.
struct Active {
    events: tmpsc::Sender<Result<Event, wgemma::Error>>,
    /// Counts the job as pending until it is over.
    _pending: Pending,
    backlog: VecDeque<Result<Event, wgemma::Error>>,
    /// Tokens delivered.
    tokens: u64,
    /// The client went away: the rest of the generation is dropped.
    gone: bool,
    /// The generation has given its last event.
    ended: bool,
}

/// The generation thread's state: the batch and each slot's job, and what the batch was
/// made from (to make it again after a panic).
struct Engine {
    batch: Batch,
    active: Vec<Option<Active>>,
    model: Model,
    opts: SessionOptions,
}

/// How long the thread waits before offering events again to clients that took none.
const BACKLOG_WAIT: Duration = Duration::from_millis(1);

impl Engine {
    fn new(batch: Batch, model: Model, opts: SessionOptions) -> Self {
        let active = (0..batch.slots()).map(|_| None).collect();
        Self {
            batch,
            active,
            model,
            opts,
        }
    }

    fn running(&self) -> bool {
        self.active.iter().any(Option::is_some)
    }

    /// Jobs from `inbox` and steps of the generations under way, until the model is
    /// unloaded.
    fn serve(
        mut self,
        inbox: &mpsc::Receiver<(usize, Queued)>,
        sessions: &std::sync::Weak<Sessions>,
    ) {
        loop {
            let next = if self.running() {
                inbox.try_recv().ok()
            } else {
                match inbox.recv() {
                    Ok(job) => Some(job),
                    Err(_) => return,
                }
            };
            let Some(owner) = sessions.upgrade() else {
                return;
            };
            let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.turn(next, &owner);
            }));
            if let Err(panic) = turn
                && !self.recover(panic.as_ref(), &owner)
            {
                return;
            }
        }
    }

    /// Starts `next`, or steps the generations under way and delivers their events.
    fn turn(&mut self, next: Option<(usize, Queued)>, owner: &Sessions) {
        if let Some((slot, queued)) = next {
            self.start(slot, queued, owner);
            return;
        }
        let waiting = |i: usize| {
            self.active[i]
                .as_ref()
                .is_some_and(|a| !a.backlog.is_empty())
        };
        let paused: Vec<bool> = (0..self.active.len()).map(waiting).collect();
        let events = pollster::block_on(self.batch.step(|i| paused[i]));
        // A step that only read a chunk of a prompt gave no events but was not idle.
        let idle = events.is_empty() && self.batch.reading_prompts() == 0;
        self.route(events);
        self.deliver(owner);
        if idle {
            std::thread::sleep(BACKLOG_WAIT);
        }
    }

    /// After a panic: the generations under way fail (their clients see their replies end
    /// with an error), the sessions are made anew, and the waiting jobs go on. False when the
    /// sessions cannot be made again (the model then refuses requests).
    fn recover(&mut self, panic: &(dyn std::any::Any + Send), owner: &Sessions) -> bool {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(
            panic = what,
            "a generation panicked: its model's sessions start over"
        );
        let failed = self.active.iter().filter(|a| a.is_some()).count();
        Counters::add(&owner.counters.failed, failed as u64);
        // Dropping the jobs closes their channels: each reply ends with an error.
        self.active.iter_mut().for_each(|a| *a = None);
        let slots = self.batch.slots();
        match Batch::new(&self.model, slots, self.opts) {
            Ok(batch) => self.batch = batch,
            Err(e) => {
                tracing::error!(error = %e, "the sessions could not be made again");
                return false;
            }
        }
        let idle = lock(&owner.state).idle.clone();
        for i in (0..slots).filter(|i| !idle.contains(i)) {
            self.free(i, owner);
        }
        true
    }

    /// Starts `queued` in `slot`.
    fn start(&mut self, slot: usize, queued: Queued, owner: &Sessions) {
        // A client that left while its request waited: nothing to run.
        if queued.job.events.is_closed() {
            Counters::add(&owner.counters.cancelled, 1);
            self.free(slot, owner);
            return;
        }
        let Queued {
            job: Job { request, events },
            _pending,
        } = queued;
        self.active[slot] = Some(Active {
            events,
            _pending,
            backlog: VecDeque::new(),
            tokens: 0,
            gone: false,
            ended: false,
        });
        // Fault injection for the tests of the recovery below (absent from real builds).
        #[cfg(test)]
        if request.stop.iter().any(|s| s == tests::PANIC_STOP) {
            panic!("a panic injected by a test");
        }
        match pollster::block_on(self.batch.start(slot, request)) {
            Ok(events) => self.route(events),
            Err(e) => self.route(vec![(slot, Err(e))]),
        }
        self.deliver(owner);
    }

    /// Slot `i` is free: the job waiting longest goes to it (through the inbox, which this
    /// thread reads next).
    fn free(&mut self, i: usize, owner: &Sessions) {
        self.active[i] = None;
        if let Some(h) = self.batch.cancel_handle(i) {
            h.withdraw();
        }
        owner.slot_done(i, self.batch.cached_tokens(i).to_vec());
    }

    /// Puts each event in its slot's backlog.
    fn route(&mut self, events: Vec<wgemma::SlotEvent>) {
        for (i, event) in events {
            let Some(a) = self.active.get_mut(i).and_then(Option::as_mut) else {
                continue;
            };
            a.ended |= !matches!(event, Ok(Event::Token { .. }));
            if !a.gone {
                a.backlog.push_back(event);
            }
        }
    }

    /// Offers each slot's backlog to its client; frees the slots whose jobs are over
    /// (delivered, or their client gone).
    fn deliver(&mut self, owner: &Sessions) {
        let c = &owner.counters;
        for i in 0..self.active.len() {
            let Some(a) = &mut self.active[i] else {
                continue;
            };
            while let Some(event) = a.backlog.pop_front() {
                let end = match &event {
                    Ok(Event::Token { .. } | Event::Draft { .. }) => None,
                    Ok(Event::Done { timings, .. }) => Some(Ok(*timings)),
                    Err(_) => Some(Err(())),
                };
                match a.events.try_send(event) {
                    Ok(()) => match end {
                        None => a.tokens += 1,
                        // Counted once delivered, so that a generation is finished, failed or
                        // cancelled.
                        Some(Ok(timings)) => c.record_done(&timings),
                        Some(Err(())) => Counters::add(&c.failed, 1),
                    },
                    Err(TrySendError::Full(event)) => {
                        a.backlog.push_front(event);
                        break;
                    }
                    Err(TrySendError::Closed(_)) => {
                        // The client went away: the generation stops at its next step.
                        a.gone = true;
                        a.backlog.clear();
                        Counters::add(&c.cancelled, 1);
                        Counters::add(&c.generated_tokens, a.tokens);
                        if let Some(h) = self.batch.cancel_handle(i) {
                            h.cancel();
                        }
                    }
                }
            }
            if a.ended && a.backlog.is_empty() {
                self.free(i, owner);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wgemma::{LoadOptions, Prompt};

    /// A stop string that makes the generation thread panic as it starts the request.
    pub(crate) const PANIC_STOP: &str = "\u{0}panic injected by a test";

    /// Sends a short greedy request with `stop`; its events.
    fn send(sessions: &Sessions, stop: &str) -> tmpsc::Receiver<Result<Event, wgemma::Error>> {
        let (tx, rx) = tmpsc::channel(64);
        let mut request = GenerateRequest::new(Prompt::Tokens(vec![2, 10, 20, 30]));
        request.max_tokens = 4;
        request.stop = vec![stop.to_string()];
        sessions
            .submit(
                Job {
                    request,
                    events: tx,
                },
                &[],
            )
            .unwrap();
        rx
    }

    /// Whether the events end with `Done`.
    fn finished(mut rx: tmpsc::Receiver<Result<Event, wgemma::Error>>) -> bool {
        while let Some(e) = rx.blocking_recv() {
            if matches!(e, Ok(Event::Done { .. })) {
                return true;
            }
        }
        false
    }

    /// A generation that panics fails alone: its reply ends without `Done` (the client sees
    /// an error), the sessions are made anew, and the requests after it are served.
    #[test]
    fn a_panicking_generation_fails_alone_and_the_sessions_go_on() {
        let fixture = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../gemma4-audio/tests/fixtures/gemma4_tiny_audio.gguf");
        let model = pollster::block_on(Model::load_file(&fixture, LoadOptions::default()))
            .expect("the tiny model loads");
        let sessions = Sessions::start(&LoadedModel::Text(model), 2, 256, 4).unwrap();
        assert!(finished(send(&sessions, "never")), "before");
        assert!(!finished(send(&sessions, PANIC_STOP)), "the panicking one");
        assert_eq!(sessions.counters.failed.load(Ordering::Relaxed), 1);
        for i in 0..3 {
            assert!(finished(send(&sessions, "never")), "after, {i}");
        }
        // Every job's count is given back once its slot is free (just after its end went out).
        let start = Instant::now();
        while sessions.pending() > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "jobs still pending"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
