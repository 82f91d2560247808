//! Continuous batching: sessions of one model whose generations share each decode step. Their
//! KV caches are slots of one pool; a step computes the next token of every running
//! generation at once (the products read each weight once for all of them), and generations
//! start and end between steps. Each step is queued before the one before it is read back, so
//! that the GPU computes it while the CPU reads that one's tokens and makes their events (a
//! generation that ends meanwhile drops its token from the step queued after); a generation
//! running alone queues its steps ahead of the readback as [`Session::generate`] does.
//!
//! A newcomer's long prompt is read a chunk a step ([`Batch::set_prefill_chunk`]), so the
//! generations under way go on between its chunks rather than wait for all of it.

use wgemma_text::{BatchDecoder, BatchRow, ForwardError, SamplingParams, SessionOptions};

use crate::error::Error;
use crate::model::Model;
use crate::session::{CancelHandle, Event, GenerateRequest, Run, Session};

/// Tokens of a prompt another slot must hold beyond what the starting slot's own cache holds
/// for the slot to take them from it ([`Batch::start`]): fewer are read faster than copied.
pub const ADOPT_MIN: usize = 16;

/// A slot's event from [`Batch::start`] or [`Batch::step`].
pub type SlotEvent = (usize, Result<Event, Error>);

struct Slot {
    session: Session,
    run: Option<Run>,
    /// A generation whose prompt is being read a chunk a step, before its run starts.
    prefill: Option<Prefill>,
}

struct Prefill {
    run: Run,
    tokens: Vec<u32>,
    /// Tokens of the prompt in the cache so far.
    read: usize,
}

/// Sessions of one model that generate together, each in a slot: its own conversation and
/// KV cache (kept between its generations, so a conversation continued in its slot reuses
/// it), one generation at a time.
pub struct Batch {
    decoder: BatchDecoder,
    slots: Vec<Slot>,
    prefill_chunk: usize,
    /// The slots of the batched step queued and not read back yet, in its rows' order.
    flight: Option<Vec<usize>>,
    /// Whether batched steps are queued a step ahead of their readback (off with
    /// `WGEMMA_BATCH_SYNC=1`, to measure it).
    ahead: bool,
}

impl Batch {
    /// `slots` sessions of `model` sized by `opts` (each `opts.context` positions), whose
    /// decode steps run together; fewer where their caches would not fit one GPU buffer
    /// ([`Batch::slots`] says how many).
    pub fn new(model: &Model, slots: usize, opts: SessionOptions) -> Result<Self, Error> {
        let _span = tracing::info_span!("batch_new", slots, context = opts.context).entered();
        let fit = model.max_pooled_slots(opts.context);
        if slots > fit {
            tracing::warn!(
                slots,
                fit,
                context = opts.context,
                "the KV caches of that many sessions do not fit one GPU buffer: fewer sessions"
            );
        }
        let pool = model.kv_pool(slots.min(fit).max(1), opts.context)?;
        let sessions = (0..pool.slots())
            .map(|_| model.pooled_session(opts, &pool))
            .collect::<Result<Vec<_>, _>>()?;
        let decoder = BatchDecoder::new(pool, sessions.len())?;
        Ok(Self {
            decoder,
            slots: sessions
                .into_iter()
                .map(|session| Slot {
                    session,
                    run: None,
                    prefill: None,
                })
                .collect(),
            prefill_chunk: opts.max_batch,
            flight: None,
            ahead: !wgemma_kernels::knobs::on("WGEMMA_BATCH_SYNC"),
        })
    }

    /// Reads a newcomer's text prompt at most `tokens` tokens a step (by default the
    /// sessions' `max_batch`, one pass), its chunks between the steps of the generations
    /// under way; 0 reads every prompt at once, the others waiting for it.
    pub fn set_prefill_chunk(&mut self, tokens: usize) {
        self.prefill_chunk = tokens;
    }

    /// Slots whose prompt is being read a chunk a step.
    pub fn reading_prompts(&self) -> usize {
        self.slots.iter().filter(|s| s.prefill.is_some()).count()
    }

