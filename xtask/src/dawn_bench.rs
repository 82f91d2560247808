//! `cargo xtask dawn-bench --model M`: the page's engine (web/pkg through web/wgemma.js and its
//! worker) timed in Node on Dawn, Chrome's WebGPU, on this machine's GPU (web/dawn/bench.mjs):
//! prefill and decode tok/s and time to first token as one JSON object, as `bench-e2e` prints
//! them natively, with the same prompt ids.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{TaskError, workspace_root};

/// Chromium's Vulkan on the CPU: Dawn finds no adapter on lavapipe (it lacks a Vulkan feature
/// Dawn requires), but takes SwiftShader.
const SWIFTSHADER_ICD: &str = "/usr/lib/chromium/vk_swiftshader_icd.json";

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// Prompt tokens.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Tokens generated a run.
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Timed runs after the warm-up.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Dawn's flags (`backend=vulkan`, `enable-dawn-features=...`), repeatable.
    #[arg(long)]
    dawn: Vec<String>,
    /// Use the package already in web/pkg.
    #[arg(long)]
    no_build: bool,
    /// The Node.js to run.
    #[arg(long, default_value = "node")]
    node: PathBuf,
    /// Also time each kernel of one prefill and one decode step (GPU timestamps), as
    /// `profile` in the JSON.
    #[arg(long)]
    profile: bool,
    /// Gemma 4's per-layer embedding table: `gpu` (uploaded whole, the page's default) or
    /// `fetch` (a row per token), as the page's `perLayerTable` load option.
    #[arg(long, default_value = "gpu")]
    per_layer_table: String,
    /// An engine switch `WGEMMA_NAME=VALUE`, as the page's `knobs` load option sets it
    /// (the browser has no environment), repeatable.
    #[arg(long)]
    knob: Vec<String>,
    /// Write Node's CPU profiles (`.cpuprofile`, one per thread: the worker's holds the
    /// engine's wasm and its WebGPU calls) into this folder.
    #[arg(long)]
    cpu_prof: Option<PathBuf>,
    /// Run on SwiftShader (`/usr/lib/chromium`'s Vulkan on the CPU) where no GPU is: checks
    /// the harness; its timings say nothing of a GPU.
    #[arg(long)]
    swiftshader: bool,
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let root = workspace_root();
    if !a.no_build {
        crate::wasm::build(&root)?;
    }
    let dir = root.join("web/dawn");
    ensure_webgpu(&dir, &a.node)?;
    let model = a
        .model
        .canonicalize()
        .map_err(|e| format!("{}: {e}", a.model.display()))?;
    let mut cmd = Command::new(&a.node);
    cmd.current_dir(&dir);
    if let Some(out) = &a.cpu_prof {
        // Node runs in web/dawn: the folder goes by its absolute path.
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
        let out = out
            .canonicalize()
            .map_err(|e| format!("{}: {e}", out.display()))?;
        cmd.arg("--cpu-prof").arg("--cpu-prof-dir").arg(out);
    }
    cmd.arg("bench.mjs")
        .arg("--model")
        .arg(&model)
        .args(["--prompt", &a.prompt.to_string()])
        .args(["--decode", &a.decode.to_string()])
        .args(["--reps", &a.reps.to_string()])
        .args(["--per-layer-table", &a.per_layer_table]);
    if a.profile {
        cmd.arg("--profile");
    }
    for flag in &a.dawn {
        cmd.args(["--dawn", flag]);
    }
    for knob in &a.knob {
        if !knob.contains('=') {
            return Err(format!("--knob {knob}: NAME=VALUE").into());
        }
        cmd.args(["--knob", knob]);
    }
    if a.swiftshader {
        cmd.env("VK_ICD_FILENAMES", SWIFTSHADER_ICD)
            .env("VK_DRIVER_FILES", SWIFTSHADER_ICD);
    }
    let status = cmd
        .status()
        .map_err(|e| format!("running {}: {e}", a.node.display()))?;
    if !status.success() {
        return Err(format!("web/dawn/bench.mjs failed ({status})").into());
    }
    Ok(())
}

/// Installs the `webgpu` package (Dawn for Node) into web/dawn where it is missing.
fn ensure_webgpu(dir: &Path, node: &Path) -> Result<(), TaskError> {
    if dir.join("node_modules/webgpu").is_dir() {
        return Ok(());
    }
    // npm beside the chosen node, else on the PATH.
    let npm = node
        .parent()
        .map(|d| d.join("npm"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("npm"));
    let status = Command::new(&npm)
        .current_dir(dir)
        .args(["ci", "--no-audit", "--no-fund"])
        .status()
        .map_err(|e| format!("running npm (install nodejs and npm): {e}"))?;
    if !status.success() {
        return Err("npm ci in web/dawn failed".into());
    }
    Ok(())
}
