//! The CPU's part of a step: building a 512-token prefill plan (the decoder's graph, its
//! lowering, every dispatch's bind group) of a synthetic preset, on wgpu's no-op backend
//! emulating the lent GPU's device class, so no GPU and no model file are needed.
//! `cargo bench --bench plans`; instruction counts: `valgrind --tool=callgrind
//! --toggle-collect='*plan_dispatches*'` on the bench executable with `--bench --profile-time 1`.

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use wgemma_kernels::{DeviceClass, GpuContext};
use wgemma_text::plans::preset_session;

fn plans(c: &mut Criterion) {
    let Ok(ctx) = pollster::block_on(GpuContext::emulating(DeviceClass::ALL[0])) else {
        eprintln!("no emulated device");
        return;
    };
    let ctx = Arc::new(ctx);
    for preset in ["gemma3-270m", "e2b"] {
        let Ok(session) = pollster::block_on(preset_session(ctx.clone(), preset)) else {
            continue;
        };
        c.bench_function(&format!("prefill plan, 512 tokens, {preset}"), |b| {
            b.iter(|| std::hint::black_box(session.plan_dispatches(512)))
        });
    }
}

criterion_group!(benches, plans);
criterion_main!(benches);
