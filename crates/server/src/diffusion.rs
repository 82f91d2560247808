//! A text diffusion model's requests (DiffusionGemma): taken one at a time by the model's
//! thread, each in a fresh cache, its finished blocks streamed as tokens (the drafts between
//! them are not part of either API's reply). Its steps denoise a whole canvas, so requests
//! share no step; the scheduler's slots and queue still bound how many wait.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc as tmpsc;
use tokio::sync::mpsc::error::TrySendError;
use wgemma::{DiffusionChat, DiffusionGenerate, DiffusionModel, Event, GenerateRequest};

use crate::error::ApiError;
use crate::sessions::{Counters, Job, Queued, Sessions};

/// How long a client may leave its events untaken before it counts as gone.
const CLIENT_PATIENCE: Duration = Duration::from_secs(60);

/// The model's one session and what it has run.
pub(crate) struct DiffusionJobs {
    chat: DiffusionChat,
}

impl DiffusionJobs {
    /// A session of `context` positions (prompt and reply).
    pub(crate) fn new(model: &DiffusionModel, context: usize) -> Result<Self, ApiError> {
        let chat = model
            .session(context, None)
            .map_err(|e| ApiError::runtime(&e))?;
        Ok(Self { chat })
    }

    /// Runs the jobs `inbox` brings, one after another, until the model is unloaded.
    pub(crate) fn serve(
        mut self,
        inbox: &mpsc::Receiver<(usize, Queued)>,
        sessions: &std::sync::Weak<Sessions>,
    ) {
        while let Ok((slot, queued)) = inbox.recv() {
            let Some(owner) = sessions.upgrade() else {
                return;
            };
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run(queued, &owner.counters);
            }));
            if run.is_err() {
                // The job's channel closed with it: its reply ends with an error.
                tracing::error!("a text diffusion generation panicked");
                Counters::add(&owner.counters.failed, 1);
            }
            owner.slot_done(slot, Vec::new());
        }
    }

    /// Runs `queued` to its end, or until its client goes away.
    fn run(&mut self, queued: Queued, counters: &Counters) {
        let Queued {
            job: Job { request, events },
            ..
        } = queued;
        if events.is_closed() {
            Counters::add(&counters.cancelled, 1);
            return;
        }
        let req = match diffusion_request(request) {
            Ok(r) => r,
            Err(e) => {
                let _ = events.blocking_send(Err(e));
                Counters::add(&counters.failed, 1);
                return;
            }
        };
        let cancel = self.chat.cancel_handle();
        let mut stream = Box::pin(self.chat.generate(req));
        let (mut tokens, mut gone) = (0u64, false);
        while let Some(event) = pollster::block_on(stream.next()) {
            if gone {
                // Cancelled: the stream ends at its next step.
                continue;
            }
            let end = match &event {
                Ok(Event::Done { timings, .. }) => Some(Ok(*timings)),
                Err(_) => Some(Err(())),
                Ok(Event::Token { .. }) => {
                    tokens += 1;
                    None
                }
                Ok(Event::Draft { .. }) => None,
            };
            if !send(&events, event) {
                gone = true;
                cancel.cancel();
                Counters::add(&counters.cancelled, 1);
                Counters::add(&counters.generated_tokens, tokens);
                continue;
            }
            match end {
                Some(Ok(t)) => counters.record_done(&t),
                Some(Err(())) => Counters::add(&counters.failed, 1),
                None => {}
            }
        }
    }
}

/// Hands `event` to the client, waiting while its channel is full; false when the client
/// has gone away or took nothing for [`CLIENT_PATIENCE`].
fn send(
    events: &tmpsc::Sender<Result<Event, wgemma::Error>>,
    mut event: Result<Event, wgemma::Error>,
) -> bool {
    let since = Instant::now();
    loop {
        match events.try_send(event) {
            Ok(()) => return true,
            Err(TrySendError::Closed(_)) => return false,
            Err(TrySendError::Full(e)) if since.elapsed() < CLIENT_PATIENCE => {
                event = e;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(TrySendError::Full(_)) => return false,
        }
    }
}

/// The diffusion model's request for a server's: its prompt, images, length and seed. What a
/// text diffusion model cannot do is refused (audio, stop strings, log-probabilities);
/// sampling settings other than the seed belong to the entropy-bound sampler, which takes
/// the model's own.
fn diffusion_request(r: GenerateRequest) -> Result<DiffusionGenerate, wgemma::Error> {
    let refuse = |what: &str| {
        Err(wgemma::Error::Request(format!(
            "{what}: not for a text diffusion (DiffusionGemma) model"
        )))
    };
    if !r.audio.is_empty() {
        return refuse("audio");
    }
    if !r.stop.is_empty() {
        return refuse("stop strings");
    }
    if r.logprobs.is_some() {
        return refuse("log-probabilities");
    }
    Ok(DiffusionGenerate {
        max_tokens: r.max_tokens,
        parse_special: r.parse_special,
        images: r.images,
        ..DiffusionGenerate::new(r.prompt, r.sampling.seed)
    })
}
