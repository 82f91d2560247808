//! `cargo xtask plans`: the dispatch sequences of the pinned synthetic presets
//! (`wgemma_text::plans`). Without flags, this machine's GPU is checked against the pins of
//! its class (on the lent H100: `benches/h100.sh tests`); `--emulated` checks every class's
//! emulation, 26B-A4B included (which `cargo test` leaves out: 16 GiB of host memory);
//! `--write` rewrites the pins from the emulations (`crates/gemma4-text/tests/plans/`).

use std::sync::Arc;

use wgemma_kernels::{ContextOptions, DeviceClass, GpuContext};
use wgemma_text::plans::{PINNED_PRESETS, file_name, first_difference, preset_report};

use crate::TaskError;

#[derive(clap::Args)]
pub struct Args {
    /// Rewrite the pins from each class's emulation.
    #[arg(long)]
    write: bool,
    /// Check each class's emulation rather than this machine's GPU.
    #[arg(long, conflicts_with = "write")]
    emulated: bool,
    /// Presets to check (default: every pinned one).
    #[arg(long, value_delimiter = ',')]
    presets: Vec<String>,
}

/// The pins, under the current folder where it is a checkout (the device machine runs a
/// binary built elsewhere), else under the workspace this was built in.
fn pins_dir() -> std::path::PathBuf {
    let rel = std::path::PathBuf::from("crates/gemma4-text/tests/plans");
    if rel.is_dir() {
        rel
    } else {
        crate::workspace_root().join(rel)
    }
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let presets: Vec<String> = if a.presets.is_empty() {
        PINNED_PRESETS.iter().map(|p| p.to_string()).collect()
    } else {
        a.presets
    };
    let mut differing = 0;
    if a.write || a.emulated {
        for class in DeviceClass::ALL {
            let ctx = Arc::new(pollster::block_on(GpuContext::emulating(class))?);
            differing += check_or_write(&ctx, class, &presets, a.write)?;
        }
    } else {
        let ctx = Arc::new(pollster::block_on(GpuContext::new(
            ContextOptions::default().with_env(),
        ))?);
        let l = &ctx.limits;
        eprintln!(
            "{} ({:?}, vendor {:#x}): {:?}\nbinding {}, buffer {}, workgroup storage {}, \
             storage buffers per stage {}, uniform alignment {}, workgroups per dimension {}",
            ctx.info.name,
            ctx.info.device_type,
            ctx.info.vendor,
            ctx.features,
            l.max_storage_buffer_binding_size,
            l.max_buffer_size,
            l.max_compute_workgroup_storage_size,
            l.max_storage_buffers_per_shader_stage,
            l.min_uniform_buffer_offset_alignment,
            l.max_compute_workgroups_per_dimension,
        );
        let class = DeviceClass::of(&ctx.info, &ctx.features)
            .ok_or_else(|| format!("{} is of no pinned device class", ctx.info.name))?;
        differing += check_or_write(&ctx, class, &presets, false)?;
    }
    if differing > 0 {
        return Err(format!("{differing} plans differ from their pins").into());
    }
    Ok(())
}

/// Writes `ctx`'s report of each preset as the pin of `class`, or compares it with that pin:
/// how many differ.
fn check_or_write(
    ctx: &Arc<GpuContext>,
    class: DeviceClass,
    presets: &[String],
    write: bool,
) -> Result<usize, TaskError> {
    let mut differing = 0;
    for preset in presets {
        let got = pollster::block_on(preset_report(ctx.clone(), preset))?;
        let path = pins_dir().join(file_name(preset, class.name()));
        if write {
            std::fs::write(&path, got)?;
            eprintln!("wrote {}", path.display());
            continue;
        }
        match first_difference(&got, &std::fs::read_to_string(&path)?) {
            None => println!("{preset} on {}: as pinned", ctx.info.name),
            Some(d) => {
                differing += 1;
                println!(
                    "{preset} on {}: differs from {}: {d}",
                    ctx.info.name,
                    path.display()
                );
            }
        }
    }
    Ok(differing)
}
