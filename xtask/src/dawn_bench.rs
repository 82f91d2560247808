//! `cargo xtask dawn-bench --model M`: the page's engine (web/pkg through web/wgemma.js and its
//! worker) timed in Node on Dawn, Chrome's WebGPU, on this machine's GPU (web/dawn/bench.mjs):
//! prefill and decode tok/s and time to first token as one JSON object, as `bench-e2e` prints
//! them natively, with the same prompt ids.

use std::ffi::OsString;
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
    let mut node_options = Vec::new();
    if let Some(out) = &a.cpu_prof {
        // Node runs in web/dawn: the folder goes by its absolute path.
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
        let out = out
            .canonicalize()
            .map_err(|e| format!("{}: {e}", out.display()))?;
        node_options.extend(["--cpu-prof".into(), "--cpu-prof-dir".into(), out.into()]);
    }
    let run = BenchRun {
        node: &a.node,
        model: &model,
        prompt: a.prompt,
        decode: a.decode,
        reps: a.reps,
        dawn: &a.dawn,
        knobs: &a.knob,
        logprobs: 0,
    };
    let mut cmd = run.command(&node_options)?;
    cmd.args(["--per-layer-table", &a.per_layer_table]);
    if a.profile {
        cmd.arg("--profile");
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

/// One run of web/dawn/bench.mjs: what it is given.
pub(crate) struct BenchRun<'a> {
    pub node: &'a Path,
    /// An absolute path (Node runs in web/dawn).
    pub model: &'a Path,
    pub prompt: usize,
    pub decode: usize,
    pub reps: usize,
    /// Dawn's flags.
    pub dawn: &'a [String],
    /// The engine's switches, `WGEMMA_NAME=VALUE`.
    pub knobs: &'a [String],
    /// Top log-probabilities of each generated token to report (0: none).
    pub logprobs: usize,
}

impl BenchRun<'_> {
    /// The command, in web/dawn, with Node's own `node_options` before the script; more of
    /// the script's arguments may follow.
    pub(crate) fn command(&self, node_options: &[OsString]) -> Result<Command, TaskError> {
        let mut cmd = Command::new(self.node);
        cmd.current_dir(workspace_root().join("web/dawn"));
        cmd.args(node_options).args(self.script_args()?);
        Ok(cmd)
    }

    fn script_args(&self) -> Result<Vec<String>, TaskError> {
        let mut args = vec![
            "bench.mjs".to_string(),
            "--model".into(),
            self.model.display().to_string(),
        ];
        for (name, n) in [
            ("--prompt", self.prompt),
            ("--decode", self.decode),
            ("--reps", self.reps),
            ("--logprobs", self.logprobs),
        ] {
            args.extend([name.to_string(), n.to_string()]);
        }
        for flag in self.dawn {
            args.extend(["--dawn".to_string(), flag.clone()]);
        }
        for knob in self.knobs {
            if !knob.contains('=') {
                return Err(format!("--knob {knob}: NAME=VALUE").into());
            }
            args.extend(["--knob".to_string(), knob.clone()]);
        }
        Ok(args)
    }
}

/// Installs the `webgpu` package (Dawn for Node) into web/dawn where it is missing.
pub(crate) fn ensure_webgpu(dir: &Path, node: &Path) -> Result<(), TaskError> {
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
