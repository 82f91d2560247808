//! DiffusionGemma parity commands, in the file layouts of llama.cpp's `diffusion-gemma-eval`
//! (raw little-endian i32 token ids, raw f32 arrays):
//!
//! - `cargo xtask dg-logits --model M --prompt P.i32 --canvas C.i32 [--self-cond L.bin] --out
//!   O.bin`: one denoising step's canvas logits `[C, V]`, the prompt in the cache, optionally
//!   self-conditioned on the logits L (`[C, V]`, already over a temperature).
//! - `cargo xtask dg-replay --model M --prompt P.i32 --init I.i32 --uniforms U.f32 --renoise
//!   R.i32 --steps S [--entropy-bound B] --out T.json`: one block of the entropy-bound sampler
//!   with the given streams (`[S, C]` each, row k for step k), written per step as `argmax`,
//!   `accepted` (0/1 a position), `next_canvas`, `mean_entropy`, `done`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wgemma_diffusion::{
    DiffusionConfig, DiffusionSession, GpuDiffusion, ReplayRng, SamplerRng, SelfConditioning,
};
use wgemma_gguf::MmapSource;
use wgemma_kernels::{ContextOptions, GpuContext};

use crate::TaskError;

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[arg(long)]
    model: PathBuf,
    /// The prompt's token ids (raw i32).
    #[arg(long)]
    prompt: PathBuf,
    /// The canvas's token ids (raw i32).
    #[arg(long)]
    canvas: PathBuf,
    /// Self-conditioning logits `[canvas, vocab]` (raw f32), already over a temperature.
    #[arg(long)]
    self_cond: Option<PathBuf>,
    /// Where to write the logits `[canvas, vocab]` (raw f32).
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    prompt: PathBuf,
    /// The block's starting canvas (raw i32).
    #[arg(long)]
    init: PathBuf,
    /// Per step and position, the draw's uniform (raw f32, `[steps, canvas]`).
    #[arg(long)]
    uniforms: PathBuf,
    /// Per step and position, the renoise token (raw i32, `[steps, canvas]`).
    #[arg(long)]
    renoise: PathBuf,
    /// Denoising steps at most (the schedule's length).
    #[arg(long)]
    steps: u32,
    /// The sampler's entropy bound. [default: the model's]
    #[arg(long)]
    entropy_bound: Option<f32>,
    /// Where to write the steps (JSON).
    #[arg(long)]
    out: PathBuf,
}

fn read_words(path: &Path) -> Result<Vec<[u8; 4]>, TaskError> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "{}: {} bytes, not 4-byte values",
            path.display(),
            bytes.len()
        )
        .into());
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| [b[0], b[1], b[2], b[3]])
        .collect())
}

fn read_ids(path: &Path) -> Result<Vec<u32>, TaskError> {
    read_words(path)?
        .into_iter()
        .map(|w| {
            u32::try_from(i32::from_le_bytes(w))
                .map_err(|_| format!("{}: a negative token id", path.display()).into())
        })
        .collect()
}

fn read_f32(path: &Path) -> Result<Vec<f32>, TaskError> {
    Ok(read_words(path)?
        .into_iter()
        .map(f32::from_le_bytes)
        .collect())
}

/// `data` in rows of `row`, each a row of a stream.
fn rows<T: Clone>(data: Vec<T>, row: usize, what: &Path) -> Result<VecDeque<Vec<T>>, TaskError> {
    if row == 0 || !data.len().is_multiple_of(row) {
        return Err(format!(
            "{}: {} values, not rows of {row}",
            what.display(),
            data.len()
        )
        .into());
    }
    Ok(data.chunks(row).map(<[T]>::to_vec).collect())
}

/// The model's session after `prompt`, with room for one canvas.
fn session(model: &Path, prompt: &[u32]) -> Result<DiffusionSession, TaskError> {
    let ctx = Arc::new(pollster::block_on(GpuContext::new(
        ContextOptions::default().with_env(),
    ))?);
    let header = wgemma_gguf::read_file_header(model)?;
    let cfg = DiffusionConfig::from_gguf(&header)?;
    let src = MmapSource::open(model)?;
    let opts = wgemma_text::LoadOptions::default();
    let gpu = pollster::block_on(GpuDiffusion::load(ctx, &header, &cfg, &src, opts, |_| {}))?;
    let mut s = DiffusionSession::new(Arc::new(gpu), prompt.len() + cfg.canvas_length)?;
    pollster::block_on(s.encode(prompt))?;
    Ok(s)
}

pub fn logits(a: LogitsArgs) -> Result<(), TaskError> {
    let prompt = read_ids(&a.prompt)?;
    let canvas = read_ids(&a.canvas)?;
    let mut s = session(&a.model, &prompt)?;
    let sc = a.self_cond.as_deref().map(read_f32).transpose()?;
    let sc = sc
        .as_deref()
        .map_or(SelfConditioning::None, SelfConditioning::Given);
    pollster::block_on(s.denoise(&canvas, sc))?;
    let logits = pollster::block_on(s.logits())?;
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&a.out, bytes)?;
    eprintln!("wrote {} logits to {}", logits.len(), a.out.display());
    Ok(())
}

