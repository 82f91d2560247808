//! A model's sessions, each on a thread of its own with its KV cache kept between requests,
//! and which of them takes which request: the idle session whose cache holds the start of the
//! request's prompt (the conversation it continues), else the one idle longest; when none is
//! idle the request waits in a bounded queue that sessions take from in order as they finish.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use futures::StreamExt;
use tokio::sync::mpsc as tmpsc;
use wgemma::{Event, GenerateRequest, Model, SessionOptions};

use crate::error::ApiError;

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

/// A job on its way: counted as pending until its session is done with it.
struct Queued {
    job: Job,
    _pending: Pending,
}

struct Pending(Arc<AtomicUsize>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the scheduler knows of one session.
struct Slot {
    /// The session thread's inbox (one job at a time: it is sent only to an idle session).
    inbox: mpsc::Sender<Queued>,
    /// The tokens its cache holds, as of its last job.
    cached: Vec<u32>,
    /// When it last finished a job.
    idle_since: Instant,
}

struct State {
    slots: Vec<Slot>,
    idle: Vec<usize>,
    waiting: VecDeque<Queued>,
}

/// A model's sessions and their scheduler.
pub struct Sessions {
    state: Mutex<State>,
    queue: usize,
    pending: Arc<AtomicUsize>,
    pub counters: Counters,
}

impl Sessions {
    /// `parallel` sessions of `model` with `context` positions each, their threads started.
    pub fn start(
        model: &Model,
        parallel: usize,
        context: usize,
        queue: usize,
    ) -> Result<Arc<Self>, ApiError> {
        let mut sessions = Vec::with_capacity(parallel);
        let mut slots = Vec::with_capacity(parallel);
        for _ in 0..parallel.max(1) {
            let opts = SessionOptions {
                context,
                ..SessionOptions::default()
            };
            sessions.push(model.session(opts).map_err(|e| ApiError::runtime(&e))?);
        }
        let mut inboxes = Vec::with_capacity(parallel);
        for _ in &sessions {
            let (tx, rx) = mpsc::channel();
            slots.push(Slot {
                inbox: tx,
                cached: Vec::new(),
                idle_since: Instant::now(),
            });
            inboxes.push(rx);
        }
        let this = Arc::new(Self {
            state: Mutex::new(State {
                idle: (0..slots.len()).collect(),
                slots,
                waiting: VecDeque::new(),
            }),
            queue,
            pending: Arc::new(AtomicUsize::new(0)),
            counters: Counters::default(),
        });
        for (i, (session, inbox)) in sessions.into_iter().zip(inboxes).enumerate() {
            // The thread holds the scheduler weakly: dropping the model's last handle drops
            // the inboxes' senders, and each thread ends at its next wait.
            let me = Arc::downgrade(&this);
            std::thread::Builder::new()
                .name(format!("wgemma-session-{i}"))
                .spawn(move || serve(session, i, &inbox, &me))
                .map_err(|e| ApiError::internal(format!("starting a session thread: {e}")))?;
        }
        Ok(this)
    }

    /// Requests queued or running now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Hands `job` (whose prompt is `tokens`) to a session, or queues it; refused when
    /// `queue` requests already wait.
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
                st.slots[i]
                    .inbox
                    .send(queued)
                    .map_err(|_| ApiError::internal("a session has stopped"))
            }
            None if st.waiting.len() >= self.queue => Err(ApiError::busy(self.queue)),
            None => {
                st.waiting.push_back(queued);
                Ok(())
            }
        }
    }

    /// Session `i` is done with its job, its cache now holding `cached`: its next job from
    /// the queue, or it goes idle.
    fn finished(&self, i: usize, cached: Vec<u32>) -> Option<Queued> {
        let mut st = lock(&self.state);
        st.slots[i].cached = cached;
        st.slots[i].idle_since = Instant::now();
        let next = st.waiting.pop_front();
        if next.is_none() {
            st.idle.push(i);
        }
        next
    }
}

/// The idle session for a prompt of `tokens` (its position in `idle`): the one whose cache
/// the prompt continues (shares at least half of what it holds) with the longest shared
/// start, else the one idle longest, whose conversation is the least likely to come back.
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

/// A session thread: its jobs one after another, until the model is unloaded.
fn serve(
    mut session: wgemma::Session,
    i: usize,
    inbox: &mpsc::Receiver<Queued>,
    sessions: &std::sync::Weak<Sessions>,
) {
    let mut next = inbox.recv().ok();
    while let Some(queued) = next.take() {
        let Some(owner) = sessions.upgrade() else {
            return;
        };
        pollster::block_on(run(&mut session, queued.job, &owner.counters));
        drop(queued._pending);
        next = owner.finished(i, session.cached_tokens().to_vec());
        drop(owner);
        if next.is_none() {
            next = inbox.recv().ok();
        }
    }
}

async fn run(session: &mut wgemma::Session, job: Job, counters: &Counters) {
    // A client that left while its request waited: nothing to run.
    if job.events.is_closed() {
        Counters::add(&counters.cancelled, 1);
        return;
    }
    let stream = session.generate(job.request);
    futures::pin_mut!(stream);
    let mut tokens = 0u64;
    while let Some(event) = stream.next().await {
        let end = match &event {
            Ok(Event::Token { .. }) => None,
            Ok(Event::Done { timings, .. }) => Some(Ok(*timings)),
            Err(_) => Some(Err(())),
        };
        if job.events.send(event).await.is_err() {
            // The client went away: dropping the stream ends the generation here.
            Counters::add(&counters.cancelled, 1);
            Counters::add(&counters.generated_tokens, tokens);
            return;
        }
        // Counted once delivered, so that a generation is finished, failed or cancelled.
        match end {
            None => tokens += 1,
            Some(Ok(timings)) => return counters.record_done(&timings),
            Some(Err(())) => return Counters::add(&counters.failed, 1),
        }
    }
}
