//! `cargo xtask synth OUT.gguf [--preset tiny-gemma3]`: a synthetic model with random
//! weights.

use std::io::BufWriter;

use wgemma_gguf::GgmlType;
use wgemma_text::synth::{SynthSpec, write_synthetic};

use crate::TaskError;

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the GGUF.
    out: std::path::PathBuf,
    /// Which model: tiny-gemma3, gemma3-270m.
    #[arg(long, default_value = "tiny-gemma3")]
    preset: String,
    /// Weight dtype of the tiny presets (F32, Q8_0, Q4_K, ...).
    #[arg(long, default_value = "F32")]
    dtype: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let dtype =
        GgmlType::from_name(&a.dtype).ok_or_else(|| format!("unknown dtype {}", a.dtype))?;
    let mut spec = match a.preset.as_str() {
        "tiny-gemma3" => SynthSpec::tiny_gemma3(dtype),
        "gemma3-270m" => SynthSpec::gemma3_270m(),
        other => return Err(format!("unknown preset {other}").into()),
    };
    spec.seed = a.seed;
    let file = std::fs::File::create(&a.out)?;
    write_synthetic(&spec, BufWriter::new(file))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