pub fn replay(a: ReplayArgs) -> Result<(), TaskError> {
    let prompt = read_ids(&a.prompt)?;
    let init = read_ids(&a.init)?;
    let c = init.len();
    let mut rng = ReplayRng {
        canvases: VecDeque::from([init]),
        uniforms: rows(read_f32(&a.uniforms)?, c, &a.uniforms)?,
        renoise: rows(read_ids(&a.renoise)?, c, &a.renoise)?,
    };
    let mut s = session(&a.model, &prompt)?;
    let mut rule = s.model().cfg.sampler;
    rule.max_steps = a.steps;
    rule.entropy_bound = a.entropy_bound.unwrap_or(rule.entropy_bound);
    rule.check()?;
    let mut canvas = vec![0; c];
    rng.canvas(&mut canvas, s.model().cfg.text.n_vocab as u32)?;
    s.start_block(&canvas)?;
    let mut steps = Vec::new();
    for k in 0..a.steps {
        let o = pollster::block_on(s.step(k, &rule, &mut rng))?;
        let accepted: Vec<u8> = o.accepted.iter().map(|&x| u8::from(x)).collect();
        steps.push(serde_json::json!({
            "argmax": o.argmax,
            "accepted": accepted,
            "next_canvas": o.next,
            "mean_entropy": o.mean_entropy,
            "done": o.done,
        }));
        if o.done {
            break;
        }
    }
    std::fs::write(&a.out, serde_json::to_string(&steps)? + "\n")?;
    eprintln!("wrote {} steps to {}", steps.len(), a.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../crates/diffusion/tests");

    fn write_i32(path: &Path, ids: &[u32]) {
        let b: Vec<u8> = ids.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
        std::fs::write(path, b).unwrap();
    }

    fn write_f32(path: &Path, v: &[f32]) {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(path, b).unwrap();
    }

    fn json_u32(v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    /// Both commands on the tiny model's files give transformers' logits and replay.
    #[test]
    fn the_commands_reproduce_the_goldens() {
        if wgemma_test_support::gpu().is_none() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("wgemma-dg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = PathBuf::from(format!("{FIXTURES}/fixtures/dg_tiny.gguf"));
        let golden: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{FIXTURES}/golden/dg_tiny.json")).unwrap(),
        )
        .unwrap();
        let case = &golden["cases"][1];
        let (p, c, sc, out) = (
            dir.join("p.i32"),
            dir.join("c.i32"),
            dir.join("sc.bin"),
            dir.join("o.bin"),
        );
        write_i32(&p, &json_u32(&case["prompt"]));
        write_i32(&c, &json_u32(&case["canvas"]));
        let file = |k: &str| {
            PathBuf::from(format!(
                "{FIXTURES}/golden/{}",
                case["files"][k].as_str().unwrap()
            ))
        };
        std::fs::copy(file("sc_in"), &sc).unwrap();
        logits(LogitsArgs {
            model: model.clone(),
            prompt: p.clone(),
            canvas: c,
            self_cond: Some(sc),
            out: out.clone(),
        })
        .unwrap();
        let (got, want) = (
            read_f32(&out).unwrap(),
            read_f32(&file("logits_sc")).unwrap(),
        );
        let d = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(got.len() == want.len() && d < 2e-3, "max |diff| {d}");

        let replays: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{FIXTURES}/golden/dg_tiny_replay.json")).unwrap(),
        )
        .unwrap();
        let run = &replays["runs"]["one_block"];
        let flat_u32 = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array().unwrap().iter().flat_map(json_u32).collect()
        };
        let (i, u, r, t) = (
            dir.join("i.i32"),
            dir.join("u.f32"),
            dir.join("r.i32"),
            dir.join("t.json"),
        );
        write_i32(&p, &json_u32(&run["prompt"]));
        write_i32(&i, &json_u32(&run["canvases"][0]));
        let uniforms: Vec<f32> = run["uniforms"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect();
        write_f32(&u, &uniforms);
        write_i32(&r, &flat_u32(&run["renoise"]));
        let steps = run["steps"].as_u64().unwrap() as u32;
        let bound = run["entropy_bound"].as_f64().map(|b| b as f32);
        replay(ReplayArgs {
            model,
            prompt: p,
            init: i,
            uniforms: u,
            renoise: r,
            steps,
            entropy_bound: bound,
            out: t.clone(),
        })
        .unwrap();
        let got: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&t).unwrap()).unwrap();
        let records = run["records"].as_array().unwrap();
        assert_eq!(got.as_array().unwrap().len(), records.len());
        for (g, w) in got.as_array().unwrap().iter().zip(records) {
            for k in ["argmax", "accepted", "next_canvas", "done"] {
                assert_eq!(g[k], w[k], "{k}");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
