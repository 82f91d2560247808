//! The block loop: the prompt into the cache, then blocks of `canvas_length` tokens, each
//! denoised step by step until the sampler's stop rule or its last step; a block's text is its
//! last argmax canvas, cut at the first end-of-generation token, and (unless generation ends
//! there) read into the cache by the encoder before the next block. [`BlockLoop`] runs it a
//! step at a time (for a stream); [`generate`] runs it whole with a callback.

use std::ops::ControlFlow;

use crate::config::EntropyBound;
use crate::gpu::DiffusionError;
use crate::sampler::SamplerRng;
use crate::session::{DiffusionSession, StepOutcome};
use wgemma_text::SoftTokens;

/// What to generate.
#[derive(Clone, Debug)]
pub struct DiffusionRequest {
    /// Tokens to generate at most (whole blocks are denoised; the last is cut to this).
    pub max_new_tokens: usize,
    pub sampler: EntropyBound,
    /// Tokens that end the generation (the tokenizer's end-of-generation tokens).
    pub stop_tokens: Vec<u32>,
}

/// What the loop reports as it goes.
#[derive(Clone, Debug, PartialEq)]
pub enum DiffusionEvent {
    /// The prompt is in the cache.
    Encoded { tokens: usize },
    /// A denoising step of block `block` (from 0): `outcome.argmax` is the current draft.
    Step {
        block: usize,
        step: u32,
        outcome: StepOutcome,
    },
    /// A finished block's tokens, as kept (cut at a stop token and at the token limit), after
    /// `steps` denoising steps.
    Block {
        block: usize,
        tokens: Vec<u32>,
        steps: u32,
    },
    /// The end.
    Done(Generated),
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token.
    Stop,
    /// The token limit.
    Length,
    /// The caller stopped it.
    Cancelled,
}

/// A finished generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub blocks: usize,
    /// Denoising steps over all blocks.
    pub steps: u32,
    pub finish: Finish,
}

/// Where the loop stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Prompt,
    /// The next step of the current block.
    Denoise {
        step: u32,
    },
    /// The current block is done: its text is next.
    Commit,
    Finished,
}

/// The block loop, one event per call of [`BlockLoop::next`].
pub struct BlockLoop {
    req: DiffusionRequest,
    prompt: Vec<u32>,
    /// Soft tokens over some of the prompt's (its images').
    soft: Vec<SoftTokens>,
    phase: Phase,
    block: usize,
    block_steps: u32,
    last: Option<StepOutcome>,
    out: Generated,
}

impl BlockLoop {
    /// A loop for `prompt` in `session`, checked against its room.
    pub fn new(
        session: &DiffusionSession,
        prompt: Vec<u32>,
        req: DiffusionRequest,
    ) -> Result<Self, DiffusionError> {
        req.sampler.check().map_err(DiffusionError::Input)?;
        let rows = session.canvas_rows();
        let need = session.position() + prompt.len() + req.max_new_tokens.div_ceil(rows) * rows;
        if prompt.is_empty() || need > session.capacity() {
            return Err(DiffusionError::ContextOverflow {
                need,
                capacity: session.capacity(),
            });
        }
        Ok(Self {
            req,
            prompt,
            soft: Vec::new(),
            phase: Phase::Prompt,
            block: 0,
            block_steps: 0,
            last: None,
            out: Generated {
                tokens: Vec::new(),
                blocks: 0,
                steps: 0,
                finish: Finish::Length,
            },
        })
    }

    /// The loop with `soft` tokens (images' rows from their tower) over the prompt's
    /// placeholders, which the prompt's encode reads in their place.
    pub fn with_soft(mut self, soft: Vec<SoftTokens>) -> Self {
        self.soft = soft;
        self
    }

    /// Stops the loop: the next event is the end, with what the finished blocks kept.
    pub fn cancel(&mut self) {
        if self.phase != Phase::Finished {
            self.out.finish = Finish::Cancelled;
            self.phase = Phase::Commit;
            self.last = None;
        }
    }

