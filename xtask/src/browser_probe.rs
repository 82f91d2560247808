//! `cargo xtask browser-probe`: where a model's logits in the browser leave native. Asks one
//! model raw prompts of growing length natively (without `shader-f16`, as SwiftShader runs)
//! and in headless Chromium under sets of the engine's `WGEMMA_*` switches (the page's
//! `knobs`), and prints, per set and prompt, whether the first token agrees and the largest
//! difference between the two runs' top-20 log-probabilities. A switch set that brings the
//! browser back to native names the kernel or fusion whose compiled form differs.

use std::path::{Path, PathBuf};
use std::process::Command;

use futures::StreamExt;
use wgemma::{Event, GenerateRequest, LoadOptions, Model};

use crate::browser_test::{ensure_playwright, native_gpu, require_chromium};
use crate::serve::Server;
use crate::wasm::build;
use crate::{TaskError, workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// The model asked (GGUF).
    #[arg(long)]
    model: PathBuf,
    /// Prompt lengths, in repetitions of a seven-word sentence.
    #[arg(long, value_delimiter = ',', default_value = "2,8,16,32")]
    lengths: Vec<usize>,
    /// A set of switches for the browser, `NAME=VALUE` pairs joined by `;` (repeatable). The
    /// browser's defaults always run first.
    #[arg(long)]
    knobs: Vec<String>,
    #[arg(long, default_value = "/usr/bin/chromium")]
    chromium: PathBuf,
    /// Use the package already in web/pkg.
    #[arg(long)]
    no_build: bool,
    /// Prompt tokens a prefill pass takes, in both runs (the session's `maxBatch`).
    #[arg(long, default_value_t = 512)]
    max_batch: usize,
}

/// A prompt of `n` repetitions of a sentence.
fn prompt(n: usize) -> String {
    "the sea is wide and the ship ".repeat(n)
}

/// A set of switches from `NAME=VALUE;NAME=VALUE`.
fn knob_set(spec: &str) -> Result<serde_json::Value, TaskError> {
    let mut knobs = serde_json::Map::new();
    for pair in spec.split(';').filter(|p| !p.trim().is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("a switch is NAME=VALUE, not {pair:?}"))?;
        knobs.insert(k.trim().to_string(), v.trim().into());
    }
    Ok(serde_json::json!({ "name": spec, "knobs": knobs }))
}

/// What the native run gave for one prompt: its length in tokens, the first token and its
/// top-20 log-probabilities.
struct NativeFirst {
    prompt_tokens: usize,
    id: u32,
    top: Vec<(u32, f32)>,
}

/// The native run's first token of each prompt.
fn native_firsts(
    model: &Path,
    prompts: &[String],
    max_batch: usize,
) -> Result<Vec<NativeFirst>, TaskError> {
    let opts = LoadOptions {
        gpu: native_gpu(),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(model, opts))?;
    let mut firsts = Vec::new();
    for p in prompts {
        let mut session = model.session(wgemma::SessionOptions {
            context: 1024,
            max_batch,
        })?;
        let req = GenerateRequest::from_json(
            &serde_json::json!({ "prompt": p, "maxTokens": 1, "logprobs": 20 }),
        )?;
        let mut events = Box::pin(session.generate(req));
        let (mut first, mut prompt_tokens) = (None, 0);
        while let Some(event) = pollster::block_on(events.next()) {
            match event? {
                Event::Token {
                    id,
                    logprobs: Some(lp),
                    ..
                } => {
                    first.get_or_insert((id, lp.top));
                }
                Event::Done { timings, .. } => prompt_tokens = timings.prompt_tokens,
                _ => {}
            }
        }
        let (id, top) = first.ok_or("the native run gave no token")?;
        firsts.push(NativeFirst {
            prompt_tokens,
            id,
            top,
        });
    }
    Ok(firsts)
}

