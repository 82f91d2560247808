//! Sessions that decode together. Their KV caches are slots of one [`KvPool`], so a single
//! step ([`BatchDecoder::step`]) computes the next token of each: the products read every
//! weight once for all the rows (decode is bound by reading weights, so M sequences cost little
//! more than one), attention reads each row's own slot, and each row is sampled with its
//! session's parameters into its session's state. Sequences join and leave between steps.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tracing::Instrument;

use wgemma_kernels::ops::{self, Argmax, RowDraw};
use wgemma_kernels::{GpuContext, GpuError, Profiler, Recorder, View};

use super::kv::KvCache;
use super::queue::{MAX_IN_FLIGHT, Sampled, StepQueue};
use super::{ForwardError, Fusions, GpuSession, LogitsFor, Op, StepInput};
use crate::forward::model::GpuModel;
use crate::sampling::SamplingParams;

/// Slots hold a multiple of this many rows, so that every slot's views start on a storage
/// binding's offset alignment (256 bytes) whatever the KV row's size.
const SLOT_ALIGN: usize = 64;

/// Rows of a slot for `context` positions: at most the model's context length, rounded up
/// to [`SLOT_ALIGN`].
fn slot_rows_for(cfg: &crate::config::TextConfig, context: usize) -> usize {
    context
        .clamp(1, cfg.context_length.max(1))
        .next_multiple_of(SLOT_ALIGN)
}

/// One K and one V buffer per cache-owning layer, split into equal slots: the caches of the
/// sessions made with [`GpuSession::in_pool`].
pub struct KvPool {
    model: Arc<GpuModel>,
    slot_rows: usize,
    slots: usize,
    layers: Vec<Option<(View, View)>>,
    /// Indices of the slots no session holds.
    free: Mutex<Vec<usize>>,
}

/// A slot a session holds; given back when dropped.
pub(super) struct PoolSlot {
    pool: Arc<KvPool>,
    index: usize,
}

impl PoolSlot {
    pub(super) fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }

    pub(super) fn index(&self) -> usize {
        self.index
    }
}

impl Drop for PoolSlot {
    fn drop(&mut self) {
        let mut free = self
            .pool
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        free.push(self.index);
    }
}

impl KvPool {
    /// Room for `slots` sequences of up to `context` positions each (rounded up to a multiple
    /// of 64, at most the model's context length).
    pub fn new(
        model: Arc<GpuModel>,
        slots: usize,
        context: usize,
    ) -> Result<Arc<Self>, ForwardError> {
        let cfg = &model.cfg;
        let slots = slots.max(1);
        let slot_rows = slot_rows_for(cfg, context);
        let ctx = &model.ctx;
        let mut layers = Vec::with_capacity(cfg.layers.len());
        for (il, l) in cfg.layers.iter().enumerate() {
            if !l.owns_kv(il) {
                layers.push(None);
                continue;
            }
            let row = (l.n_kv_head * l.head_dim * 4) as u64;
            let bytes = (slots as u64)
                .checked_mul(slot_rows as u64)
                .and_then(|n| n.checked_mul(row))
                .filter(|&b| b <= ctx.max_binding_size())
                .ok_or_else(|| {
                    ForwardError::Batch(format!(
                        "{slots} slots of {slot_rows} positions exceed the GPU's largest \
                         buffer ({} bytes) at layer {il}",
                        ctx.max_binding_size()
                    ))
                })?;
            let buf = |label: &str| View::of(&ctx.storage(label, bytes));
            layers.push(Some((buf("k_pool"), buf("v_pool"))));
        }
        let _span = tracing::info_span!("kv_pool", slots, slot_rows).entered();
        Ok(Arc::new(Self {
            model,
            slot_rows,
            slots,
            layers,
            free: Mutex::new((0..slots).rev().collect()),
        }))
    }

    /// The most slots of `context` positions whose pool (one buffer per layer) and batched
    /// attention scratch fit the GPU's largest binding.
    pub fn max_slots(model: &GpuModel, context: usize) -> usize {
        let cfg = &model.cfg;
        let slot_rows = slot_rows_for(cfg, context);
        let max_row = cfg
            .layers
            .iter()
            .map(|l| (l.n_kv_head * l.head_dim * 4) as u64)
            .max()
            .unwrap_or(1)
            .max(1);
        // The attention scratch of one row; a step's rows each take as much.
        let scratch = 4 * super::attn_part_floats(cfg, 0, slot_rows, 1);
        let slot_rows = slot_rows as u64;
        let limit = model.ctx.max_binding_size();
        let by_pool = limit / (slot_rows * max_row);
        let by_scratch = limit / scratch.max(1);
        by_pool.min(by_scratch) as usize
    }