    /// Its number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots generating now (their prompts read or being read).
    pub fn running(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.run.is_some() || s.prefill.is_some())
            .count()
    }

    /// Batched steps queued whose tokens are not read back yet (at most one between calls).
    pub fn in_flight(&self) -> usize {
        usize::from(self.flight.is_some())
    }

    /// Whether `slot` has no generation under way.
    pub fn is_idle(&self, slot: usize) -> bool {
        self.slots
            .get(slot)
            .is_some_and(|s| s.run.is_none() && s.prefill.is_none())
    }

    /// The tokens `slot`'s cache holds.
    pub fn cached_tokens(&self, slot: usize) -> &[u32] {
        self.slots
            .get(slot)
            .map_or(&[], |s| s.session.cached_tokens())
    }

    /// A handle that stops `slot`'s generation at its next step (its `Done` says
    /// [`crate::StopReason::Cancelled`]).
    pub fn cancel_handle(&self, slot: usize) -> Option<CancelHandle> {
        self.slots.get(slot).map(|s| s.session.cancel_handle())
    }

    /// Starts `req` in idle `slot`: its prompt is read (what the slot's cache, or a longer
    /// prefix another slot holds, has of it reused) and its first token sampled. Returns that
    /// first event, after the events of the steps read first: the batched step in flight, and
    /// the queued steps of a generation that ran alone until now (the generations step
    /// together from here on); a prompt read in chunks gives its first event from a later
    /// [`Batch::step`].
    pub async fn start(
        &mut self,
        slot: usize,
        req: GenerateRequest,
    ) -> Result<Vec<SlotEvent>, Error> {
        if !self.is_idle(slot) {
            return Err(Error::Request(format!(
                "slot {slot} is busy or does not exist"
            )));
        }
        let mut out = Vec::new();
        // The step in flight is read first: the slot may be one of its rows, and its cache or
        // another slot's may be read for the prompt.
        self.collect(&mut out).await;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(run) = &mut s.run {
                run.stop_pipelining();
                while s.session.gpu_mut().in_flight() > 0 && !run.is_done() {
                    out.push((i, run.step(&mut s.session).await));
                }
                if run.is_done() {
                    s.run = None;
                }
            }
        }
        // A text prompt's ids, for the prefix other slots hold and the chunks to read.
        let text = self.slots[slot].session.text_prompt(&req);
        if let Some(tokens) = &text {
            self.adopt_best_prefix(slot, tokens).await;
        }
        let s = &mut self.slots[slot];
        let mut run = Run::new(req);
        run.stop_pipelining();
        let chunked = match &text {
            Some(tokens) => {
                s.session
                    .chunked_prompt(run.request(), tokens, self.prefill_chunk)
                    .await
            }
            None => Ok(None),
        };
        match chunked.map(|c| c.zip(text)) {
            Ok(Some((cached, tokens))) => {
                run.arrived_with(cached);
                s.prefill = Some(Prefill {
                    run,
                    tokens,
                    read: cached,
                });
                return Ok(out);
            }
            Ok(None) => {}
            Err(e) => {
                out.push((slot, Err(e)));
                return Ok(out);
            }
        }
        let first = run.step(&mut s.session).await;
        if !run.is_done() {
            s.run = Some(run);
        }
        out.push((slot, first));
        Ok(out)
    }

    /// Where another slot's cache holds more of a text prompt, `tokens`, than `slot`'s own (by
    /// [`ADOPT_MIN`] tokens or more), `slot` takes that prefix, copied on the GPU, in place of
    /// its conversation, so that only the rest of the prompt is read: a prefix cache across
    /// the slots (a system prompt that many requests share is read once).
    async fn adopt_best_prefix(&mut self, slot: usize, tokens: &[u32]) {
        // A prompt keeps at least one token to read for its logits.
        let most = tokens.len().saturating_sub(1);
        let shared = |s: &Session, upto: usize| {
            s.cached_tokens()
                .iter()
                .zip(tokens)
                .take(upto.min(most))
                .take_while(|(a, b)| a == b)
                .count()
        };
        let own = shared(&self.slots[slot].session, usize::MAX);
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != slot)
            .map(|(i, s)| (i, shared(&s.session, s.session.text_prefix())))
            .max_by_key(|&(_, n)| n);
        let Some((donor, n)) = best.filter(|&(_, n)| n >= own + ADOPT_MIN) else {
            return;
        };
        let (to, from) = if donor < slot {
            let (a, b) = self.slots.split_at_mut(slot);
            (&mut b[0], &a[donor])
        } else {
            let (a, b) = self.slots.split_at_mut(donor);
            (&mut a[slot], &b[0])
        };
        match to.session.adopt_prefix(&from.session, n).await {
            Ok(()) => tracing::debug!(slot, donor, tokens = n, "took a cached prefix"),
            // The request reads its whole prompt instead.
            Err(e) => tracing::warn!(slot, donor, error = %e, "could not take a cached prefix"),
        }
    }

    /// One event from every running generation but those `paused` says to leave (their
    /// clients have not taken the last one yet): the events that need no token (an end, a
    /// cancel), then the tokens of one step that feeds and samples all the others at once.
    /// That step was queued by the call before, and this call queues the next before reading
    /// it, so a paused generation still gets the token of a step queued before its pause
    /// (where a generation asks for log-probabilities, the steps run one at a time). A
    /// generation running alone takes its own pipelined step.
    pub async fn step(&mut self, paused: impl Fn(usize) -> bool) -> Vec<SlotEvent> {
        let mut out = self.step_runs(paused).await;
        self.read_prompts(&mut out).await;
        out
    }

    /// A chunk of each prompt being read; where the rest fits one chunk (or the request was
    /// cancelled), its run starts: reads the rest, samples the first token and steps with the
    /// others from the next step on.
    async fn read_prompts(&mut self, out: &mut Vec<SlotEvent>) {
        let chunk = self.prefill_chunk.max(1);
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(p) = &mut s.prefill else { continue };
            if p.tokens.len() - p.read > chunk && !s.session.cancel_requested() {
                let end = p.read + chunk;
                match s.session.read_chunk(&p.tokens[p.read..end]).await {
                    Ok(()) => p.read = end,
                    Err(e) => {
                        s.prefill = None;
                        out.push((i, Err(e)));
                    }
                }
                continue;
            }
            let Some(Prefill { mut run, .. }) = s.prefill.take() else {
                continue;
            };
            let first = run.step(&mut s.session).await;
            if !run.is_done() {
                s.run = Some(run);
            }
            out.push((i, first));
        }
    }

    /// [`Batch::step`]'s part for the generations whose prompts are read.
    async fn step_runs(&mut self, paused: impl Fn(usize) -> bool) -> Vec<SlotEvent> {
        let mut out = Vec::new();
        // Alone (no prompt being read beside it either), a generation pipelines its steps.
        if self.flight.is_none()
            && self.running() == 1
            && let Some((i, s)) = self
                .slots
                .iter_mut()
                .enumerate()
                .find(|(i, s)| s.run.is_some() && !paused(*i))
            && let Some(run) = &mut s.run
        {
            run.start_pipelining();
            out.push((i, run.step(&mut s.session).await));
            if run.is_done() {
                s.run = None;
            }
            return out;
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(run) = &mut s.run else { continue };
            if paused(i) {
                continue;
            }
            run.stop_pipelining();
            if let Some(event) = run.ready_event(&mut s.session).await {
                out.push((i, event));
            }
            if run.is_done() {
                s.run = None;
            }
        }
        let mut stepping = self.with_room(&paused);
        let ahead = self.ahead
            && stepping.len() >= 2
            && stepping
                .iter()
                .all(|&i| self.slots[i].run.as_ref().is_some_and(Run::may_queue_ahead));
        if !ahead {
            // One step at a time from here: the one in flight is read first (a step's pause).
            if self.flight.is_some() {
                self.collect(&mut out).await;
            } else if !stepping.is_empty() {
                self.submit(&stepping, &mut out).await;
                self.collect(&mut out).await;
            }
            return out;
        }
        if self.flight.is_none() {
            self.submit(&stepping, &mut out).await;
            stepping = self.with_room(&paused);
        }
        // The next step goes to the GPU before this one's tokens are read.
        let current = self.flight.take();
        if stepping.len() >= 2 {
            self.submit(&stepping, &mut out).await;
        }
        let next = std::mem::replace(&mut self.flight, current);
        self.collect(&mut out).await;
        self.flight = next;
        out
    }

    /// The slots not `paused` whose generations a step queued now would give a token they
    /// want.
    fn with_room(&self, paused: &impl Fn(usize) -> bool) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(i, s)| !paused(*i) && s.run.as_ref().is_some_and(|r| r.has_room(&s.session)))
            .map(|(i, _)| i)
            .collect()
    }

    /// Queues a batched step of the generations in `stepping` (slots with runs, in order) as
    /// [`Batch::flight`]; where it cannot be queued, each of them ends with the error.
    async fn submit(&mut self, stepping: &[usize], out: &mut Vec<SlotEvent>) {
        let mut rows = Vec::with_capacity(stepping.len());
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(run) = s.run.as_mut().filter(|_| stepping.contains(&i)) else {
                continue;
            };
            let (params, step) = run.sampling();
            rows.push(BatchRow {
                session: s.session.gpu_mut(),
                params,
                step,
            });
        }
        let submitted = self.decoder.submit(&mut rows).await;
        drop(rows);
        let slots = stepping.to_vec();
        match submitted {
            Ok(()) => {
                for &i in &slots {
                    if let Some(run) = &mut self.slots[i].run {
                        run.stepped();
                    }
                }
                self.flight = Some(slots);
            }
            Err(e) => self.end_with(&slots, &e, out),
        }
    }

    /// Reads the tokens of the step in flight (waiting for it) and puts the events of its
    /// generations in `out`, paused or not; a generation that ended, or is ending, while the
    /// step ran drops its token.
    async fn collect(&mut self, out: &mut Vec<SlotEvent>) {
        let Some(slots) = self.flight.take() else {
            return;
        };
        // Collecting uses each row's session only.
        let unused = SamplingParams::default();
        let mut rows: Vec<BatchRow<'_>> = self
            .slots
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| slots.contains(i))
            .map(|(_, s)| BatchRow {
                session: s.session.gpu_mut(),
                params: &unused,
                step: 0,
            })
            .collect();
        let tokens = self.decoder.collect(&mut rows).await;
        drop(rows);
        let tokens = match tokens {
            Ok(t) => t,
            Err(e) => {
                self.end_with(&slots, &e, out);
                return;
            }
        };
        for (i, token) in slots.into_iter().zip(tokens) {
            let s = &mut self.slots[i];
            let Some(run) = s.run.as_mut().filter(|r| !r.is_ending()) else {
                if s.run.is_none() {
                    // Ended while the step ran, its cache settled then: the step's token is
                    // forgotten too (nothing sampled waits to be fed).
                    let len = s.session.cached_tokens().len();
                    if let Err(e) = s.session.gpu_mut().rewind(len) {
                        tracing::warn!(slot = i, error = %e, "could not settle an ended slot");
                    }
                }
                continue;
            };
            let event = match token {
                Ok(id) => match run.read_logprobs(&mut s.session).await {
                    Ok(()) => run.on_token(&mut s.session, id).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e.into()),
            };
            run.note_end(&event);
            if run.is_done() {
                s.run = None;
            }
            out.push((i, event));
        }
    }

    /// Ends the generations of `slots` with `e`, why their step did not run or was lost.
    fn end_with(&mut self, slots: &[usize], e: &ForwardError, out: &mut Vec<SlotEvent>) {
        for &i in slots {
            if self.slots[i].run.take().is_some() {
                out.push((i, Err(ForwardError::Batch(e.to_string()).into())));
            }
        }
    }
}
