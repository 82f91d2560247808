//! `cargo xtask dawn-check --model M`: the page's engine in Node on Dawn (web/dawn/bench.mjs)
//! held to the native engine on this machine's adapter, by the top log-probabilities of each
//! token a prompt of token ids generates greedily. Three Dawn runs:
//! - as the engine chooses (the browser's WGSL through Tint, with whatever `shader-f16` and
//!   `subgroups` the adapter has), against native;
//! - with Dawn's unsafe APIs and the products routed as on a GPU (`WGEMMA_GPU_ROUTING=1`: the
//!   tiled kernels), where the adapter's subgroup matrices must be taken
//!   (`matmul_sgmat.wgsl`), against
//! - the same without them and with f32 inputs (`WGEMMA_NO_COOP=1`, `WGEMMA_INT8_TILES=0`),
//!   itself against native.
//!
//! Run through `scripts/dawn-lavapipe.sh`, whose lavapipe gives Dawn an adapter with all of
//! that on the CPU (CI does); on a GPU, `--matrices-only` (native runs its own kernels there)
//! and, on NVIDIA, `--toggle vulkan_enable_f16_on_nvidia`.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use wgemma::{Event, GenerateRequest, LoadOptions, Model, session_options_from_json};

use crate::TaskError;
use crate::dawn_bench::{BenchRun, ensure_webgpu};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// Prompt tokens.
    #[arg(long, default_value_t = 96)]
    prompt: usize,
    /// Tokens generated.
    #[arg(long, default_value_t = 6)]
    decode: usize,
    /// The Node.js to run.
    #[arg(long, default_value = "node")]
    node: PathBuf,
    /// A Dawn toggle to turn on in every Dawn run, repeatable (`vulkan_enable_f16_on_nvidia`:
    /// `shader-f16`, and so the f16 subgroup matrices, on NVIDIA).
    #[arg(long)]
    toggle: Vec<String>,
    /// Only the subgroup matrices against the f32 tiles: on a GPU, where native runs other
    /// kernels (tensor cores) than the browser's.
    #[arg(long)]
    matrices_only: bool,
}

/// Top log-probabilities compared at each generated token.
const TOP: usize = 5;

/// Each generated token's top `[id, log-probability]`s.
type Tops = Vec<Vec<(u32, f32)>>;

/// How far two runs' log-probabilities may differ: `abs + rel * |value|`.
#[derive(Clone, Copy)]
struct Tolerance {
    abs: f32,
    rel: f32,
}

impl Tolerance {
    fn of(self, x: f32) -> f32 {
        self.abs + self.rel * x.abs()
    }
}

/// The same kernels compiled by Tint rather than naga: a last bit here and there.
const SAME_KERNELS: Tolerance = Tolerance {
    abs: 2e-3,
    rel: 2e-5,
};
/// Other products of the same values (tiled rather than matrix-vector, f32 throughout),
/// whose sums round differently: seen up to 3.4e-4 of the tiny models' large logits.
const OTHER_F32_PRODUCTS: Tolerance = Tolerance {
    abs: 5e-3,
    rel: 5e-4,
};
/// The products' operands rounded to f16 (2^-11 relative each) through a tiny model's layers.
const F16_PRODUCTS: Tolerance = Tolerance {
    abs: 2e-2,
    rel: 2e-3,
};

