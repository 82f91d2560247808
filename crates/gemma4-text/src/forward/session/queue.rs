//! The decode pipeline's state, as two types with explicit states: what the CPU knows of the
//! tokens in the cache and of the newest sampled token ([`Ledger`]), and the steps queued on
//! the GPU whose sampled tokens are on their way back ([`StepQueue`]).

use std::collections::VecDeque;

use wgemma_kernels::{GpuContext, GpuError, Recorder, View, WaitMode, wgpu};

/// Where the newest sampled token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sampled {
    /// None waits to be fed: the next step starts from tokens the caller gives.
    None,
    /// On the GPU (the session's `result`), not read back yet: a decode step can feed it.
    OnGpu,
    /// Read back, and still on the GPU: the next decode step feeds it.
    Known(u32),
}

/// The tokens in the cache as the CPU knows them.
pub(super) struct Ledger {
    /// Tokens of the cache positions whose token the CPU knows, in order.
    history: Vec<u32>,
    /// Positions fed with sampled tokens not read back yet (the last ones).
    fed_unknown: usize,
    sampled: Sampled,
}

impl Ledger {
    pub(super) fn new() -> Self {
        Self {
            history: Vec::new(),
            fed_unknown: 0,
            sampled: Sampled::None,
        }
    }

    /// Positions in the cache.
    pub(super) fn position(&self) -> usize {
        self.history.len() + self.fed_unknown
    }

    /// The known tokens, in order.
    pub(super) fn tokens(&self) -> &[u32] {
        &self.history
    }

    pub(super) fn sampled(&self) -> Sampled {
        self.sampled
    }

    /// Tokens the caller feeds: a sampled token never fed is dropped.
    pub(super) fn feed(&mut self, tokens: &[u32]) {
        self.sampled = Sampled::None;
        self.history.extend_from_slice(tokens);
    }

    /// A step was queued that samples the next token.
    pub(super) fn sampling(&mut self) {
        self.sampled = Sampled::OnGpu;
    }

    /// A decode step feeds the newest sampled token, known or not, and samples the next.
    pub(super) fn feed_sampled(&mut self) {
        match self.sampled {
            Sampled::Known(t) => self.history.push(t),
            Sampled::OnGpu | Sampled::None => self.fed_unknown += 1,
        }
        self.sampled = Sampled::OnGpu;
    }

    /// The oldest queued step's token was read back: fed already (by a step queued after
    /// it), or the newest sampled token.
    pub(super) fn read_back(&mut self, token: u32) {
        if self.fed_unknown > 0 {
            self.history.push(token);
            self.fed_unknown -= 1;
        } else {
            self.sampled = Sampled::Known(token);
        }
    }

    /// The step recorded to feed `token` (just read back) will not run.
    pub(super) fn unfeed(&mut self, token: u32) {
        self.history.pop();
        self.sampled = Sampled::Known(token);
    }

    /// The step recorded to feed the newest token in the history will not run.
    pub(super) fn unfeed_last(&mut self) {
        if let Some(&token) = self.history.last() {
            self.unfeed(token);
        }
    }

    /// Forgets positions from `pos` on, and any sampled token.
    pub(super) fn rewind(&mut self, pos: usize) {
        self.history.truncate(pos);
        self.fed_unknown = 0;
        self.sampled = Sampled::None;
    }
}

/// A recorded step of a per-layer-embedding model that waits for its input token (still being
/// sampled by the step before it) to stage that token's table row, then is submitted.
struct Waiting {
    slot: usize,
    commands: wgpu::CommandBuffer,
}

/// A step whose sampled token is on its way back.
struct InFlight {
    slot: usize,
    submission: wgpu::SubmissionIndex,
    mapped: futures::channel::oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>,
}

/// Steps that may be queued before the oldest token must be read back.
pub const MAX_IN_FLIGHT: usize = 4;

/// The steps queued on the GPU: submitted ones, whose tokens come back through a ring of
/// mappable buffers in order, and at most one recorded step waiting for its input token.
pub(super) struct StepQueue {
    ring: Vec<wgpu::Buffer>,
    next: usize,
    in_flight: VecDeque<InFlight>,
    waiting: Option<Waiting>,
}

impl StepQueue {
    /// A queue of steps that each sample one token.
    pub(super) fn new(ctx: &GpuContext) -> Self {
        Self::of_rows(ctx, 1)
    }

    /// A queue of steps that each sample up to `rows` tokens (a batched step's rows).
    pub(super) fn of_rows(ctx: &GpuContext, rows: usize) -> Self {
        let ring = (0..MAX_IN_FLIGHT)
            .map(|_| ctx.readback_buffer("token readback", 8 * rows.max(1) as u64))
            .collect();
        Self {
            ring,
            next: 0,
            in_flight: VecDeque::new(),
            waiting: None,
        }
    }

    /// Steps queued whose tokens are not read back yet, the waiting one included.
    pub(super) fn len(&self) -> usize {
        self.in_flight.len() + usize::from(self.waiting.is_some())
    }

