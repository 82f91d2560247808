#!/usr/bin/env bash
# Installs what the browser build and test need on Debian 12: the wasm-capable Rust toolchain
# (rustc-web + rust-web-src; build-std, see xtask/src/wasm.rs), Chromium (WebGPU on
# SwiftShader), Node.js for the Playwright driver, and wasm-bindgen-cli at the version
# Cargo.lock pins. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(rustc-web rust-web-src cargo-web chromium)
command -v node >/dev/null && command -v npm >/dev/null || pkgs+=(nodejs npm)
scripts/apt-install-missing.sh "${pkgs[@]}"
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [ "$have" != "$want" ]; then
  cargo install --quiet wasm-bindgen-cli --version "$want" --force
fi