pub fn run(a: Args) -> Result<(), TaskError> {
    let dir = crate::workspace_root().join("web/dawn");
    ensure_webgpu(&dir, &a.node)?;
    let model = a
        .model
        .canonicalize()
        .map_err(|e| format!("{}: {e}", a.model.display()))?;
    let dawn = |toggles: &[&str], knobs: &[&str]| dawn_run(&a, &model, toggles, knobs);
    let unsafe_apis = "allow_unsafe_apis";
    let matrices = dawn(&[unsafe_apis], &["WGEMMA_GPU_ROUTING=1"])?;
    let f32_tiles = dawn(
        &[unsafe_apis],
        &[
            "WGEMMA_GPU_ROUTING=1",
            "WGEMMA_NO_COOP=1",
            "WGEMMA_INT8_TILES=0",
        ],
    )?;
    let mut problems = Vec::new();
    if matrices.subgroup_matrix == 0 {
        problems.push(format!(
            "the engine took no subgroup matrices on {}",
            matrices.adapter
        ));
    }
    if f32_tiles.subgroup_matrix != 0 {
        problems.push("WGEMMA_NO_COOP=1 still took subgroup matrices".into());
    }
    let mut summary = serde_json::json!({
        "adapter": matrices.adapter,
        "shader_f16": matrices.shader_f16,
        "subgroups": matrices.subgroups,
        "subgroup_matrix": matrices.subgroup_matrix,
    });
    let mut check = |what: &str, got: &Tops, want: &Tops, tol| {
        summary[what] = serde_json::json!(compare(got, want, tol, what, &mut problems));
    };
    check(
        "subgroup matrices against f32 tiles",
        &matrices.tops,
        &f32_tiles.tops,
        F16_PRODUCTS,
    );
    if !a.matrices_only {
        let native = native_tops(&model, a.prompt, a.decode)?;
        let chosen = dawn(&[], &[])?;
        check(
            "the engine's choice against native",
            &chosen.tops,
            &native,
            SAME_KERNELS,
        );
        check(
            "f32 tiles against native",
            &f32_tiles.tops,
            &native,
            OTHER_F32_PRODUCTS,
        );
    }
    println!("{summary}");
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("dawn-check:\n  {}", problems.join("\n  ")).into())
    }
}

/// The native engine's greedy run of bench.mjs's prompt: each token's top log-probabilities.
fn native_tops(model: &Path, prompt: usize, decode: usize) -> Result<Tops, TaskError> {
    let opts = LoadOptions {
        gpu: wgemma_kernels::ContextOptions::default().with_env(),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(model, opts))?;
    let ids = crate::bench_e2e::synthetic_prompt(prompt, 0, model.config().n_vocab as u32);
    let request = serde_json::json!({
        "tokens": ids, "maxTokens": decode, "temperature": 0, "logprobs": TOP,
    });
    let context = serde_json::json!({ "context": prompt + decode + 8 });
    let mut session = model.session(session_options_from_json(&context)?)?;
    let mut events = Box::pin(session.generate(GenerateRequest::from_json(&request)?));
    let mut tops = Vec::new();
    while let Some(event) = pollster::block_on(events.next()) {
        if let Event::Token {
            logprobs: Some(lp), ..
        } = event?
        {
            tops.push(lp.top);
        }
    }
    Ok(tops)
}

/// What a Dawn run reports.
struct DawnRun {
    adapter: String,
    shader_f16: bool,
    subgroups: bool,
    subgroup_matrix: u64,
    tops: Tops,
}

/// bench.mjs's run of `model` with Dawn's `toggles` (and `a.toggle`) on and the engine's
/// `knobs`.
fn dawn_run(
    a: &Args,
    model: &Path,
    toggles: &[&str],
    knobs: &[&str],
) -> Result<DawnRun, TaskError> {
    // One flag for all the toggles: a second `enable-dawn-features` would replace the first.
    let all: Vec<&str> = toggles
        .iter()
        .copied()
        .chain(a.toggle.iter().map(String::as_str))
        .collect();
    let flags = if all.is_empty() {
        Vec::new()
    } else {
        vec![format!("enable-dawn-features={}", all.join(","))]
    };
    let knobs: Vec<String> = knobs.iter().map(|s| s.to_string()).collect();
    let run = BenchRun {
        node: &a.node,
        model,
        prompt: a.prompt,
        decode: a.decode,
        reps: 1,
        dawn: &flags,
        knobs: &knobs,
        logprobs: TOP,
    };
    let out = run
        .command(&[])?
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", run.node.display()))?;
    if !out.status.success() {
        return Err(format!("web/dawn/bench.mjs failed ({})", out.status).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().ok_or("bench.mjs printed nothing")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let tops = v["top_logprobs"]
        .as_array()
        .ok_or("bench.mjs gave no top_logprobs")?
        .iter()
        .map(|step| {
            // A log-probability that is not a number (JSON has none: NaN and infinities come
            // as null) is kept as NaN, for `compare` to refuse.
            step.as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    let id = e[0].as_u64().unwrap_or(u64::MAX) as u32;
                    (id, e[1].as_f64().map_or(f32::NAN, |v| v as f32))
                })
                .collect()
        })
        .collect();
    Ok(DawnRun {
        adapter: v["adapter"].as_str().unwrap_or_default().to_string(),
        shader_f16: v["shaderF16"].as_bool().unwrap_or(false),
        subgroups: v["subgroups"].as_bool().unwrap_or(false),
        subgroup_matrix: v["subgroup_matrix"].as_u64().unwrap_or(0),
        tops,
    })
}

