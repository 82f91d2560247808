#!/usr/bin/env bash
# The lent H100, in two device calls: our kernel benchmarks and end-to-end runs next to
# llama.cpp's llama-bench (CUDA, built there) on the same GGUF files, plus the regeneration of
# the tiny Gemma 4 E2B fixture (needs torch + transformers, which only that machine has).
#
# Prepare on the dev machine (x86_64):
#   - .gl/: the Vulkan loader debs (../shared/ENVIRONMENT.md)
#   - .dev/xtask: `cargo build --release -p xtask`
#   - .dev/kernels: `cargo bench -p wgemma-benches --bench kernels --no-run` (the binary)
#   - .dev/parity: `cargo test -p wgemma-kernels --test parity --release --no-run` (the binary)
#   - .dev/pydeps: the diskcache wheel unpacked (the llama_cpp bindings import it)
#   - .dev/llama.tar.xz: llama.cpp from the llama-cpp-python 0.3.36 sdist, trimmed to
#     CMakeLists.txt cmake common conversion convert_hf_to_gguf.py ggml (cpu, cuda) gguf-py
#     include src vendor tools/{llama-bench,quantize,tokenize}, plus the sdist's llama_cpp/
#     package as llama_cpp_py/ (see benches/RESULTS.md for the exact commands)
# then call the device tool twice, back to back (the machine is given back when idle):
#   carry [".gl", ".dev"], command `bash benches/h100.sh start`   (builds start, our runs;
#                                   `ours` alone skips llama.cpp, `tests` runs the parity tests)
#   carry [".gl", ".dev"], command `bash benches/h100.sh finish`  (fixtures, llama-bench)
# Results land in $OUT; the models and builds stay in target/h100 between the two calls.
set -u
OUT=${OUT:-/tmp/wgemma-out}
W=$PWD/target/h100
mkdir -p "$OUT" "$W/models"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
chmod +x .dev/xtask .dev/kernels .dev/parity
MODELS=${MODELS:-"gemma3-270m e2b e4b"}
LL=$W/ll/lltrim
CMAKE_COMMON="-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
CMAKE_COMMON+=" -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_HTML=OFF"

builds() {
  rm -rf "$W/ll" "$W"/*.done && mkdir -p "$W/ll" && tar xJf .dev/llama.tar.xz -C "$W/ll"
  # llama.cpp with CUDA for llama-bench, and a CPU build (shared libraries, llama-tokenize)
  # for the fixture script; both in the background, detached so they outlive this call.
  setsid nohup bash -c "cd $LL && cmake -B build-cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 $CMAKE_COMMON \
    && cmake --build build-cuda -j12 --target llama-bench && touch $W/cuda.done" > "$W/llama-cuda-build.log" 2>&1 &
  echo $! > "$W/cuda.pid"
  setsid nohup bash -c "cd $LL && cmake -B build -DGGML_NATIVE=ON $CMAKE_COMMON \
    && cmake --build build -j4 --target llama llama-tokenize && touch $W/cpu.done" > "$W/llama-cpu-build.log" 2>&1 &
  echo $! > "$W/cpu.pid"
}

start() {
  builds
  ours
}

# The kernels' GPU-vs-CPU parity tests on this GPU (CI runs them on lavapipe).
tests() {
  CI=true WGEMMA_EXPECT_COOP=1 .dev/parity 2>&1 | tail -n 25 | tee "$OUT/parity.txt"
}

# Our side alone: synthetic models, end-to-end runs, kernel benchmarks.
ours() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  for m in $MODELS; do
    .dev/xtask synth "$W/models/$m.gguf" --preset "$m" 2>&1 | tee -a "$OUT/synth.txt"
  done
  for m in $MODELS; do
    .dev/xtask bench-e2e --model "$W/models/$m.gguf" | tee "$OUT/e2e-$m.txt"
  done
  .dev/xtask bench-e2e --model "$W/models/e2b.gguf" --reps 1 --profile --profile-each 2> "$OUT/e2e-e2b-profile.txt" > /dev/null
  .dev/kernels --bench --warm-up-time 0.3 --measurement-time 1 ${BENCH_FILTER:-} > "$OUT/kernels.txt" 2>&1
  python3 benches/summarize.py "$OUT/kernels.txt" | tee "$OUT/kernels-summary.txt"
}

finish() {
  python3 -c "import sys, torch, transformers, tokenizers, numpy; print(sys.version.split()[0], torch.__version__, transformers.__version__)" 2>&1 | tee "$OUT/python.txt"
  while kill -0 "$(cat "$W/cpu.pid")" 2> /dev/null; do sleep 5; done
  tail -n 3 "$W/llama-cpu-build.log"
  if [ -e "$W/cpu.done" ]; then
    # Pure-Python dependencies of the llama_cpp bindings that machine lacks (diskcache).
    cp -r .dev/pydeps/. "$LL/llama_cpp_py/"
    python3 xtask/scripts/gemma4_tiny_fixtures.py --llama-cpp "$LL" --llama-cpp-py "$LL/llama_cpp_py" --only e2b \
      > "$OUT/fixtures.log" 2>&1
    tail -n 5 "$OUT/fixtures.log"
    mkdir -p "$OUT/fixtures"
    cp crates/gemma4-text/tests/fixtures/gemma4_tiny_e2b.gguf crates/gemma4-text/tests/golden/gemma4_tiny_e2b.json \
      crates/gemma4-text/tests/golden/gemma4_tiny_tokenizer.json "$OUT/fixtures/"
  fi
  while kill -0 "$(cat "$W/cuda.pid")" 2> /dev/null; do sleep 5; done
  tail -n 3 "$W/llama-cuda-build.log"
  for m in $MODELS; do
    "$LL/build-cuda/bin/llama-bench" -m "$W/models/$m.gguf" -ngl 99 -p 512 -n 128 -r 3 -fa 0,1 2>&1 \
      | tee -a "$OUT/llama-bench.txt"
  done
}

# The 26B-A4B mixture of experts at full size (15 GiB), both engines, shorter runs.
moe() {
  builds
  .dev/xtask synth "$W/models/26b-a4b.gguf" --preset 26b-a4b 2>&1 | tee -a "$OUT/synth.txt"
  .dev/xtask bench-e2e --model "$W/models/26b-a4b.gguf" --prompt 128 --decode 64 --reps 2 | tee "$OUT/e2e-26b-a4b.txt"
  while kill -0 "$(cat "$W/cuda.pid")" 2> /dev/null; do sleep 5; done
  tail -n 2 "$W/llama-cuda-build.log"
  "$LL/build-cuda/bin/llama-bench" -m "$W/models/26b-a4b.gguf" -ngl 99 -p 128 -n 64 -r 2 2>&1 | tee "$OUT/llama-bench-26b.txt"
}

for step in "$@"; do "$step"; done
