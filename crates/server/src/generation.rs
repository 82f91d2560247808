//! One request's generation as both APIs consume it: queued on its model, its first event
//! awaited (so that a refused request gets an error status, not a broken stream), then read
//! as text pieces and an end.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use wgemma::{Event, StopReason, Timings, TokenLogprobs};

use crate::error::ApiError;
use crate::models::Loaded;
use crate::request::Ask;
use crate::sessions::Job;

/// Events a session may run ahead of its client: few, so that a client gone away is noticed
/// within a few steps (the send that finds the channel closed stops the generation).
const EVENT_BUFFER: usize = 8;

/// A generation under way.
pub struct Generation {
    pub model: Arc<Loaded>,
    events: mpsc::Receiver<Result<Event, wgemma::Error>>,
    /// The first event, read to see that the request was taken.
    first: Option<Event>,
    /// The end (or a failure) has been read.
    ended: bool,
    pub started: Instant,
    /// How long the model took to load for this request (Ollama's `load_duration`).
    pub load_ms: f64,
}

/// A whole reply.
pub struct Reply {
    pub text: String,
    pub reason: StopReason,
    pub timings: Timings,
    /// Each token's log-probabilities, where the request asked.
    pub logprobs: Vec<TokenLogprobs>,
}

/// What a generation yields to its response.
#[derive(Debug)]
pub enum Piece {
    /// A token's text (maybe empty, or more than its own: text held back until it could not
    /// start a stop string), with its log-probabilities where the request asked.
    Text {
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    Done {
        reason: StopReason,
        timings: Timings,
    },
    /// Failed after the first event (headers sent): ends the stream.
    Failed(ApiError),
}

impl Generation {
    /// Queues `ask` on `model` and waits for its first event.
    pub async fn start(
        model: Arc<Loaded>,
        ask: Ask,
        started: Instant,
        load_ms: f64,
    ) -> Result<Self, ApiError> {
        // Images and audio are decoded on a blocking thread, never on the async workers or
        // the thread that steps the model's generations.
        let request = if ask.has_media() {
            let m = model.clone();
            tokio::task::spawn_blocking(move || ask.into_request(&m))
                .await
                .map_err(|e| ApiError::internal(format!("decoding the media stopped: {e}")))??
        } else {
            ask.into_request(&model)?
        };
        let (tx, mut events) = mpsc::channel(EVENT_BUFFER);
        model.submit(Job {
            request,
            events: tx,
        })?;
        let first = match events.recv().await {
            Some(Ok(event)) => event,
            Some(Err(e)) => return Err(ApiError::runtime(&e)),
            None => return Err(ApiError::internal("the session ended without a reply")),
        };
        Ok(Self {
            model,
            events,
            first: Some(first),
            ended: false,
            started,
            load_ms,
        })
    }

    /// The next piece; `None` after the end.
    pub async fn next(&mut self) -> Option<Piece> {
        if self.ended {
            return None;
        }
        let event = loop {
            let event = match self.first.take() {
                Some(e) => Ok(e),
                None => match self.events.recv().await {
                    Some(e) => e,
                    // The session stopped without an end (it should not): say so rather than
                    // end the reply as if it were whole.
                    None => {
                        self.ended = true;
                        return Some(Piece::Failed(ApiError::internal(
                            "the session ended before the reply did",
                        )));
                    }
                },
            };
            // Drafts (text diffusion) are not part of either API's reply.
            if !matches!(event, Ok(Event::Draft { .. })) {
                break event;
            }
        };
        self.ended = !matches!(event, Ok(Event::Token { .. }));
        Some(match event {
            Ok(Event::Token { text, logprobs, .. }) => Piece::Text { text, logprobs },
            Ok(Event::Draft { .. }) => {
                return self.ended.then_some(Piece::Failed(ApiError::internal(
                    "a draft where none is read",
                )));
            }
            Ok(Event::Done { reason, timings }) => {
                log_done(&self.model.name, reason, &timings);
                Piece::Done { reason, timings }
            }
            Err(e) => Piece::Failed(ApiError::runtime(&e)),
        })
    }

    /// The whole reply and its end.
    pub async fn collect(mut self) -> Result<Reply, ApiError> {
        let (mut text, mut logprobs) = (String::new(), Vec::new());
        while let Some(piece) = self.next().await {
            match piece {
                Piece::Text {
                    text: t,
                    logprobs: l,
                } => {
                    text.push_str(&t);
                    logprobs.extend(l);
                }
                Piece::Done { reason, timings } => {
                    return Ok(Reply {
                        text,
                        reason,
                        timings,
                        logprobs,
                    });
                }
                Piece::Failed(e) => return Err(e),
            }
        }
        Err(ApiError::internal(
            "the session ended without finishing the reply",
        ))
    }
}

fn log_done(model: &str, reason: StopReason, t: &Timings) {
    tracing::info!(
        model,
        ?reason,
        prompt_tokens = t.prompt_tokens,
        cached_tokens = t.cached_tokens,
        generated_tokens = t.generated_tokens,
        prompt_tok_s = format!("{:.1}", t.prompt_tok_per_s()),
        decode_tok_s = format!("{:.1}", t.decode_tok_per_s()),
        "request done"
    );
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::MaxTokens | StopReason::ContextFull => "length",
        StopReason::EndOfGeneration
        | StopReason::StopString
        | StopReason::Loop
        | StopReason::Cancelled => "stop",
    }
}
