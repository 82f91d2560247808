//! Work built once over fixed buffers and recorded as often as needed (a tower's plan for one
//! input size): dispatches and, when traced, copies of intermediate values into buffers of
//! their own, read back after the run.

use crate::context::{GpuContext, GpuError};
use crate::gpu::{Dispatch, Profiler, Recorder, View};

enum Step {
    Run(Dispatch),
    Copy { from: View, to: View },
}

/// A plan's steps, in order.
pub struct Steps {
    steps: Vec<Step>,
    /// Where traced values are copied, in order; `None` when not traced.
    taps: Option<Vec<View>>,
}

impl Steps {
    /// No steps yet; `traced`: [`Steps::tap`] copies values out.
    pub fn new(traced: bool) -> Self {
        Self {
            steps: Vec::new(),
            taps: traced.then(Vec::new),
        }
    }

    /// Adds a dispatch (or passes its error on).
    pub fn push(&mut self, d: Result<Dispatch, GpuError>) -> Result<(), GpuError> {
        self.steps.push(Step::Run(d?));
        Ok(())
    }

    /// Adds dispatches (or passes their error on).
    pub fn extend(&mut self, ds: Result<Vec<Dispatch>, GpuError>) -> Result<(), GpuError> {
        self.steps.extend(ds?.into_iter().map(Step::Run));
        Ok(())
    }

    /// When traced, copies what `view` holds at this point into a buffer of its own.
    pub fn tap(&mut self, ctx: &GpuContext, view: &View) {
        let Some(taps) = self.taps.as_mut() else {
            return;
        };
        let to = View::of(&ctx.storage("tap", view.size));
        taps.push(to.clone());
        self.steps.push(Step::Copy {
            from: view.clone(),
            to,
        });
    }

    /// The buffers [`Steps::tap`] copied into, in order (empty when not traced).
    pub fn taps(&self) -> &[View] {
        self.taps.as_deref().unwrap_or_default()
    }

    /// Steps recorded (dispatches and copies): what a profiler needs room for.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Runs the steps once (one encoder, `label`) and reads back what [`Steps::tap`] copied,
    /// in order.
    pub async fn run_traced(
        &self,
        ctx: &GpuContext,
        label: &str,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        let mut rec = Recorder::new(ctx, label);
        self.record_into(&mut rec);
        rec.submit();
        let mut values = Vec::with_capacity(self.taps().len());
        for view in self.taps() {
            values.push(ctx.read_f32(view).await?);
        }
        Ok(values)
    }

    /// GPU time per kernel of one run, most expensive first: (kernel, dispatches,
    /// microseconds). `None` where the adapter has no timestamp queries.
    pub async fn profile(
        &self,
        ctx: &GpuContext,
        label: &str,
    ) -> Result<Option<Vec<(&'static str, usize, f64)>>, GpuError> {
        let Some(mut profiler) = Profiler::new(ctx, self.steps.len() as u32) else {
            return Ok(None);
        };
        let mut rec = Recorder::profiled(ctx, label, &mut profiler);
        self.record_into(&mut rec);
        rec.submit();
        Ok(Some(profiler.read(ctx).await?))
    }

    /// Records the steps, submitting every `every` of them as they are recorded, so that
    /// the GPU works through the first while the CPU records the rest (a tower's few hundred
    /// dispatches take about a millisecond to record); the last part is left in the
    /// recorder returned, for the caller to add to and submit.
    pub fn record_submitting<'c>(
        &self,
        ctx: &'c GpuContext,
        label: &str,
        every: usize,
    ) -> Recorder<'c> {
        let mut rec = Recorder::new(ctx, label);
        for chunk in self.steps.chunks(every.max(1)) {
            if rec.dispatch_count() > 0 {
                rec.submit();
                rec = Recorder::new(ctx, label);
            }
            Self::record_steps(chunk, &mut rec);
        }
        rec
    }

    pub fn record_into(&self, rec: &mut Recorder<'_>) {
        Self::record_steps(&self.steps, rec);
    }

    fn record_steps(steps: &[Step], rec: &mut Recorder<'_>) {
        for s in steps {
            match s {
                Step::Run(d) => rec.run(d),
                Step::Copy { from, to } => rec.copy(from, to, to.size),
            }
        }
    }
}
