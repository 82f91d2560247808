#!/usr/bin/env bash
# Installs what wgemma needs on Debian 12 beside the Rust toolchain: a Vulkan driver (Mesa's
# lavapipe, so it runs on machines without a GPU; a real GPU driver is used when present) and
# the Vulkan loader. Idempotent; skips apt when everything is already installed.
set -euo pipefail
"$(dirname "$0")/apt-install-missing.sh" mesa-vulkan-drivers libvulkan1 vulkan-tools