/// The largest difference of `got` from `want` as a fraction of its tolerance; what goes past
/// it into `problems`. Every token must carry [`TOP`] finite entries on both sides, their ids
/// in the same order except where neighbours stand closer than the tolerance. Where the two
/// runs generated different tokens (a near tie), the comparison ends with that token: what
/// follows continues different texts.
fn compare(got: &Tops, want: &Tops, tol: Tolerance, what: &str, problems: &mut Vec<String>) -> f32 {
    if got.len() != want.len() || got.is_empty() {
        problems.push(format!(
            "{what}: {} tokens against {}",
            got.len(),
            want.len()
        ));
        return f32::INFINITY;
    }
    let mut worst = 0f32;
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        let whole = |t: &Vec<(u32, f32)>| t.len() == TOP && t.iter().all(|e| e.1.is_finite());
        if !whole(g) || !whole(w) {
            problems.push(format!("{what}: token {step}: {g:?} against {w:?}"));
            return f32::INFINITY;
        }
        for (rank, (&(id, lp), &(want_id, want_lp))) in g.iter().zip(w).enumerate() {
            if id != want_id && (lp - want_lp).abs() > tol.of(want_lp) {
                problems.push(format!(
                    "{what}: token {step}, rank {rank}: id {id} ({lp}) against {want_id} ({want_lp})"
                ));
            }
            if let Some(&(_, same)) = w.iter().find(|(i, _)| *i == id) {
                let d = (lp - same).abs() / tol.of(same);
                worst = worst.max(d);
                if d > 1.0 {
                    problems.push(format!(
                        "{what}: token {step}, id {id}: {lp} against {same}"
                    ));
                }
            }
        }
        if g[0].0 != w[0].0 {
            break;
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_takes_close_neighbours_swapped_and_flags_the_rest() {
        let tol = Tolerance {
            abs: 0.01,
            rel: 0.0,
        };
        let top = |lps: [(u32, f32); 3]| {
            let mut t = lps.to_vec();
            t.extend([(7, -9.0), (8, -9.5)]);
            t
        };
        let want: Tops = vec![top([(1, -0.1), (2, -0.105), (3, -2.0)]); 2];
        let mut problems = Vec::new();
        // The first token's top two swap within the tolerance, so the texts part there: the
        // second token (anything) is not compared.
        let swapped: Tops = vec![
            top([(2, -0.104), (1, -0.101), (3, -2.0)]),
            top([(5, -0.1), (6, -0.2), (3, -3.0)]),
        ];
        assert!(compare(&swapped, &want, tol, "swap", &mut problems) < 1.0);
        assert!(problems.is_empty(), "{problems:?}");
        let off: Tops = vec![top([(1, -0.1), (2, -0.105), (3, -2.5)]); 2];
        assert!(compare(&off, &want, tol, "off", &mut problems) > 1.0);
        assert_eq!(problems.len(), 2, "{problems:?}");
        let reordered: Tops = vec![top([(3, -0.1), (2, -0.105), (1, -2.0)]); 2];
        compare(&reordered, &want, tol, "order", &mut problems);
        assert_eq!(problems.len(), 4, "{problems:?}");
        let nan: Tops = vec![top([(1, f32::NAN), (2, -0.105), (3, -2.0)]); 2];
        assert!(compare(&nan, &want, tol, "nan", &mut problems).is_infinite());
        let short: Tops = vec![vec![(1, -0.1)]; 2];
        assert!(compare(&short, &want, tol, "short", &mut problems).is_infinite());
        assert!(compare(&Vec::new(), &want, tol, "none", &mut problems).is_infinite());
        assert_eq!(problems.len(), 7, "{problems:?}");
    }
}