    /// The next event, or `None` after [`DiffusionEvent::Done`].
    pub async fn next(
        &mut self,
        session: &mut DiffusionSession,
        rng: &mut dyn SamplerRng,
    ) -> Result<Option<DiffusionEvent>, DiffusionError> {
        match self.phase {
            Phase::Finished => Ok(None),
            Phase::Prompt => {
                session.encode_with(&self.prompt, &self.soft).await?;
                self.soft.clear();
                self.start_block(session, rng)?;
                Ok(Some(DiffusionEvent::Encoded {
                    tokens: self.prompt.len(),
                }))
            }
            Phase::Denoise { step } => {
                let outcome = session.step(step, &self.req.sampler, rng).await?;
                self.out.steps += 1;
                self.block_steps += 1;
                let last_step = step + 1 >= self.req.sampler.max_steps;
                self.phase = if outcome.done || last_step {
                    Phase::Commit
                } else {
                    Phase::Denoise { step: step + 1 }
                };
                self.last = Some(outcome.clone());
                Ok(Some(DiffusionEvent::Step {
                    block: self.block,
                    step,
                    outcome,
                }))
            }
            Phase::Commit => self.commit(session, rng).await.map(Some),
        }
    }

    fn start_block(
        &mut self,
        session: &mut DiffusionSession,
        rng: &mut dyn SamplerRng,
    ) -> Result<(), DiffusionError> {
        let mut canvas = vec![0u32; session.canvas_rows()];
        let vocab = session.model().cfg.text.n_vocab as u32;
        rng.canvas(&mut canvas, vocab)?;
        session.start_block(&canvas)?;
        self.phase = Phase::Denoise { step: 0 };
        self.block_steps = 0;
        Ok(())
    }

    /// The finished block's text: kept, and read into the cache when another block follows;
    /// or the end.
    async fn commit(
        &mut self,
        session: &mut DiffusionSession,
        rng: &mut dyn SamplerRng,
    ) -> Result<DiffusionEvent, DiffusionError> {
        let Some(last) = self.last.take() else {
            self.phase = Phase::Finished;
            return Ok(DiffusionEvent::Done(self.out.clone()));
        };
        let text = last.argmax;
        let room = self.req.max_new_tokens - self.out.tokens.len();
        let stop = text.iter().position(|t| self.req.stop_tokens.contains(t));
        let cut = stop.unwrap_or(text.len()).min(room);
        let kept = text[..cut].to_vec();
        self.out.tokens.extend_from_slice(&kept);
        self.out.blocks += 1;
        let event = DiffusionEvent::Block {
            block: self.block,
            tokens: kept,
            steps: self.block_steps,
        };
        if stop.is_some_and(|s| s <= room) {
            self.out.finish = Finish::Stop;
        } else if self.out.tokens.len() < self.req.max_new_tokens {
            session.encode(&text).await?;
            self.block += 1;
            self.start_block(session, rng)?;
            return Ok(event);
        }
        // Commit again with nothing left: the end.
        self.phase = Phase::Commit;
        Ok(event)
    }
}

/// Runs the whole loop after `prompt`, drawing the sampler's randomness from `rng` and telling
/// `on_event` of every event (it may stop the loop: [`Finish::Cancelled`]).
pub async fn generate(
    session: &mut DiffusionSession,
    prompt: &[u32],
    req: &DiffusionRequest,
    rng: &mut dyn SamplerRng,
    on_event: &mut dyn FnMut(&DiffusionEvent) -> ControlFlow<()>,
) -> Result<Generated, DiffusionError> {
    let mut run = BlockLoop::new(session, prompt.to_vec(), req.clone())?;
    while let Some(event) = run.next(session, rng).await? {
        if let DiffusionEvent::Done(out) = event {
            return Ok(out);
        }
        if on_event(&event).is_break() {
            run.cancel();
        }
    }
    Err(DiffusionError::Input(
        "the loop ended without its result".into(),
    ))
}