    /// Steps submitted whose tokens are not read back yet.
    pub(super) fn submitted(&self) -> usize {
        self.in_flight.len()
    }

    pub(super) fn has_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Copies the step's token (`result`, two words) to the next ring buffer and ends the
    /// recording.
    pub(super) fn finish(
        &mut self,
        mut rec: Recorder<'_>,
        result: &View,
    ) -> Result<(usize, wgpu::CommandBuffer), GpuError> {
        let (slot, ring) = self.reserve();
        rec.copy(&result.slice(0, 8)?, &ring, 8);
        Ok((slot, rec.finish()))
    }

    /// The next ring buffer, for a step to copy its rows' tokens into (two words a row), and
    /// its slot to [`StepQueue::launch`] the step with.
    pub(super) fn reserve(&mut self) -> (usize, View) {
        let slot = self.next;
        self.next = (slot + 1) % MAX_IN_FLIGHT;
        (slot, View::of(&self.ring[slot]))
    }

    /// Submits a finished step and starts mapping its token.
    pub(super) fn launch(&mut self, ctx: &GpuContext, slot: usize, commands: wgpu::CommandBuffer) {
        let submission = ctx.submit([commands]);
        let (tx, rx) = futures::channel::oneshot::channel();
        self.ring[slot]
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        self.in_flight.push_back(InFlight {
            slot,
            submission,
            mapped: rx,
        });
    }

    /// Holds a finished step until its input token is known ([`StepQueue::release`]).
    pub(super) fn hold(&mut self, slot: usize, commands: wgpu::CommandBuffer) {
        self.waiting = Some(Waiting { slot, commands });
    }

    /// Submits the waiting step, if any; returns whether there was one.
    pub(super) fn release(&mut self, ctx: &GpuContext) -> bool {
        match self.waiting.take() {
            Some(w) => {
                self.launch(ctx, w.slot, w.commands);
                true
            }
            None => false,
        }
    }

    /// Drops the waiting step, if any; returns whether there was one.
    pub(super) fn drop_waiting(&mut self) -> bool {
        self.waiting.take().is_some()
    }

    /// Waits for the oldest submitted step and returns its token and whether the logit it
    /// won with is finite (`None`: nothing submitted).
    /// With a step waiting for that token, natively the wait is urgent. Cancel-safe: dropped
    /// before it resolves, the step stays queued.
    pub(super) async fn read_oldest(
        &mut self,
        ctx: &GpuContext,
    ) -> Result<Option<(u32, bool)>, GpuError> {
        Ok(self
            .read_oldest_rows(ctx, 1, false)
            .await?
            .map(|rows| rows[0]))
    }

    /// [`StepQueue::read_oldest`] for a step of `rows` rows: each row's token and whether it
    /// won with a finite logit; the wait urgent natively where `urgent` says the GPU has
    /// nothing after it.
    pub(super) async fn read_oldest_rows(
        &mut self,
        ctx: &GpuContext,
        rows: usize,
        urgent: bool,
    ) -> Result<Option<Vec<(u32, bool)>>, GpuError> {
        let mode = if urgent || self.waiting.is_some() {
            ctx.urgent_wait()
        } else {
            WaitMode::Sleep
        };
        let Some(f) = self.in_flight.front_mut() else {
            return Ok(None);
        };
        // The step leaves the queue only once it is read (or failed): a caller that gives up
        // the wait finds it again next time.
        let waited = ctx.done(Some(f.submission.clone()), mode).await;
        let mapped = match waited {
            Ok(()) => (&mut f.mapped)
                .await
                .map_err(|e| GpuError::Readback(e.to_string())),
            Err(e) => Err(e),
        };
        let slot = f.slot;
        self.in_flight.pop_front();
        let mapped = mapped?;
        ctx.check()?;
        mapped.map_err(|e| GpuError::Readback(e.to_string()))?;
        let buf = &self.ring[slot];
        let tokens = {
            let view = buf
                .slice(..)
                .get_mapped_range()
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            view.get(..8 * rows.max(1)).map(|bytes| {
                let words: Vec<u32> = bytemuck::pod_collect_to_vec(bytes);
                words
                    .chunks_exact(2)
                    .map(|w| (w[0], winning_logit_is_finite(f32::from_bits(w[1]))))
                    .collect::<Vec<_>>()
            })
        };
        buf.unmap();
        let tokens = tokens
            .ok_or_else(|| GpuError::Readback(format!("{rows} rows in one step's readback")))?;
        Ok(Some(tokens))
    }
}

/// The sampling kernels leave the value the token won with beside it: the largest logit
/// (greedy), the largest logit / temperature + Gumbel noise (a whole-vocabulary draw), the top
/// candidate's logit (a top-k draw), NaN and -inf counted as -3.4e38 in each. All-NaN or
/// infinite logits show there; finite logits of a model keep far above it.
pub(super) fn winning_logit_is_finite(logit: f32) -> bool {
    logit.is_finite() && logit > -3.0e38
}
