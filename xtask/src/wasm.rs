//! `cargo xtask wasm`: builds the runtime for `wasm32-unknown-unknown` and binds it for the
//! browser into `web/pkg` (what `web/worker.js` imports).
//!
//! The rustup toolchain has no wasm32 standard library here, so the build uses Debian's
//! `rustc-web` with the std sources of `rust-web-src` (`-Zbuild-std`), linked by the rustup
//! toolchain's `rust-lld`. `WGEMMA_WASM_CARGO` / `WGEMMA_WASM_RUSTC` point elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{TaskError, workspace_root};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_: Args) -> Result<(), TaskError> {
    let wasm = build(&workspace_root())?;
    let size = std::fs::metadata(&wasm)?.len();
    eprintln!(
        "wrote {} ({:.1} MiB)",
        wasm.display(),
        size as f64 / (1u64 << 20) as f64
    );
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String, TaskError> {
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The wasm-bindgen version Cargo.lock pins: the CLI must be the same version.
fn locked_bindgen_version(root: &Path) -> Result<String, TaskError> {
    let lock = std::fs::read_to_string(root.join("Cargo.lock"))?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"wasm-bindgen\"" {
            if let Some(v) = lines.next().and_then(|l| l.strip_prefix("version = \"")) {
                return Ok(v.trim_end_matches('"').to_string());
            }
        }
    }
    Err("Cargo.lock has no wasm-bindgen entry".into())
}

/// Builds and binds; returns the bound module, `web/pkg/wgemma_bg.wasm`.
pub fn build(root: &Path) -> Result<PathBuf, TaskError> {
    let var = |k: &str, default: &str| std::env::var(k).unwrap_or_else(|_| default.to_string());
    let cargo = var("WGEMMA_WASM_CARGO", "/usr/bin/cargo");
    let rustc = var("WGEMMA_WASM_RUSTC", "/usr/bin/rustc");
    for tool in [&cargo, &rustc] {
        if !Path::new(tool).exists() {
            return Err(format!(
                "{tool} not found: install Debian's wasm-capable toolchain \
                 (apt-get install rustc-web rust-web-src cargo-web)"
            )
            .into());
        }
    }
    let sysroot = output(Command::new("rustc").args(["--print", "sysroot"]))?;
    let lld = Path::new(&sysroot).join("lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld");
    if !lld.exists() {
        return Err(format!(
            "{} not found (the rustup toolchain's linker)",
            lld.display()
        )
        .into());
    }
    let target_dir = root.join("target/wasm");
    let status = Command::new(&cargo)
        .current_dir(root)
        .args([
            "rustc",
            "-p",
            "wgemma",
            "--lib",
            "--release",
            "--target",
            "wasm32-unknown-unknown",
            "-Zbuild-std=std,panic_abort",
            "--crate-type",
            "cdylib",
        ])
        // Debian's cargo and rustc only: the rustup proxies must not step in.
        .env("PATH", "/usr/bin:/bin")
        .env("RUSTC", &rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", &lld)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .status()
        .map_err(|e| format!("running {cargo}: {e}"))?;
    if !status.success() {
        return Err("the wasm32 build failed".into());
    }
    let want = locked_bindgen_version(root)?;
    let have = output(Command::new("wasm-bindgen").arg("--version")).map_err(|e| {
        format!("{e}\ninstall it with: cargo install wasm-bindgen-cli --version {want}")
    })?;
    if have.split_whitespace().nth(1) != Some(want.as_str()) {
        return Err(format!(
            "{have} does not match the wasm-bindgen {want} in Cargo.lock: \
             cargo install wasm-bindgen-cli --version {want} --force"
        )
        .into());
    }
    let pkg = root.join("web/pkg");
    output(
        Command::new("wasm-bindgen")
            .args(["--target", "web", "--out-name", "wgemma", "--out-dir"])
            .arg(&pkg)
            .arg(target_dir.join("wasm32-unknown-unknown/release/wgemma.wasm")),
    )?;
    Ok(pkg.join("wgemma_bg.wasm"))
}
