//! Helpers shared by the criterion benchmarks in `benches/`: a GPU context and timing of a
//! dispatch repeated inside one compute pass.

use std::time::{Duration, Instant};

use wgemma_kernels::{ContextOptions, Dispatch, GpuContext, Recorder};

/// The benchmark GPU (WGEMMA_ADAPTER / WGEMMA_BACKEND choose).
pub fn context() -> GpuContext {
    pollster::block_on(GpuContext::new(ContextOptions::default().with_env()))
        .unwrap_or_else(|e| panic!("benchmarks need a GPU: {e}"))
}

/// Wall time of `iters` rounds of `dispatches`, all recorded in one pass and submitted once:
/// per-dispatch cost as the GPU sees it in a real step (no per-op submit).
pub fn time_in_one_pass(ctx: &GpuContext, dispatches: &[Dispatch], iters: u64) -> Duration {
    // Warm the pipelines and the caches.
    run(ctx, dispatches, 1);
    let start = Instant::now();
    run(ctx, dispatches, iters);
    start.elapsed()
}

fn run(ctx: &GpuContext, dispatches: &[Dispatch], iters: u64) {
    let mut rec = Recorder::new(ctx, "bench");
    for _ in 0..iters {
        for d in dispatches {
            rec.run(d);
        }
    }
    rec.submit();
    ctx.wait().expect("benchmark dispatch failed");
}
