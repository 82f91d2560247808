#!/usr/bin/env bash
# Installs what wgemma needs on Debian 12 beside the Rust toolchain: a Vulkan driver (Mesa's
# lavapipe, so it runs on machines without a GPU; a real GPU driver is used when present) and
# the Vulkan loader. Idempotent; skips apt when everything is already installed.
set -euo pipefail
pkgs=(mesa-vulkan-drivers libvulkan1 vulkan-tools)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