    pub fn model(&self) -> &Arc<GpuModel> {
        &self.model
    }

    /// Sequences it holds at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Positions of each slot.
    pub fn slot_rows(&self) -> usize {
        self.slot_rows
    }

    /// Slots no session holds.
    pub fn free_slots(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Bytes of GPU memory its buffers take.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| k.size + v.size)
            .sum()
    }

    pub(super) fn layers(&self) -> &[Option<(View, View)>] {
        &self.layers
    }

    pub(super) fn take(self: &Arc<Self>) -> Option<PoolSlot> {
        let index = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(PoolSlot {
            pool: self.clone(),
            index,
        })
    }
}

/// One sequence's part of a batched step: the session (which has sampled a token, read back
/// and not yet fed) and how to sample its next token.
pub struct BatchRow<'a> {
    pub session: &'a mut GpuSession,
    pub params: &'a SamplingParams,
    /// The sequence's step number (the sampler's random stream is seeded per step).
    pub step: u32,
}

/// Runs the decode steps of a pool's sessions together.
pub struct BatchDecoder {
    pool: Arc<KvPool>,
    /// A session over the whole pool: its batched steps' plans bind every slot, and each row
    /// finds its own through its position.
    host: GpuSession,
    /// `[max_rows, vocab]`: every row's logits.
    logits: View,
    /// The steps submitted: each row's sampled token and winning logit, copied from its
    /// session into a ring of buffers read back in order.
    queue: StepQueue,
    /// What each submitted step not read back yet stepped, oldest first.
    queued: VecDeque<QueuedStep>,
    /// The newest queued step when it waits for the tokens of the one before it (its rows'
    /// per-layer table rows are staged on the CPU): what it stages once they are read.
    held: Option<Staged>,
    /// The plan of a step over M rows, built on first use.
    plans: HashMap<usize, Vec<Op>>,
    together: RowsTogether,
    max_rows: usize,
}

/// A step of [`BatchDecoder::submit`] whose tokens are not read back yet.
struct QueuedStep {
    /// Its rows' pool slots, in order: [`BatchDecoder::collect`] checks that it is given the
    /// same sessions.
    slots: Vec<usize>,
    /// One row, stepped by its session's own decode step (queued in the session).
    alone: bool,
    /// Held for its inputs and then not run (the step before it failed): its rows' tokens
    /// are taken back out of their sessions when it is read.
    dropped: Option<ForwardError>,
}

/// What a step writes before it runs: its rows' tokens (`None`: sampled by the step before,
/// on the GPU) and cache rows.
struct Staged {
    inputs: Vec<Option<u32>>,
    positions: Vec<u32>,
}

