//! The dispatch sequences of every pinned synthetic preset's steps (prefill chunks of 512 and
//! 37 tokens, the decode step, the samplers) on every device class, against the pins in
//! `tests/plans/`: each line a kernel variant and its workgroups. The classes are emulated on
//! wgpu's no-op backend (every shader variant is validated, nothing runs), so this needs no
//! GPU and reads no weights. A change that alters a sequence must be measured as fast or
//! faster on the device it changes (benches/RESULTS.md), then the pins rewritten with
//! `cargo xtask plans --write`. `cargo xtask plans` checks a real device against its class.

mod common;

use std::sync::Arc;

use wgemma_kernels::{DeviceClass, GpuContext, reflect};
use wgemma_text::plans::{
    PINNED_PRESETS, STEPS, file_name, first_difference, preset_session, report,
};

fn pinned(preset: &str, class: DeviceClass) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/plans")
        .join(file_name(preset, class.name()));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (cargo xtask plans --write)", path.display()))
}

/// Every difference between `ctx`'s reports for `presets` and the pins of `class`, and every
/// dispatch that disagrees with its kernel's WGSL (`wgemma_kernels::reflect`).
fn differences(ctx: &Arc<GpuContext>, class: DeviceClass, presets: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for preset in presets {
        let session = pollster::block_on(preset_session(ctx.clone(), preset))
            .unwrap_or_else(|e| panic!("{preset} on {}: {e}", class.name()));
        let got = report(&session).unwrap();
        let place = format!("{preset} on {}", ctx.info.name);
        if let Some(d) = first_difference(&got, &pinned(preset, class)) {
            out.push(format!("{place}: {d}"));
        }
        for tokens in STEPS {
            let dispatches = session.plan_dispatches(tokens).unwrap();
            let problems = reflect::check_dispatches(ctx, &dispatches);
            out.extend(
                problems
                    .into_iter()
                    .map(|p| format!("{place}, {tokens} tokens: {p}")),
            );
        }
    }
    out
}

/// Every pinned preset but 26B-A4B, whose emulated weights take 16 GiB of host memory and
/// minutes here (`cargo xtask plans --emulated` checks it, `benches/h100.sh tests` on the
/// H100); `WGEMMA_PLANS_ALL=1` adds it.
#[test]
fn every_preset_plans_as_pinned_on_every_device_class() {
    let all = std::env::var("WGEMMA_PLANS_ALL").is_ok_and(|v| v == "1");
    let presets: Vec<&str> = PINNED_PRESETS
        .into_iter()
        .filter(|p| all || *p != "26b-a4b")
        .collect();
    let mut diffs = Vec::new();
    for class in DeviceClass::ALL {
        let ctx = Arc::new(pollster::block_on(GpuContext::emulating(class)).unwrap());
        diffs.extend(differences(&ctx, class, &presets));
    }
    assert!(diffs.is_empty(), "plans differ:\n{}", diffs.join("\n"));
}

/// The emulation is only as good as its class's features and limits: the real device (CI's
/// lavapipe) must plan as its class does.
#[test]
fn this_device_plans_as_its_class_is_pinned() {
    let Some(ctx) = common::ctx() else { return };
    let Some(class) = DeviceClass::of(&ctx.info, &ctx.features) else {
        eprintln!("{} is of no pinned device class", ctx.info.name);
        return;
    };
    let diffs = differences(&ctx, class, &["tiny-gemma3", "tiny-gemma4", "gemma3-270m"]);
    assert!(diffs.is_empty(), "plans differ:\n{}", diffs.join("\n"));
}