/// The largest difference of a log-probability both runs list, and how many they share.
fn top_difference(native: &[(u32, f32)], browser: &serde_json::Value) -> (f32, usize) {
    let browser: Vec<(u64, f64)> = browser
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| Some((p[0].as_u64()?, p[1].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    let mut worst = 0f32;
    let mut shared = 0;
    for (id, lp) in native {
        if let Some((_, b)) = browser.iter().find(|(bid, _)| *bid == u64::from(*id)) {
            worst = worst.max((b - f64::from(*lp)).abs() as f32);
            shared += 1;
        }
    }
    (worst, shared)
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let root = workspace_root();
    require_chromium(&a.chromium)?;
    if !a.no_build {
        build(&root)?;
    }
    let prompts: Vec<String> = a.lengths.iter().map(|&n| prompt(n)).collect();
    let native = native_firsts(&a.model, &prompts, a.max_batch)?;
    let mut sets = vec![knob_set("")?];
    for k in &a.knobs {
        sets.push(knob_set(k)?);
    }
    let tests = root.join("web/tests");
    ensure_playwright(&tests)?;
    let server = Server::start(root.join("web"), vec![a.model.clone()], 0)?;
    let name = a
        .model
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let result = Command::new("node")
        .current_dir(&tests)
        .arg("probe.mjs")
        .env("WGEMMA_URL", format!("http://{}", server.addr))
        .env("WGEMMA_CHROMIUM", &a.chromium)
        .env("WGEMMA_MODEL", format!("models/{name}"))
        .env("WGEMMA_PROMPTS", serde_json::to_string(&prompts)?)
        .env(
            "WGEMMA_KNOB_SETS",
            serde_json::Value::Array(sets).to_string(),
        )
        .env(
            "WGEMMA_SESSION",
            serde_json::json!({ "context": 1024, "maxBatch": a.max_batch }).to_string(),
        )
        .output()
        .map_err(|e| format!("running node (install nodejs): {e}"))?;
    eprint!("{}", String::from_utf8_lossy(&result.stderr));
    let stdout = String::from_utf8_lossy(&result.stdout);
    let parsed: serde_json::Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("the probe printed no results ({e}): {stdout}"))?;
    for line in parsed["log"].as_array().into_iter().flatten() {
        eprintln!("browser: {}", line.as_str().unwrap_or_default());
    }
    let Some(sets) = parsed["sets"].as_array() else {
        return Err(format!("the probe failed: {parsed}").into());
    };
    println!(
        "| switches | prompt tokens | native first | browser first | top-20 shared | largest difference |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for set in sets {
        let firsts = set["firsts"].as_array().into_iter().flatten();
        for (n, got) in native.iter().zip(firsts) {
            let (worst, shared) = top_difference(&n.top, &got["top"]);
            println!(
                "| {} | {} | {} | {} | {shared} | {worst:.2e} |",
                set["name"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("(defaults)"),
                n.prompt_tokens,
                n.id,
                got["id"]
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_sets_parse_and_refuse_what_is_not_a_pair() {
        let set = knob_set("WGEMMA_NO_SPLIT_K=1; WGEMMA_FUSIONS_OFF=a,b").unwrap();
        assert_eq!(set["knobs"]["WGEMMA_NO_SPLIT_K"], "1");
        assert_eq!(set["knobs"]["WGEMMA_FUSIONS_OFF"], "a,b");
        assert!(
            knob_set("").unwrap()["knobs"]
                .as_object()
                .unwrap()
                .is_empty()
        );
        assert!(knob_set("WGEMMA_NO_SPLIT_K").is_err());
    }

    #[test]
    fn the_difference_is_over_the_tokens_both_list() {
        let native = [(3, -0.5), (7, -1.0), (9, -2.0)];
        let browser = serde_json::json!([[7, -1.25], [3, -0.5], [11, -3.0]]);
        assert_eq!(top_difference(&native, &browser), (0.25, 2));
    }
}
