//! `cargo xtask synth OUT.gguf [--preset NAME]`: a synthetic model with random weights, tiny
//! for tests or with a real model's shapes and Q4_K_M dtype mix for benchmarks.

use std::io::BufWriter;

use wgemma_gguf::GgmlType;
use wgemma_text::synth::{SynthSpec, write_synthetic};

use crate::TaskError;

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the GGUF.
    out: std::path::PathBuf,
    /// Which model: tiny-gemma3, tiny-gemma4, gemma3-270m, e2b, e4b, 26b-a4b (the last three
    /// are Gemma 4's shapes), tiny-dg and dg-26b-a4b (DiffusionGemma's), or a vision or
    /// audio tower in llama.cpp's mmproj layout:
    /// e2b-mmproj, e4b-mmproj, e2b-audio-mmproj, e4b-audio-mmproj.
    #[arg(long, default_value = "tiny-gemma3")]
    preset: String,
    /// Weight dtype of the tiny presets (F32, Q8_0, Q4_K, ...).
    #[arg(long, default_value = "F32")]
    dtype: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(a: Args) -> Result<(), TaskError> {
    if let Some(mut spec) = wgemma_vision::synth::VisionSynth::preset(&a.preset) {
        spec.seed = a.seed;
        std::fs::write(&a.out, wgemma_vision::synth::mmproj_bytes(&spec)?)?;
        eprintln!("wrote {}", a.out.display());
        return Ok(());
    }
    if let Some(mut spec) = wgemma_audio::synth::AudioSynth::preset(&a.preset) {
        spec.seed = a.seed;
        std::fs::write(&a.out, wgemma_audio::synth::mmproj_bytes(&spec)?)?;
        eprintln!("wrote {}", a.out.display());
        return Ok(());
    }
    let dtype =
        GgmlType::from_name(&a.dtype).ok_or_else(|| format!("unknown dtype {}", a.dtype))?;
    let mut spec = SynthSpec::preset(&a.preset, dtype)
        .ok_or_else(|| format!("unknown preset {}", a.preset))?;
    spec.seed = a.seed;
    let t = std::time::Instant::now();
    let file = std::fs::File::create(&a.out)?;
    write_synthetic(&spec, BufWriter::with_capacity(1 << 22, file))?;
    let size = std::fs::metadata(&a.out)?.len();
    eprintln!(
        "wrote {} ({:.2} GiB) in {:.1} s",
        a.out.display(),
        size as f64 / (1u64 << 30) as f64,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
