#!/usr/bin/env bash
# Prepares, on the x86_64 dev machine, what benches/h100.sh carries to the lent H100:
#   .gl/    the Vulkan loader debs (the device machine has the NVIDIA driver but no loader)
#   .dev/   our release binaries (xtask, the kernel parity tests, the kernel benchmarks, the
#           vision and audio towers' tests) and
#           llama.cpp's source from the llama-cpp-python 0.3.36 sdist, trimmed to what
#           llama-bench and llama-mtmd-cli (CUDA), llama-quantize, llama-tokenize and the
#           converter need (.dev/llama.tar.xz), plus the sdist's Python bindings
#           (llama_cpp_py/) and diskcache, which they import, for the fixture script.
# Both folders are ignored by git (.git/info/exclude). Then, on the device (see h100.sh):
#   carry [".gl", ".dev"], command `bash benches/h100.sh all`
# Idempotent: a step whose output exists is skipped (delete it to redo it); a llama.tar.xz
# without tools/mtmd is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.gl/ /.dev/; do
  grep -qx "$d" .git/info/exclude 2> /dev/null || echo "$d" >> .git/info/exclude
done
mkdir -p .gl .dev

if ! ls .gl/libvulkan1_*.deb > /dev/null 2>&1; then
  lists=$(mktemp -d) && mkdir -p "$lists/partial"
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
  apt-get "${o[@]}" update > /dev/null
  (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi

cargo build --release -p xtask
cp target/release/xtask .dev/xtask
# The test and bench harnesses: cargo prints where each executable went.
exe() { cargo "$@" --message-format=json 2> /dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -n 1; }
cp "$(exe test -p wgemma-kernels --test parity --release --no-run)" .dev/parity
cp "$(exe bench -p wgemma-benches --bench kernels --no-run)" .dev/kernels
cp "$(exe test -p wgemma-vision --test tower --release --no-run)" .dev/vision-tower
cp "$(exe test -p wgemma --test vision --release --no-run)" .dev/vision-runtime
cp "$(exe test -p wgemma-audio --test tower --release --no-run)" .dev/audio-tower
cp "$(exe test -p wgemma --test audio --release --no-run)" .dev/audio-runtime
strip .dev/xtask .dev/parity .dev/kernels .dev/vision-tower .dev/vision-runtime .dev/audio-*
# The xtask compressed (13 MB -> 4 MB) for calls that carry Node and Dawn too; h100.sh unpacks
# any .dev/*.xz whose binary did not travel.
xz -9 -T0 -c .dev/xtask > .dev/xtask.xz
# Node.js and the webgpu package (Dawn for Node) for `h100.sh dawn`: the lent machine has no
# Node, and carries at most 64 MiB.
[ -f .dev/node.xz ] || xz -9 -T0 -c "$(command -v node)" > .dev/node.xz
if [ ! -f .dev/dawn.tar.xz ]; then
  (cd web/dawn && npm ci --no-audit --no-fund > /dev/null)
  # linux-x64's dawn.node only (the package ships every platform's).
  tar cJf .dev/dawn.tar.xz -C web/dawn --exclude='node_modules/webgpu/dist/darwin-*' \
    --exclude='node_modules/webgpu/dist/win32-*' --exclude='node_modules/webgpu/dist/linux-arm64' \
    node_modules
fi
# BASE=REV: also the xtask of that revision (.dev/xtask-base), for `h100.sh base` to measure
# the change against in the same call. Built from a worktree into the same target folder.
if [ -n "${BASE:-}" ]; then
  rm -rf target/base-src && git worktree prune
  git worktree add --detach target/base-src "$BASE"
  cargo build --release -p xtask --manifest-path target/base-src/Cargo.toml --target-dir target/base
  cp target/base/release/xtask .dev/xtask-base && strip .dev/xtask-base
  git worktree remove --force target/base-src
fi

# grep without -q reads tar's whole listing (no SIGPIPE under pipefail).
if ! tar tJf .dev/llama.tar.xz 2> /dev/null | grep lltrim/tools/batched-bench/ > /dev/null; then
  work=$(mktemp -d)
  # pip builds an sdist's metadata before saving it: scikit-build-core and cmake let it.
  python3 -m pip install --quiet scikit-build-core cmake
  python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
    -d "$work" llama-cpp-python==0.3.36
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$work" diskcache
  tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
  src=$work/llama_cpp_python-0.3.36
  t=$work/lltrim && mkdir -p "$t/tools" "$t/ggml/src"
  ll=$src/vendor/llama.cpp
  cp -r "$ll"/{CMakeLists.txt,cmake,common,conversion,convert_hf_to_gguf.py,gguf-py,include,src,vendor} "$t/"
  cp -r "$ll"/ggml/{CMakeLists.txt,cmake,include} "$t/ggml/"
  cp "$ll"/ggml/src/*.* "$t/ggml/src/"
  cp -r "$ll"/ggml/src/{ggml-cpu,ggml-cuda} "$t/ggml/src/"
  cp -r "$ll"/tools/{llama-bench,batched-bench,quantize,tokenize,mtmd} "$t/tools/"
  # mtmd without its sample media (test-*.jpeg/mp3/mp4), tests and Python converters.
  rm -rf "$t"/tools/mtmd/{test-*,tests,legacy-models}
  # Only the tools kept here.
  grep -v 'add_subdirectory' "$ll/tools/CMakeLists.txt" > "$t/tools/CMakeLists.txt"
  printf 'add_subdirectory(%s)\n' llama-bench batched-bench quantize tokenize mtmd >> "$t/tools/CMakeLists.txt"
  cp -r "$src/llama_cpp" "$t/llama_cpp_py"
  (cd "$t/llama_cpp_py" && python3 -m zipfile -e "$work"/diskcache-*.whl .)
  tar cJf .dev/llama.tar.xz -C "$work" lltrim
  rm -rf "$work"
fi

# DiffusionGemma's llama.cpp: the PR 24423 branch (its last DiffusionGemma commit in the
# unslothai/llama.cpp fork, where the branch lives), trimmed to what llama-diffusion-cli
# (CUDA) needs: .dev/llama-dg.tar.xz. DG_LLAMA is a clone or mirror of that fork (the `fetch`
# tool leaves one in /work/.mirror).
DG_LLAMA=${DG_LLAMA:-/work/.mirror/unslothai+llama.cpp/repo}
DG_COMMIT=73d820aff
if [ ! -f .dev/llama-dg.tar.xz ] && git -C "$DG_LLAMA" cat-file -e "$DG_COMMIT" 2> /dev/null; then
  work=$(mktemp -d) && t=$work/lldg && mkdir -p "$t"
  git -C "$DG_LLAMA" archive "$DG_COMMIT" CMakeLists.txt cmake common include src vendor pocs \
    ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src licenses LICENSE \
    examples/CMakeLists.txt examples/diffusion | tar x -C "$t"
  # Only the CPU and CUDA backends, only the diffusion example.
  (cd "$t/ggml/src" && for b in ggml-*/; do case $b in ggml-cpu/|ggml-cuda/) ;; *) rm -rf "$b" ;; esac; done)
  printf 'add_subdirectory(diffusion)\n' > "$t/examples/CMakeLists.txt"
  echo "$DG_COMMIT" > "$t/COMMIT"
  tar cJf .dev/llama-dg.tar.xz -C "$work" lldg
  rm -rf "$work"
