//! The block loop: the prompt into the cache, then blocks of `canvas_length` tokens, each
//! denoised step by step until the sampler's stop rule or its last step; a block's text is its
//! last argmax canvas, cut at the first end-of-generation token, and (unless generation ends
//! there) read into the cache by the encoder before the next block.

use std::ops::ControlFlow;

use crate::config::EntropyBound;
use crate::gpu::DiffusionError;
use crate::sampler::SamplerRng;
use crate::session::{DiffusionSession, StepOutcome};

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
#[derive(Debug)]
pub enum DiffusionEvent<'a> {
    /// A denoising step of block `block` (from 0): `outcome.argmax` is the current draft.
    Step {
        block: usize,
        step: u32,
        outcome: &'a StepOutcome,
    },
    /// A finished block's tokens, as kept (cut at a stop token and at the token limit).
    Block {
        block: usize,
        tokens: &'a [u32],
        steps: u32,
    },
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

/// Runs the block loop after `prompt` (read into `session`'s cache first), drawing the
/// sampler's randomness from `rng` and telling `on_event` of every step and block (it may
/// stop the loop: [`Finish::Cancelled`]).
pub async fn generate(
    session: &mut DiffusionSession,
    prompt: &[u32],
    req: &DiffusionRequest,
    rng: &mut dyn SamplerRng,
    on_event: &mut dyn FnMut(DiffusionEvent<'_>) -> ControlFlow<()>,
) -> Result<Generated, DiffusionError> {
    req.sampler.check().map_err(DiffusionError::Input)?;
    let rows = session.model().cfg.canvas_length;
    let vocab = session.model().cfg.text.n_vocab as u32;
    let need = prompt.len() + req.max_new_tokens.div_ceil(rows) * rows;
    if need > session.capacity() || prompt.is_empty() {
        return Err(DiffusionError::Input(format!(
            "a prompt of {} tokens and {} new ones in blocks of {rows} need {need} positions; \
             the session holds {}",
            prompt.len(),
            req.max_new_tokens,
            session.capacity()
        )));
    }
    session.encode(prompt).await?;
    let mut out = Generated {
        tokens: Vec::new(),
        blocks: 0,
        steps: 0,
        finish: Finish::Length,
    };
    let mut canvas = vec![0u32; rows];
    while out.tokens.len() < req.max_new_tokens {
        let block = out.blocks;
        rng.canvas(&mut canvas, vocab)?;
        session.start_block(&canvas)?;
        let mut last = None;
        for step in 0..req.sampler.max_steps {
            let outcome = session.step(step, &req.sampler, rng).await?;
            out.steps += 1;
            let event = DiffusionEvent::Step {
                block,
                step,
                outcome: &outcome,
            };
            if on_event(event).is_break() {
                out.finish = Finish::Cancelled;
                return Ok(out);
            }
            let done = outcome.done;
            last = Some(outcome);
            if done {
                break;
            }
        }
        let text = last.map(|o| o.argmax).unwrap_or_default();
        let cut = text
            .iter()
            .position(|t| req.stop_tokens.contains(t))
            .unwrap_or(text.len())
            .min(req.max_new_tokens - out.tokens.len());
        let stopped = cut < text.len() && req.stop_tokens.contains(&text[cut]);
        out.blocks += 1;
        let event = DiffusionEvent::Block {
            block,
            tokens: &text[..cut],
            steps: out.steps,
        };
        let cancelled = on_event(event).is_break();
        out.tokens.extend_from_slice(&text[..cut]);
        if stopped || cancelled {
            out.finish = if stopped {
                Finish::Stop
            } else {
                Finish::Cancelled
            };
            break;
        }
        if out.tokens.len() < req.max_new_tokens {
            session.encode(&text).await?;
        }
    }
    Ok(out)
}
