//! DiffusionGemma's denoising step on a session: the canvas rows after the cache's positions
//! run through the layers with the denoiser's output scales, every canvas row seeing the whole
//! canvas and (on sliding layers) the prompt's last `window - 1` positions, and leave every
//! row's logits. The canvas's keys and values land in the cache past its position, which does
//! not move: the next step writes over them, and the encoder pass over a finished block
//! replaces them. The rows' input (the self-conditioned embeddings) and what reads the logits
//! are dispatches the caller hands in, recorded in the same pass.

use wgemma_kernels::{Dispatch, Profiler, Recorder, View};

use super::{ForwardError, GpuSession, KeyReach, LogitsFor, Op, SoftCopy, StepInput};

/// The buffers of a session's canvas step.
#[derive(Clone, Debug)]
pub struct CanvasBuffers {
    /// Canvas rows.
    pub rows: usize,
    /// `[rows, n_embd]` f32: each canvas row's input, written by the step's `before`
    /// dispatches.
    pub input: View,
    /// `[rows, n_vocab]` f32: each canvas row's logits, after the step.
    pub logits: View,
}

/// What a canvas step records around the layers, in the same pass.
#[derive(Clone, Copy, Default)]
pub struct CanvasWork<'a> {
    /// Dispatches before the layers: they must leave the rows' input in
    /// [`CanvasBuffers::input`].
    pub before: &'a [Dispatch],
    /// Dispatches after them (they may read [`CanvasBuffers::logits`]).
    pub after: &'a [Dispatch],
    /// A copy at the end, `(from, to)`: what the step leaves for the CPU, into a mappable
    /// buffer kept for it.
    pub read_back: Option<(&'a View, &'a View)>,
}

/// A canvas step's plan.
pub(super) struct CanvasPlan {
    buffers: CanvasBuffers,
    ops: Vec<Op>,
}

impl GpuSession {
    /// Prepares the canvas step over `rows` rows (a DiffusionGemma block), with its buffers;
    /// again for another row count. The session's batch must hold the rows.
    pub fn prepare_canvas(&mut self, rows: usize) -> Result<CanvasBuffers, ForwardError> {
        if let Some(p) = self.canvas.as_ref().filter(|p| p.buffers.rows == rows) {
            return Ok(p.buffers.clone());
        }
        if rows == 0 || rows > self.max_batch {
            return Err(ForwardError::Batch(format!(
                "a canvas of {rows} rows in a session of {}-row steps",
                self.max_batch
            )));
        }
        let ctx = self.model.ctx.clone();
        let cfg = &self.model.cfg;
        let floats = |n: usize| (rows * n) as u64 * 4;
        let buffers = CanvasBuffers {
            rows,
            input: View::of(&ctx.storage("canvas input", floats(cfg.n_embd))),
            logits: View::of(&ctx.storage("canvas logits", floats(cfg.n_vocab))),
        };
        let copies = [SoftCopy {
            row: 0,
            rows: buffers.input.clone(),
        }];
        let input = StepInput {
            ids: &self.acts(rows).ids,
            soft: &copies,
            reach: KeyReach::Canvas,
        };
        let ops = self.plan(rows as u32, input, LogitsFor::All, Some(&buffers.logits))?;
        ctx.check()?;
        self.canvas = Some(CanvasPlan {
            buffers: buffers.clone(),
            ops,
        });
        Ok(buffers)
    }

    /// Runs the prepared canvas step at the cache's position in one pass: `work.before`, the
    /// layers, `work.after`, `work.read_back`; then submits it, each dispatch timed by
    /// `profiler` when given. The position stays where it is.
    pub async fn canvas_step(
        &mut self,
        work: CanvasWork<'_>,
        profiler: Option<&mut Profiler>,
    ) -> Result<(), ForwardError> {
        let plan = self
            .canvas
            .as_ref()
            .ok_or_else(|| ForwardError::Batch("no canvas step prepared".into()))?;
        if self.in_flight() > 0 {
            return Err(ForwardError::Busy);
        }
        let (start, rows) = (self.position(), plan.buffers.rows);
        if start + rows > self.capacity {
            return Err(ForwardError::ContextOverflow {
                need: start + rows,
                capacity: self.capacity,
            });
        }
        let arena = self.arena.clone();
        let lease = arena.lease().await;
        self.stage(&vec![0; rows], &[])?;
        self.stage_canvas_keys(start, rows);
        let ctx = self.model.ctx.clone();
        let mut rec = match profiler {
            Some(p) => Recorder::profiled(&ctx, "canvas", p),
            None => Recorder::new(&ctx, "canvas"),
        };
        work.before.iter().for_each(|d| rec.run(d));
        self.record(&mut rec, &plan.ops).await?;
        work.after.iter().for_each(|d| rec.run(d));
        if let Some((from, to)) = work.read_back {
            rec.copy(from, to, from.size);
        }
        rec.submit();
        drop(lease);
        self.has_logits = false;
        Ok(())
    }

    /// Every canvas row's first key (on sliding layers: the prompt's last `window - 1`
    /// positions) and last key (the canvas's end).
    fn stage_canvas_keys(&self, start: usize, rows: usize) {
        let window = self.model.cfg.sliding_window;
        let first = start.saturating_sub(window.saturating_sub(1)) as u32;
        let last = (start + rows - 1) as u32;
        let a = self.acts(rows);
        let ctx = &self.model.ctx;
        for (view, key) in [(&a.first_key, first), (&a.last_key, last)] {
            ctx.write(
                &view.buffer,
                view.offset,
                bytemuck::cast_slice(&vec![key; rows]),
            );
        }
    }
}
