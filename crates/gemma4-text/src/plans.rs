//! The dispatch sequences of a model's steps, as text: what the tests pin per synthetic preset
//! and device class (`tests/plans.rs`, the pins in `tests/plans/`), and what
//! `cargo xtask plans` writes or checks on a real device. A model is loaded without its
//! weights' bytes ([`WeightBytes::Skip`]), so planning even a 26B model reads nothing but its
//! header.

use std::sync::Arc;

use wgemma_gguf::GgmlType;
use wgemma_kernels::GpuContext;

use crate::forward::{
    ExpertPlacement, ForwardError, GpuModel, GpuSession, LoadError, LoadOptions, PleRows,
    SessionOptions, WeightBytes,
};
use crate::synth::{SynthHeader, SynthSpec};
use crate::{ConfigError, TextConfig};

/// The presets whose plans are pinned.
pub const PINNED_PRESETS: [&str; 6] = [
    "tiny-gemma3",
    "tiny-gemma4",
    "gemma3-270m",
    "e2b",
    "e4b",
    "26b-a4b",
];

/// The tiny presets' weight dtype in the pinned plans.
pub const TINY_DTYPE: GgmlType = GgmlType::Q8_0;

/// The steps a report lists, by tokens: two prefill chunks (a full one and an odd one) and
/// the decode step.
pub const STEPS: [usize; 3] = [512, 37, 1];

/// The session's sizes while planning: `bench-e2e`'s for a 512-token prompt and 256 tokens.
pub const SESSION: SessionOptions = SessionOptions {
    context: 512 + 256 + 8,
    max_batch: 512,
};

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("unknown preset {0}")]
    Preset(String),
    #[error(transparent)]
    Write(#[from] wgemma_gguf::WriteError),
    #[error(transparent)]
    Gguf(#[from] wgemma_gguf::GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Forward(#[from] ForwardError),
}

/// The report of the preset `name` on `ctx`.
pub async fn preset_report(ctx: Arc<GpuContext>, name: &str) -> Result<String, PlanError> {
    report(&preset_session(ctx, name).await?)
}

/// A session of the preset `name` on `ctx`, its weights allocated but not written.
pub async fn preset_session(ctx: Arc<GpuContext>, name: &str) -> Result<GpuSession, PlanError> {
    let spec = SynthSpec::preset(name, TINY_DTYPE).ok_or_else(|| PlanError::Preset(name.into()))?;
    let header = Arc::new(SynthHeader::new(&spec)?);
    let g = header.gguf()?;
    let cfg = TextConfig::from_gguf(&g)?;
    let opts = LoadOptions {
        experts: ExpertPlacement::Resident,
        weights: WeightBytes::Skip,
    };
    let rows = Some(PleRows::Fetched(header.clone()));
    let model = GpuModel::load_with(ctx, &g, &cfg, &*header, rows, opts, |_| {}).await?;
    Ok(GpuSession::new(Arc::new(model), SESSION)?)
}

/// Every step of [`STEPS`] of `session`, each under a `# N tokens` line.
pub fn report(session: &GpuSession) -> Result<String, PlanError> {
    let mut out = String::new();
    for tokens in STEPS {
        out.push_str(&format!("# {tokens} tokens\n"));
        for line in session.plan_lines(tokens)? {
            out.push_str(&line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// Where two reports first differ, for a failure message: the line number and both lines.
pub fn first_difference(got: &str, want: &str) -> Option<String> {
    let (mut g, mut w) = (got.lines(), want.lines());
    for n in 1.. {
        match (g.next(), w.next()) {
            (None, None) => return None,
            (a, b) if a == b => {}
            (a, b) => {
                return Some(format!(
                    "line {n}: got {:?}, pinned {:?}",
                    a.unwrap_or("(end)"),
                    b.unwrap_or("(end)")
                ));
            }
        }
    }
    None
}

/// A report's file name under the pins' folder.
pub fn file_name(preset: &str, class: &str) -> String {
    format!("{preset}.{class}.txt")
}