fi
# llama-server (and llama-batched-bench beside it) from the same tree: the llama-cpp-python
# sdist has no server source, so the fork's commit above stands in for llama.cpp (its server and
# text path are upstream's of that date). Without the web UI (no npm, no download there):
# .dev/llama-server.tar.xz.
if [ ! -f .dev/llama-server.tar.xz ] && git -C "$DG_LLAMA" cat-file -e "$DG_COMMIT" 2> /dev/null; then
  work=$(mktemp -d) && t=$work/llsrv && mkdir -p "$t"
  git -C "$DG_LLAMA" archive "$DG_COMMIT" CMakeLists.txt cmake common include src vendor \
    ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src licenses LICENSE scripts/ui-assets.cmake \
    tools/server tools/ui/CMakeLists.txt tools/ui/embed.cpp tools/mtmd tools/batched-bench \
    | tar x -C "$t"
  (cd "$t/ggml/src" && for b in ggml-*/; do case $b in ggml-cpu/|ggml-cuda/) ;; *) rm -rf "$b" ;; esac; done)
  rm -rf "$t"/tools/server/{tests,bench} "$t"/tools/mtmd/{test-*,tests,legacy-models}
  printf 'add_subdirectory(%s)\n' ui server mtmd batched-bench > "$t/tools/CMakeLists.txt"
  echo "$DG_COMMIT" > "$t/COMMIT"
  tar cJf .dev/llama-server.tar.xz -C "$work" llsrv
  rm -rf "$work"
fi
du -sh .gl .dev
