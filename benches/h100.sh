#!/usr/bin/env bash
# One device call on the lent H100: our kernel benchmarks and end-to-end runs next to
# llama.cpp's llama-bench (CUDA, built here in the background) on the same GGUF files.
#
# Prepare on the dev machine (x86_64), then call the device tool with
#   carry: [".gl", ".dev"]   command: bash benches/h100.sh
#   - .gl/: the Vulkan loader debs (../shared/ENVIRONMENT.md)
#   - .dev/xtask and .dev/kernels: `cargo build --release -p xtask` and
#     `cargo bench -p wgemma-benches --bench kernels --no-run`, stripped
#   - .dev/llama.tar.xz: llama.cpp from the llama-cpp-python 0.3.36 sdist, trimmed to
#     ggml (cpu, cuda), src, common, vendor, tools/llama-bench and tools/quantize
# Results land in $OUT.
set -u
OUT=${OUT:-/tmp/wgemma-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if [ -z "${SKIP_LLAMA:-}" ]; then (
  mkdir -p /tmp/ll && tar xJf .dev/llama.tar.xz -C /tmp/ll && cd /tmp/ll/lltrim &&
  cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF &&
  cmake --build build -j16 --target llama-bench
) > "$OUT/llama-build.log" 2>&1 & fi
build=${!:-}

chmod +x .dev/xtask .dev/kernels
.dev/xtask synth /tmp/gemma3-270m.gguf --preset gemma3-270m
.dev/xtask bench-e2e --model /tmp/gemma3-270m.gguf --profile 2> "$OUT/e2e-270m-profile.txt" | tee "$OUT/e2e-270m.txt"
.dev/kernels --bench --warm-up-time 0.3 --measurement-time 1 ${BENCH_FILTER:-} > "$OUT/kernels.txt" 2>&1
grep -E "^(matvec|attention)|thrpt" "$OUT/kernels.txt" | paste - - | head -60

[ -n "${SKIP_LLAMA:-}" ] && exit 0
wait $build
tail -2 "$OUT/llama-build.log"
for m in /tmp/gemma3-270m.gguf; do
  /tmp/ll/lltrim/build/bin/llama-bench -m "$m" -ngl 99 -p 512 -n 128 -r 3 -fa 0,1 | tee -a "$OUT/llama-bench.txt"
done