/// The pool slots of `rows`' sessions, in order.
fn slots_of(rows: &[BatchRow<'_>]) -> Vec<usize> {
    rows.iter()
        .map(|row| row.session.kv.slot().map_or(usize::MAX, PoolSlot::index))
        .collect()
}

/// The rows a step samples together, in two dispatches whatever their number
/// ([`GpuSession::row_draw`], [`ops::argmax_rows`]), rather than two or more a row.
struct RowsTogether {
    /// Off (`WGEMMA_ROWS_APART=1`, to measure it): every row samples itself.
    on: bool,
    /// A [`RowDraw`] a row.
    draws: View,
    scratch: View,
    /// A row's token and winning logit's bits.
    results: View,
    /// The dispatches over M rows, built on first use.
    argmax: HashMap<usize, Argmax>,
}

impl RowsTogether {
    fn new(ctx: &GpuContext, max_rows: usize, vocab: u32) -> Self {
        let rows = max_rows as u64;
        let buf = |name: &str, words: u64| View::of(&ctx.storage(name, words * 4));
        let on = !wgemma_kernels::knobs::on("WGEMMA_ROWS_APART");
        Self {
            on,
            draws: buf("batch draws", 4 * rows),
            scratch: buf("batch argmax scratch", Argmax::scratch_words(vocab) * rows),
            results: buf("batch results", 2 * rows),
            argmax: HashMap::new(),
        }
    }

    /// Records the draws of `draws` (a row each, of `logits`, `vocab` values a row) and
    /// copies each of the rows `which` its token and logit into its session's result and
    /// into `readback`.
    fn record(
        &mut self,
        rec: &mut Recorder<'_>,
        logits: &View,
        vocab: u32,
        draws: &[RowDraw],
        which: &mut [(usize, &mut GpuSession)],
        readback: &View,
    ) -> Result<(), GpuError> {
        let ctx = rec.ctx();
        ctx.write(
            &self.draws.buffer,
            self.draws.offset,
            bytemuck::cast_slice(draws),
        );
        let m = draws.len();
        if !self.argmax.contains_key(&m) {
            let a = ops::argmax_rows(
                ctx,
                logits,
                vocab,
                m as u32,
                &self.scratch,
                &self.results,
                &self.draws,
            )?;
            self.argmax.insert(m, a);
        }
        let a = &self.argmax[&m];
        rec.run(&a.partial);
        rec.run(&a.finish);
        for (r, s) in which.iter_mut() {
            let result = self.results.slice(*r as u64 * 8, 8)?;
            rec.copy(&result, &s.s.result, 8);
            rec.copy(&result, &readback.slice(*r as u64 * 8, 8)?, 8);
        }
        Ok(())
    }
}

impl BatchDecoder {
    /// A decoder of up to `max_rows` of `pool`'s sessions a step.
    pub fn new(pool: Arc<KvPool>, max_rows: usize) -> Result<Self, ForwardError> {
        let model = pool.model().clone();
        let max_rows = max_rows.clamp(1, pool.slots());
        let rows = pool.slots() * pool.slot_rows();
        let kv = KvCache::whole_pool(pool.layers(), rows);
        let host = GpuSession::with_cache(model.clone(), max_rows, kv, pool.slot_rows())?;
        let ctx = &model.ctx;
        let vocab = model.cfg.n_vocab as u64;
        let logits = View::of(&ctx.storage("batch logits", max_rows as u64 * vocab * 4));
        Ok(Self {
            pool,
            host,
            logits,
            queue: StepQueue::of_rows(ctx, max_rows),
            queued: VecDeque::new(),
            held: None,
            plans: HashMap::new(),
            together: RowsTogether::new(ctx, max_rows, vocab as u32),
            max_rows,
        })
    }

    /// Chooses the fusions the batched steps use (all by default; fewer for testing the fused
    /// kernels against the ops they replace). A one-row step keeps its session's.
    pub fn set_fusions(&mut self, fusions: Fusions) -> Result<(), ForwardError> {
        self.host.set_fusions(fusions)?;
        self.plans.clear();
        Ok(())
    }

    /// Rows a step takes at most.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    pub fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }

    /// Bytes of GPU memory it holds besides the pool: the rows' logits and the host session's
    /// scratch.
    pub fn gpu_bytes(&self) -> u64 {
        self.logits.size + self.host.s.bytes()
    }

    /// How many steps [`BatchDecoder::submit`] may queue ahead of the readback: two where a
    /// step needs its rows' tokens on the CPU (a per-layer table read from the file): the
    /// second is recorded, and submitted once the first one's tokens are read.
    pub fn pipeline_depth(&self) -> usize {
        if self.host.needs_token_on_cpu() {
            2
        } else {
            MAX_IN_FLIGHT
        }
    }

    /// Steps submitted whose tokens are not read back yet.
    pub fn in_flight(&self) -> usize {
        self.queued.len()
    }

    /// Feeds each row's sampled token and samples its next, all rows in one step, waiting
    /// for the tokens. Per row: its token, or [`ForwardError::NonFiniteLogits`]. A row that
    /// cannot take part (another pool's session, no token sampled, steps in flight, adapters,
    /// a full context) fails the whole step before anything runs.
    pub async fn step(
        &mut self,
        rows: &mut [BatchRow<'_>],
    ) -> Result<Vec<Result<u32, ForwardError>>, ForwardError> {
        self.step_profiled(rows, None).await
    }

    /// [`BatchDecoder::step`], timing each dispatch of the step with `profiler` (steps of
    /// several rows).
    pub async fn step_profiled(
        &mut self,
        rows: &mut [BatchRow<'_>],
        profiler: Option<&mut Profiler>,
    ) -> Result<Vec<Result<u32, ForwardError>>, ForwardError> {
        if !self.queued.is_empty() {
            return Err(ForwardError::Busy);
        }
        let span = tracing::debug_span!("batch_decode", rows = rows.len());
        async {
            self.submit_rows(rows, profiler).await?;
            self.collect_oldest(rows).await
        }
        .instrument(span)
        .await
    }

    /// Queues a step of `rows` without waiting for its tokens, so that the GPU computes it
    /// while the caller reads the step before ([`BatchDecoder::collect`]): each row feeds its
    /// newest sampled token, read back or, where a step queued before this one samples it,
    /// still on the GPU. At most [`BatchDecoder::pipeline_depth`] steps are queued
    /// ([`ForwardError::Busy`] past that); rows may differ from one step to the next.
    pub async fn submit(&mut self, rows: &mut [BatchRow<'_>]) -> Result<(), ForwardError> {
        let span = tracing::debug_span!("batch_submit", rows = rows.len());
        self.submit_rows(rows, None).instrument(span).await
    }

    /// Waits for the oldest step [`BatchDecoder::submit`] queued and returns its rows'
    /// tokens, as [`BatchDecoder::step`] does; `rows` are that step's rows, in its order.
    pub async fn collect(
        &mut self,
        rows: &mut [BatchRow<'_>],
    ) -> Result<Vec<Result<u32, ForwardError>>, ForwardError> {
        let span = tracing::debug_span!("batch_collect", rows = rows.len());
        self.collect_oldest(rows).instrument(span).await
    }

    async fn submit_rows(
        &mut self,
        rows: &mut [BatchRow<'_>],
        profiler: Option<&mut Profiler>,
    ) -> Result<(), ForwardError> {
        if self.queued.len() >= self.pipeline_depth() {
            return Err(ForwardError::Busy);
        }
        let inputs = self.check(rows)?;
        let slots = slots_of(rows);
        if let [row] = rows {
            // One row: the session's own decode step (split attention, fused kernels).
            row.session.advance(row.params, row.step).await?;
            self.queued.push_back(QueuedStep {
                slots,
                alone: true,
                dropped: None,
            });
            return Ok(());
        }
        let m = rows.len();
        let known: Vec<u32> = inputs.iter().flatten().copied().collect();
        self.host.fetch_rows(&known).await?;
        if !self.plans.contains_key(&m) {
            let ids = &self.host.acts(m).ids;
            // Its rows are sequences: the few-token products are theirs.
            let plan = self.host.plan_fused(
                m as u32,
                StepInput::ids(ids),
                LogitsFor::All,
                Some(&self.logits),
                self.host.fusions,
            )?;
            self.plans.insert(m, plan);
        }
        let ctx = self.host.model.ctx.clone();
        let arena = self.host.arena.clone();
        let lease = arena.lease().await;
        // Rows whose tokens are still on the GPU where the table rows are staged on the CPU:
        // the step waits for the one before it to be read (at most one step ahead).
        let defer = self.host.needs_token_on_cpu() && inputs.iter().any(Option::is_none);
        let staged = self.staged(rows, inputs.clone());
        if !defer {
            self.write_staged(&staged)?;
        }
        let mut rec = match profiler {
            Some(p) => Recorder::profiled(&ctx, "batch decode", p),
            None => Recorder::new(&ctx, "batch decode"),
        };
        // Tokens that steps still in flight sample: each from its session's result, after
        // the step that writes it.
        let ids = self.host.acts(m).ids.clone();
        for (r, (row, input)) in rows.iter().zip(&inputs).enumerate() {
            if input.is_none() {
                let token = row.session.s.result.slice(0, 4)?;
                rec.copy(&token, &ids.slice(r as u64 * 4, 4)?, 4);
            }
        }
        self.host.record(&mut rec, &self.plans[&m]).await?;
        let (ring, readback) = self.queue.reserve();
        self.record_sampling(&mut rec, rows, &readback)?;
        for row in rows.iter_mut() {
            row.session.ledger.feed_sampled();
        }
        if defer {
            self.queue.hold(ring, rec.finish());
            self.held = Some(staged);
        } else {
            self.queue.launch(&ctx, ring, rec.finish());
        }
        drop(lease);
        self.queued.push_back(QueuedStep {
            slots,
            alone: false,
            dropped: None,
        });
        Ok(())
    }

    /// Stages and submits the held step now that the step before it (whose rows were
    /// `slots`) has given `tokens`; drops it where a token it feeds is lost or its table row
    /// cannot be read.
    async fn release_held(&mut self, slots: &[usize], tokens: &[(u32, bool)]) {
        let Some(mut staged) = self.held.take() else {
            return;
        };
        let Some(held) = self.queued.back_mut() else {
            return;
        };
        let vocab = self.host.model.cfg.n_vocab as u32;
        let mut unfit = None;
        for (input, slot) in staged.inputs.iter_mut().zip(&held.slots) {
            if input.is_some() {
                continue;
            }
            match slots.iter().position(|s| s == slot).map(|r| tokens[r]) {
                // A row whose logits were not finite feeds its token all the same (within the
                // vocabulary): its reader ends it with that error, and dropping the step would
                // stop every other row with it.
                Some((token, _)) => *input = Some(token.min(vocab.saturating_sub(1))),
                None => unfit = Some(ForwardError::Batch("a held row's token is lost".into())),
            }
        }
        let known: Vec<u32> = staged.inputs.iter().flatten().copied().collect();
        let written = match unfit {
            Some(e) => Err(e),
            None => match self.host.fetch_rows(&known).await {
                Ok(()) => self.write_staged(&staged),
                Err(e) => Err(e),
            },
        };
        match written {
            Ok(()) => {
                self.queue.release(&self.host.model.ctx);
            }
            Err(e) => {
                self.queue.drop_waiting();
                if let Some(held) = self.queued.back_mut() {
                    held.dropped = Some(e);
                }
            }
        }
    }

    async fn collect_oldest(
        &mut self,
        rows: &mut [BatchRow<'_>],
    ) -> Result<Vec<Result<u32, ForwardError>>, ForwardError> {
        let Some(oldest) = self.queued.front() else {
            return Err(ForwardError::NothingSampled);
        };
        if oldest.slots != slots_of(rows) {
            return Err(ForwardError::Batch(
                "the rows read back are not those of the oldest step queued".into(),
            ));
        }
        if oldest.alone {
            let token = rows[0].session.next_token().await;
            self.queued.pop_front();
            return Ok(vec![token]);
        }
        if let Some(e) = &oldest.dropped {
            // Never ran: each row's fed token is its sampled one again.
            let e = e.to_string();
            self.queued.pop_front();
            return Ok(rows
                .iter_mut()
                .map(|row| {
                    row.session.ledger.unfeed_last();
                    Err(ForwardError::Batch(format!("the step did not run: {e}")))
                })
                .collect());
        }
        let ctx = self.host.model.ctx.clone();
        // Nothing queued behind it, or a step waiting for its tokens: the GPU idles until
        // this step's tokens are read.
        let urgent = self.queued.len() == 1;
        let read = self.queue.read_oldest_rows(&ctx, rows.len(), urgent).await;
        let slots = self.queued.pop_front().map(|q| q.slots).unwrap_or_default();
        let tokens = match read {
            Ok(Some(tokens)) => tokens,
            Ok(None) => return Err(ForwardError::NothingSampled),
            Err(e) => {
                self.release_held(&[], &[]).await;
                return Err(e.into());
            }
        };
        self.release_held(&slots, &tokens).await;
        Ok(rows
            .iter_mut()
            .zip(tokens)
            .map(|(row, (token, finite))| {
                row.session.ledger.read_back(token);
                if finite {
                    Ok(token)
                } else {
                    Err(ForwardError::NonFiniteLogits)
                }
            })
            .collect())
    }

    /// Each row's logits into its session, then its draw: together with the others where
    /// its session allows ([`GpuSession::row_draw`]), else by its session's own sampler;
    /// each row's token and logit into the readback.
    fn record_sampling(
        &mut self,
        rec: &mut Recorder<'_>,
        rows: &mut [BatchRow<'_>],
        readback: &View,
    ) -> Result<(), ForwardError> {
        let vocab = self.host.model.cfg.n_vocab as u32;
        let vocab_bytes = u64::from(vocab) * 4;
        let mut draws = Vec::with_capacity(rows.len());
        let mut together = Vec::new();
        for (r, row) in rows.iter_mut().enumerate() {
            let s = &mut *row.session;
            rec.copy(
                &self.logits.slice(r as u64 * vocab_bytes, vocab_bytes)?,
                &s.s.logits,
                vocab_bytes,
            );
            s.has_logits = true;
            match s
                .row_draw(row.params, row.step)
                .filter(|_| self.together.on)
            {
                Some(d) => {
                    draws.push(d);
                    together.push((r, s));
                }
                None => {
                    draws.push(RowDraw::greedy());
                    s.record_sampling(rec, row.params, row.step, true)?;
                    rec.copy(&s.s.result, &readback.slice(r as u64 * 8, 8)?, 8);
                }
            }
        }
        if !together.is_empty() {
            self.together
                .record(rec, &self.logits, vocab, &draws, &mut together, readback)?;
        }
        Ok(())
    }

    /// Each row's token to feed (`None`: sampled by a step in flight, on the GPU), once every
    /// row is fit for the step.
    fn check(&self, rows: &[BatchRow<'_>]) -> Result<Vec<Option<u32>>, ForwardError> {
        if rows.is_empty() {
            return Err(ForwardError::Empty);
        }
        if rows.len() > self.max_rows {
            return Err(ForwardError::Batch(format!(
                "{} rows in one step (at most {})",
                rows.len(),
                self.max_rows
            )));
        }
        rows.iter()
            .enumerate()
            .map(|(r, row)| {
                let s = &row.session;
                let ours =
                    s.kv.slot()
                        .is_some_and(|slot| Arc::ptr_eq(slot.pool(), &self.pool));
                if !ours {
                    return Err(ForwardError::Batch(format!(
                        "row {r}: the session's cache is not in this pool"
                    )));
                }
                if !s.adapters.is_empty() {
                    return Err(ForwardError::Batch(format!(
                        "row {r}: the session applies adapters"
                    )));
                }
                // The session's own steps in flight are those this decoder queued for it.
                let slot = s.kv.slot().map(PoolSlot::index);
                let alone = self
                    .queued
                    .iter()
                    .filter(|q| q.alone && slot.is_some_and(|i| q.slots == [i]))
                    .count();
                if s.in_flight() != alone {
                    return Err(ForwardError::Busy);
                }
                let token = match s.ledger.sampled() {
                    Sampled::Known(token) => Some(token),
                    Sampled::OnGpu
                        if !s.needs_token_on_cpu() || self.may_hold(slot, rows.len()) =>
                    {
                        None
                    }
                    // Its per-layer table rows wait for the token to be read back.
                    Sampled::OnGpu => return Err(ForwardError::Busy),
                    Sampled::None => return Err(ForwardError::NothingSampled),
                };
                let need = s.position() + 1;
                if need > s.capacity {
                    return Err(ForwardError::ContextOverflow {
                        need,
                        capacity: s.capacity,
                    });
                }
                Ok(token)
            })
            .collect()
    }

    /// Whether a step of `m` rows may feed the token of the session in pool slot `slot`
    /// while it is on the GPU, where the table rows are staged on the CPU: held until the
    /// only step in flight, which samples it, is read (one row: the session's own step
    /// decides).
    fn may_hold(&self, slot: Option<usize>, m: usize) -> bool {
        let before = self.queued.front().filter(|_| self.queued.len() == 1);
        m == 1
            || (self.held.is_none()
                && before.is_some_and(|q| {
                    !q.alone && q.dropped.is_none() && slot.is_some_and(|i| q.slots.contains(&i))
                }))
    }

    /// What a step of `rows` feeding `inputs` writes: the tokens, and the cache rows (slot
    /// start + position).
    fn staged(&self, rows: &[BatchRow<'_>], inputs: Vec<Option<u32>>) -> Staged {
        let positions = rows
            .iter()
            .map(|row| {
                let slot = row.session.kv.slot().map_or(0, |s| s.index());
                (slot * self.pool.slot_rows() + row.session.position()) as u32
            })
            .collect();
        Staged { inputs, positions }
    }

    /// Writes a step's tokens (those known: the others are copied on the GPU), cache rows
    /// and per-layer table rows into the arena, before the step is submitted.
    fn write_staged(&self, staged: &Staged) -> Result<(), ForwardError> {
        let tokens: Vec<u32> = staged.inputs.iter().map(|t| t.unwrap_or(0)).collect();
        let host = &self.host;
        // Unknown tokens only come where the table is on the GPU.
        host.stage_ple_rows(&tokens)?;
        let a = host.acts(tokens.len());
        let ctx = &host.model.ctx;
        ctx.write(&a.ids.buffer, a.ids.offset, bytemuck::cast_slice(&tokens));
        ctx.write(
            &a.positions.buffer,
            a.positions.offset,
            bytemuck::cast_slice(&staged.positions),
        );
        Ok(())
    }
}
