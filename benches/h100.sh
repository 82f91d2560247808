#!/usr/bin/env bash
# The lent H100: our end-to-end runs next to llama.cpp's llama-bench (CUDA, built there) on
# the same GGUF files, one table; the kernel parity tests; the kernel benchmarks; the
# regeneration of the tiny Gemma 4 E2B fixture (needs torch + transformers, which only that
# machine has).
#
# Prepare here (x86_64): `bash benches/prepare-h100.sh` fills .gl/ (the Vulkan loader debs)
# and .dev/ (our release binaries, llama.cpp's trimmed source). Then one device call:
#   carry [".gl", ".dev"], command `bash benches/h100.sh all`
# which builds llama-bench and llama-mtmd-cli (llama.cpp's vision encoder, to time against
# ours: $LL/build-cuda/bin/llama-mtmd-cli) with CUDA in the background, runs the parity
# tests and our bench-e2e on synthetic Gemma 3 270M, Gemma 4 E2B and E4B models (`cargo
# xtask synth`), then llama-bench on the same files, and prints the table
# (benches/table.py): 286-292 s of the call's 600 on the H100 (`all moe`: 356 s; both
# timed before llama-mtmd-cli joined the build). Should it run long, the same in two calls
# back to back: `build_cuda tests ours`, then `llama table`. Other steps, in one call
# or several back to back (the models and builds stay in target/h100 while the machine is
# held):
#   tests      the kernel parity tests (CI runs them on lavapipe), tensor cores required
#   ours       our side alone (+ the E2B decode profile), no llama.cpp
#   kernels    the criterion kernel benchmarks (BENCH_FILTER narrows them)
#   moe        Gemma 4 26B-A4B (15 GiB) with both engines, shorter runs, its own table
#              (ours_moe: our side alone)
#   base, base_moe   the same end-to-end runs with .dev/xtask-base (the revision a change is
#              measured against: `BASE=REV bash benches/prepare-h100.sh`), into tables
#              named base-M; run them in the call that runs `ours` / `moe`
#   start, finish   the CUDA and CPU builds + ours, then the tiny E2B fixture + llama-bench
#   adapters   bench-e2e with a random adapter on every projection (ranks RANKS, default
#              "0 16 64"; 0: none), ours and .dev/xtask-base side by side, one table
#   vision     transformers' image preprocessing goldens (xtask/scripts/gemma4_image_golden.py)
#   vision_golden   tiny random Gemma 4 models with a vision tower, converted with llama.cpp's
#              converter, and transformers' tower outputs and logits on test images
#              (xtask/scripts/gemma4_vision_golden.py; transformers 5.23 from .dev/ if its
#              wheel is there), as $OUT/vision-golden.tgz
#   audio_golden   a tiny random Gemma 4 model with an audio tower, converted with llama.cpp's
#              converter, and transformers' tower intermediates, soft tokens and teacher-forced
#              logits on crates/gemma4-audio/tests/fixtures/a16k.wav
#              (xtask/scripts/gemma4_audio_golden.py; carry [".dev"] for the transformers 5.23
#              wheel and llama.cpp's source), as $OUT/audio-golden.tgz; the log in
#              $OUT/audio-golden.log, its summary tail in $OUT/audio-golden.txt
#   vision_bench   the E2B vision tower (synthetic, f16 mmproj) on a 1008x624 image (273
#              soft tokens at the 280 budget) and a 1920x1344 one (1120 at 1120): our
#              preprocessing, encode and time to first token of the image + a 20-word question
#              (cargo xtask bench-vision), then llama.cpp's llama-mtmd-cli (CUDA) on the same
#              files; $OUT/vision-bench/ and a table in $OUT/vision-bench.md
#   vision_ours   vision_bench's side of ours alone (no llama.cpp build); vision_base the
#              same with .dev/xtask-base, after it in the same call
#   vision_ab  the image attention's kernel benchmarks, then vision_runs of one binary under
#              each of AB_ENVS ("name:VAR=V,VAR2=V2 name2:"; default: one run as it is)
#   vision_tests  the vision tower against transformers' goldens, and image prompts'
#              teacher-forced argmax, with this GPU's kernels (.dev/vision-tower, -runtime)
#   audio_tests   the audio tower against transformers' goldens and the CPU reference, and
#              audio prompts' teacher-forced argmax, with this GPU's kernels (.dev/audio-tower,
#              .dev/audio-runtime)
#   audio_bench   the E2B audio tower (synthetic, f16 mmproj) on a 30 s clip (750 soft
#              tokens): our features, encode and time to first token of the clip + a short
#              question (cargo xtask bench-audio), then llama.cpp's llama-mtmd-cli (CUDA) on the
#              same files; $OUT/audio-bench/ and a table in $OUT/audio-bench.md
#   audio_ours    audio_bench's side of ours alone (no llama.cpp build); audio_split the
#              encode with and without products split over k, in one call
#   coop_sweep the tiles of the products on tensor cores (WGEMMA_COOP_TILE, TILES): parity,
#              kernel benchmarks, E2B prefill, the vision and audio towers, one tile at a time
#   coop_check this revision's parity tests (tiles by shape and forced), product and image
#              attention benchmarks, E2B prefill, vision and audio towers
#   coop_compare   this revision against .dev/xtask-base: E2E on MODELS, vision, audio
#   batch      aggregate decode of 1, 4, 16 and 64 sequences stepped together (cargo xtask
#              bench-batch: 512-token prompts, 128 generated each) on BATCH_MODELS (default
#              "e2b"), then llama.cpp's llama-batched-bench (CUDA) on the same files and
#              lengths; $OUT/batch/ and a table in $OUT/batch.md
#   serve      HTTP serving: cargo xtask bench-serve against our server (in its process) and
#              against llama-server (CUDA, -np 64, built from .dev/llama-server.tar.xz with
#              llama-batched-bench), SERVE_MODEL (default e2b), 512-token prompts, 256 generated
#              per stream, at SERVE_CONCURRENCY (default 1,4,16,64) streams at once
#              (SERVE_LLAMA_ARGS: more llama-server flags); then
#              bench-batch and llama-batched-bench of the same build on BATCH_MODELS;
#              $OUT/serve/, a table in $OUT/serve.md (and $OUT/batch.md). Carry [".gl",
#              ".dev/xtask.xz", ".dev/llama-server.tar.xz"].
#   few_ab     batched decode (bench-batch, E2B, 2/4/8/16 sequences) with the few-token
#              kernel off (WGEMMA_FEW_TOKENS=0), up to 8 and up to 16 tokens, one binary, and
#              the kernel profile at 8; $OUT/few/ and $OUT/few.md. Starts build_srv first.
#   few_sweep  the few-token kernel's lanes a row and rows a group (WGEMMA_FEW_TUNING), one
#              binary, bench-batch on E2B at 3, 4 and 8 sequences; $OUT/few/sweep.md.
#              FEW_TUNINGS: the shapes ("-": the default, "-b" again; "noresid": rule
#              residual_prologue off; "NAME:VAR=V": a run named NAME with that environment)
#   e2e_ab     bench-e2e of this build against .dev/xtask-base on MODELS, interleaved;
#              $OUT/e2e_ab.txt. Carry [".gl", ".dev/xtask.xz", ".dev/xtask-base.xz"].
#   batch_ab   batched decode of this build against .dev/xtask-base, interleaved twice
#              (bench-batch, E2B, AB_SEQS, default 3,4,8,16); $OUT/abb/sweep.md. Carry
#              [".gl", ".dev/xtask.xz", ".dev/xtask-base.xz"].
#   depth_ab   batched decode with steps queued ahead of the readback (bench-batch --depth)
#              against one step at a time, E2B with its per-layer table read on the CPU (depth
#              1 and 2, its most) and on the GPU (1 and 2), one binary, interleaved twice at
#              DEPTH_SEQS (default 1,4,16,64);
#              $OUT/depth/sweep.md. Carry [".gl", ".dev/xtask.xz"].
#   split_sweep  batched decode at 9-64 rows under the split over k's target (WGEMMA_SPLIT)
#              and 16-token tiles (WGEMMA_COOP_TILE=16), one binary; $OUT/split/sweep.md.
#              Carry [".gl", ".dev/xtask.xz", ".dev/parity.xz"].
#   shader_stats  the Vulkan driver's statistics (registers a thread, shared memory; robust
#              buffer access on, as wgpu builds pipelines, and off) of every kernel a 1,120-token
#              vision encode and E2B's prefill and decode compile (natively and under the
#              browser's constraints), and of the image attention's
#              untimed forms (ATTN_VARIANTS) (WGEMMA_DUMP_SPIRV, then cargo xtask
#              shader-stats); $OUT/shader-stats.txt (STATS_E2E=0: the vision tower's
#              kernels only). Carry [".gl", ".dev/xtask.xz"].
#   attn_ab    the image attention's untimed forms (ATTN_VARIANTS: "name:VAR=V,VAR2=V2 ...",
#              default every WGEMMA_ATTEND_* switch alone and in a few sets): the attention
#              parity tests as they are, with all but BLOCK64 on, with K_AHEAD and BLOCK64
#              alone, then
#              bench-vision at 1,120 tokens under
#              each, one binary, interleaved twice (ATTN_ROUNDS); $OUT/vision-bench/attn-*.json. Carry
#              [".gl", ".dev/xtask.xz", ".dev/parity.xz"].
#   lora       the PEFT LoRA goldens of the tiny E2B fixture (xtask/scripts/gemma4_lora_golden.py)
#   diffusion  DiffusionGemma 26B-A4B (synthetic, Q4_K_M, 16 GiB): ms a denoising step of a
#              256-token canvas after a 512-token prompt, ours (cargo xtask bench-diffusion)
#              and llama.cpp PR 24423's llama-diffusion-cli (CUDA, built from
#              .dev/llama-dg.tar.xz) on the same file; $OUT/diffusion/ and a table in
#              $OUT/diffusion.md. llama.cpp prints no step time for this sampler: it is timed
#              as the difference of two whole runs, DG_STEPS_LONG and DG_STEPS_SHORT steps
#              (default 48 and 8; the stop rule off), over their difference. Carry
#              [".gl", ".dev/xtask", ".dev/llama-dg.tar.xz"]. If one call cannot hold it all:
#              `diffusion_start` (build, model, ours), then `diffusion_finish`.
#   dg_prof    our DiffusionGemma step alone with every dispatch timed, under DG_ENVS
#              (environment variants); $OUT/dgprof/. Carry [".gl", ".dev/xtask.xz"].
#   ab         one binary under AB_ENVS (default: the prefill attention on cooperative matrices
#              off and on): the DiffusionGemma step and bench-e2e of AB_MODELS; $OUT/ab/.
#   dawn       the browser's engine on this GPU: web/pkg through web/wgemma.js in Node on Dawn
#              (cargo xtask dawn-bench) next to native bench-e2e, on MODELS, 512-token prompts,
#              128 generated (E2B and E4B also with the per-layer table fetched by rows);
#              $OUT/dawn/ and a table in $OUT/dawn.md. Carry [".gl", ".dev/xtask.xz",
#              ".dev/node.xz", ".dev/dawn.tar.xz", "web/pkg"] (prepare-h100.sh packs them).
#   dawnprof   Dawn's per-kernel GPU times and Node's CPU profile of the engine, and a run with
#              Dawn's robustness off ($OUT/dawnprof-M.txt); DAWNPROF_MODELS.
#   dawn_only  wasm + Dawn alone on MODELS, one timed run each, $OUT/dawn_only.txt.
#   dawntoggles Dawn's per-kernel GPU times of E2B under each of DAWN_TOGGLES (default: none,
#              disable_robustness, disable_workgroup_init), $OUT/dawntoggles.txt.
#   dawn_sgmat the browser's tiled products on Dawn's subgroup matrices: what the adapter offers
#              (plain, with Dawn's unsafe APIs, and also with its f16 toggle for NVIDIA), a
#              tiny model's products on them against the f32 tiles (dawn-check), then
#              on MODELS native bench-e2e against dawn-bench under each of those flags (the
#              engine takes f16 subgroup matrices where Dawn offers them with shader-f16),
#              512-token prompts, $OUT/dawn_sgmat.txt. Carry as for `dawn`.
#   env_ab     one binary without and with the switches AB_ENV, under BASE_ENV, interleaved
#              twice (bench-e2e on AB_MODEL, default e2b, 512-token prompt), then the prefill
#              profiles; $OUT/env_ab.txt.
#   envs_ab    one binary under BASE_ENV and each of AB_ENVS ("name:VAR=V,VAR2=V2 name2:"),
#              interleaved twice (bench-e2e on AB_MODELS, default e2b), then the prefill
#              profiles; $OUT/envs_ab.txt.
#   pkg_ab     the page's engine on Dawn from two wasm packages (.dev/pkg-old.tar.xz,
#              .dev/pkg-new.tar.xz), interleaved twice, PKG_MODELS; $OUT/pkg_ab.txt.
#   prefill_ab the browser's f32 prefill product of this build against .dev/xtask-base's
#              (natively under the browser's constraints), then wasm + Dawn; E2B.
#   browserlike native bench-e2e under the browser's constraints (WGEMMA_NO_F16, NO_COOP,
#              WEBGPU_LIMITS), without and with subgroups, with kernel profiles; BROWSERLIKE_MODELS.
# Results land in $OUT and, after each step, in target/h100/results, where the table reads
# them: each device call gets an empty $OUT, so a table made in a later call on the same
# machine (while it is held) still sees the earlier calls' runs.
set -u
OUT=${OUT:-/tmp/wgemma-out}
W=$PWD/target/h100
R=$W/results
mkdir -p "$OUT" "$W/models" "$R"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# Binaries may travel xz-compressed to fit the 64 MiB a call carries.
for z in .dev/*.xz; do
  case $z in *node.xz | *.tar.xz) continue ;; esac
  [ -e "$z" ] || continue
  [ -e "${z%.xz}" ] || xz -dc "$z" > "${z%.xz}"
done
chmod +x .dev/xtask* .dev/kernels .dev/parity .dev/vision-* .dev/audio-*
MODELS=${MODELS:-"gemma3-270m e2b e4b"}
LL=$W/ll/lltrim
CMAKE_COMMON="-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
CMAKE_COMMON+=" -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_HTML=OFF"

unpack() {
  [ -d "$LL" ] || { mkdir -p "$W/ll" && tar xJf .dev/llama.tar.xz -C "$W/ll"; }
}

# llama.cpp with CUDA for llama-bench and llama-mtmd-cli, in the background, detached so it
# outlives this call.
build_cuda() {
  unpack
  [ -e "$W/cuda.done" ] && return
  # Already building (a call before this one on the same machine started it).
  [ -f "$W/cuda.pid" ] && kill -0 "$(cat "$W/cuda.pid")" 2> /dev/null && return
  setsid nohup bash -c "cd $LL && cmake -B build-cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 $CMAKE_COMMON \
    && cmake --build build-cuda -j14 --target ${CUDA_TARGETS:-llama-bench llama-batched-bench llama-mtmd-cli} && touch $W/cuda.done" > "$W/llama-cuda-build.log" 2>&1 &
  echo $! > "$W/cuda.pid"
}

# A CPU build (shared libraries, llama-tokenize) for the fixture script, likewise.
build_cpu() {
  unpack
  [ -e "$W/cpu.done" ] && return
  setsid nohup bash -c "cd $LL && cmake -B build -DGGML_NATIVE=ON $CMAKE_COMMON \
    && cmake --build build -j4 --target llama llama-tokenize && touch $W/cpu.done" > "$W/llama-cpu-build.log" 2>&1 &
  echo $! > "$W/cpu.pid"
}

wait_for() {
  while kill -0 "$(cat "$W/$1.pid")" 2> /dev/null; do sleep 5; done
  tail -n 2 "$W/llama-$1-build.log"
}

synth() {
  for m in "$@"; do
    [ -f "$W/models/$m.gguf" ] || .dev/xtask synth "$W/models/$m.gguf" --preset "$m" 2>&1 | tee -a "$OUT/synth.txt"
  done
}

# The kernels' GPU-vs-CPU parity tests on this GPU (CI runs them on lavapipe), and the
# pinned dispatch sequences of the synthetic presets against this GPU's plans.
tests() {
  CI=true WGEMMA_EXPECT_COOP=1 .dev/parity 2>&1 | tail -n 25 | tee "$OUT/parity.txt"
  .dev/xtask plans 2>&1 | tee "$OUT/plans.txt"
}

# Our side alone: synthetic models, end-to-end runs (one JSON line each; E2E_ARGS adds
# bench-e2e arguments, e.g. "--reps 3"), the E2B decode step's profile.
ours() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  synth $MODELS
  for m in $MODELS; do
    .dev/xtask bench-e2e --model "$W/models/$m.gguf" --json ${E2E_ARGS:-} | tee "$OUT/e2e-$m.json"
  done
  .dev/xtask bench-e2e --model "$W/models/e2b.gguf" --reps 1 --profile --profile-each 2> "$OUT/e2e-e2b-profile.txt" > /dev/null
}

# Our end-to-end runs with the base revision's xtask, as e2e-base-M.json.
base() {
  synth $MODELS
  for m in $MODELS; do
    .dev/xtask-base bench-e2e --model "$W/models/$m.gguf" --json ${E2E_ARGS:-} | tee "$OUT/e2e-base-$m.json"
  done
  print_table table-base $MODELS $(printf 'base-%s ' $MODELS)
}

base_moe() {
  synth 26b-a4b
  .dev/xtask-base bench-e2e --model "$W/models/26b-a4b.gguf" --prompt 128 --decode 64 --reps 3 --json | tee "$OUT/e2e-base-26b-a4b.json"
  print_table table-base-26b 26b-a4b base-26b-a4b
}

kernels() {
  .dev/kernels --bench --warm-up-time 0.3 --measurement-time 1 ${BENCH_FILTER:-} > "$OUT/kernels.txt" 2>&1
  python3 benches/summarize.py "$OUT/kernels.txt" | tee "$OUT/kernels-summary.txt"
}

# llama-bench on the same files: prompt 512, 128 decoded, flash attention off and on.
llama() {
  wait_for cuda
  for m in $MODELS; do
    "$LL/build-cuda/bin/llama-bench" -m "$W/models/$m.gguf" -ngl 99 -p 512 -n 128 -r 3 -fa 0,1 -o json \
      > "$OUT/llama-bench-$m.json" 2>> "$OUT/llama-bench.log"
  done
}

# One table (name.md) of the models given, from every run so far.
print_table() {
  local name=$1
  shift
  cp -a "$OUT"/. "$R"/
  python3 benches/table.py "$R" "$@" | tee "$OUT/$name.md"
}

table() {
  print_table table $MODELS
}

all() {
  build_cuda
  tests
  ours
  llama
  table
}

start() {
  build_cuda
  build_cpu
  ours
}

finish() {
  python3 -c "import sys, torch, transformers, tokenizers, numpy; print(sys.version.split()[0], torch.__version__, transformers.__version__)" 2>&1 | tee "$OUT/python.txt"
  wait_for cpu
  if [ -e "$W/cpu.done" ]; then
    python3 xtask/scripts/gemma4_tiny_fixtures.py --llama-cpp "$LL" --llama-cpp-py "$LL/llama_cpp_py" --only e2b \
      > "$OUT/fixtures.log" 2>&1
    tail -n 5 "$OUT/fixtures.log"
    mkdir -p "$OUT/fixtures"
    cp crates/gemma4-text/tests/fixtures/gemma4_tiny_e2b.gguf crates/gemma4-text/tests/golden/gemma4_tiny_e2b.json \
      crates/gemma4-text/tests/golden/gemma4_tiny_tokenizer.json "$OUT/fixtures/"
  fi
  llama
  table
}

# The PEFT LoRA goldens of the tiny E2B fixture (torch, transformers and peft are here), into
# $OUT/lora/ (each adapter's files as VARIANT.FILE).
lora() {
  python3 xtask/scripts/gemma4_lora_golden.py 2>&1 | tail -n 5 | tee "$OUT/lora.txt"
  mkdir -p "$OUT/lora"
  for v in lora rslora; do
    for f in crates/gemma4-text/tests/fixtures/gemma4_tiny_e2b_$v/*; do cp "$f" "$OUT/lora/$v.$(basename "$f")"; done
  done
  cp crates/gemma4-text/tests/golden/gemma4_tiny_e2b_lora.json "$OUT/lora/"
}

# What an adapter costs: each model without one and with one of each rank, ours and base.
adapters() {
  synth $MODELS
  mkdir -p "$OUT/adapters"
  for m in $MODELS; do
    for side in ours base; do
      x=.dev/xtask
      [ "$side" = base ] && x=.dev/xtask-base
      for r in ${RANKS:-0 16 64}; do
        lora=""
        [ "$r" != 0 ] && lora="--lora-rank $r"
        "$x" bench-e2e --model "$W/models/$m.gguf" --json --reps 3 --decode 256 $lora \
          > "$OUT/adapters/$m-$side-r$r.json"
      done
    done
  done
  python3 - "$OUT/adapters" <<'PY' | tee "$OUT/adapters.md"
import json, pathlib, sys
print("| model | side | rank | prefill tok/s | decode tok/s |")
print("| --- | --- | ---: | ---: | ---: |")
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    m, side, r = f.stem.rsplit("-", 2)
    j = json.loads(f.read_text().strip().splitlines()[-1])
    print(f"| {m} | {side} | {r[1:]} | {j['prefill_tok_s']:,.0f} | {j['decode_tok_s']:,.1f} |")
PY
}

# transformers' Gemma 4 image preprocessing of the test images: $OUT/vision/ (fixtures as
# fixture.NAME, goldens as golden.NAME).
vision() {
  python3 xtask/scripts/gemma4_image_golden.py 2>&1 | tail -n 20 | tee "$OUT/vision.txt"
  mkdir -p "$OUT/vision"
  for f in crates/gemma4-vision/tests/fixtures/*; do cp "$f" "$OUT/vision/fixture.$(basename "$f")"; done
  for f in crates/gemma4-vision/tests/golden/*; do cp "$f" "$OUT/vision/golden.$(basename "$f")"; done
}

vision_golden() {
  unpack
  for whl in .dev/transformers-*.whl; do
    [ -f "$whl" ] && python3 -m pip install --quiet --no-deps "$whl" 2>&1 | tail -n 3
  done
  python3 xtask/scripts/gemma4_vision_golden.py --llama-cpp "$LL" 2>&1 | tail -n 30 | tee "$OUT/vision-golden.txt"
  tar czf "$OUT/vision-golden.tgz" crates/gemma4-vision/tests/fixtures crates/gemma4-vision/tests/golden
}

audio_golden() {
  unpack
  for whl in .dev/transformers-*.whl; do
    [ -f "$whl" ] && python3 -m pip install --quiet --no-deps "$whl" 2>&1 | tail -n 3
  done
  python3 -u xtask/scripts/gemma4_audio_golden.py --llama-cpp "$LL" > "$OUT/audio-golden.log" 2>&1
  echo "exit status $?" >> "$OUT/audio-golden.log"
  tail -n 40 "$OUT/audio-golden.log" | tee "$OUT/audio-golden.txt"
  tar czf "$OUT/audio-golden.tgz" crates/gemma4-audio/tests/fixtures crates/gemma4-audio/tests/golden
}

# Our side of vision_bench alone, into $OUT/vision-bench/.
# The vision benches' two images, as PNG in $W/models.
bench_images() {
  python3 -c "
from PIL import Image
import numpy as np
for w, h in [(1008, 624), (1920, 1344)]:
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x ^ y) & 255], -1).astype(np.uint8)
    Image.fromarray(img).save('$W/models/img-%dx%d.png' % (w, h))
"
}
# The audio benches' clip: 30 s of a sweeping tone over a hum, 16-bit mono at 16 kHz (the
# standard library alone).
bench_clip() {
  python3 -c "
import math, struct, wave
w = wave.open('$W/models/clip-30s.wav', 'wb')
w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)
s = [int(9000 * math.sin(2 * math.pi * (300 + 40 * i / 16000) * i / 16000) + 3000 * math.sin(2 * math.pi * 97 * i / 16000)) for i in range(480000)]
w.writeframes(struct.pack('<%dh' % len(s), *s)); w.close()
"
}
# The tiles of the products on tensor cores (WGEMMA_COOP_TILE, each of TILES: 64, 128, or auto
# for the choice by shape): the products' parity tests, their kernel benchmarks (prefill and
# the towers' shapes), E2B's prefill, the vision tower at both budgets and the audio tower,
# each tile in turn, into $OUT/sweep-TILE-*.
coop_sweep() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  synth e2b e2b-mmproj e2b-audio-mmproj
  bench_images
  bench_clip
  local t
  for t in ${TILES:-auto 64 128}; do
    export WGEMMA_COOP_TILE=${t#auto}
    CI=true WGEMMA_EXPECT_COOP=1 .dev/parity matmul clamped 2>&1 | grep "test result" | tee "$OUT/sweep-$t-parity.txt"
    .dev/kernels --bench --warm-up-time 0.2 --measurement-time 0.4 'matmul512|matmul_towers' \
      > "$OUT/sweep-$t-kernels.txt" 2>&1
    python3 benches/summarize.py "$OUT/sweep-$t-kernels.txt" > "$OUT/sweep-$t-kernels-summary.txt"
    .dev/xtask bench-e2e --model "$W/models/e2b.gguf" --decode 8 --reps 5 --json > "$OUT/sweep-$t-e2e.json"
    tail -c 400 "$OUT/sweep-$t-e2e.json"; echo
    mkdir -p "$OUT/vision-bench" && vision_runs .dev/xtask "sweep-$t"
    .dev/xtask bench-audio --mmproj "$W/models/e2b-audio-mmproj.gguf" --model "$W/models/e2b.gguf" \
      --audio "$W/models/clip-30s.wav" --reps 5 --profile --json > "$OUT/sweep-$t-audio.json" 2> /dev/null
    tail -c 300 "$OUT/sweep-$t-audio.json"; echo
  done
  unset WGEMMA_COOP_TILE
}
# This revision's side after a kernel change: the parity tests with the tiles chosen by shape
# and with each tile forced, the kernel benchmarks of the products and the image attention,
# E2B's prefill, the vision tower at both budgets and the audio tower.
coop_check() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  synth e2b e2b-mmproj e2b-audio-mmproj
  bench_images
  bench_clip
  CI=true WGEMMA_EXPECT_COOP=1 .dev/parity 2>&1 | grep "test result\|FAILED\|panicked" | tee "$OUT/check-parity.txt"
  for t in 64 128; do
    WGEMMA_COOP_TILE=$t CI=true WGEMMA_EXPECT_COOP=1 .dev/parity matmul clamped 2>&1 | grep "test result" | tee -a "$OUT/check-parity.txt"
  done
  .dev/kernels --bench --warm-up-time 0.2 --measurement-time 0.4 'attend_image|matmul512|matmul_towers' \
    > "$OUT/check-kernels.txt" 2>&1
  python3 benches/summarize.py "$OUT/check-kernels.txt" | tee "$OUT/check-kernels-summary.txt"
  .dev/xtask bench-e2e --model "$W/models/e2b.gguf" --decode 8 --reps 5 --json > "$OUT/check-e2e.json"
  mkdir -p "$OUT/vision-bench" && vision_runs .dev/xtask check
  .dev/xtask bench-audio --mmproj "$W/models/e2b-audio-mmproj.gguf" --model "$W/models/e2b.gguf" \
    --audio "$W/models/clip-30s.wav" --reps 5 --profile --json > "$OUT/check-audio.json" 2> /dev/null
}
# This revision against .dev/xtask-base in one call, one run each, base first: bench-e2e on
# MODELS, the vision tower at both budgets and the audio tower; $OUT/pair-{base,ours}-*.
batch() {
  build_cuda
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  local B=$OUT/batch m
  local models=${BATCH_MODELS:-e2b} npl=${BATCH_SEQUENCES:-1,4,16,64}
  mkdir -p "$B"
  synth $models
  # Ours after the build, which would otherwise take the CPU that records our steps.
  wait_for cuda
  for m in $models; do
    .dev/xtask bench-batch --model "$W/models/$m.gguf" --sequences "$npl" --json --profile \
      > "$B/ours-$m.jsonl" 2> "$B/ours-$m.err"
  done
  for m in $models; do
    "$LL/build-cuda/bin/llama-batched-bench" -m "$W/models/$m.gguf" -ngl 99 -fa on -c 45000 \
      -b 2048 -ub 512 -npp 512 -ntg 128 -npl "$npl" --output-format jsonl \
      > "$B/llama-$m.jsonl" 2> "$B/llama-$m.err"
  done
  python3 benches/batch_table.py "$B" $models | tee "$OUT/batch.md"
}

# llama-server and llama-batched-bench with CUDA from .dev/llama-server.tar.xz, in the
# background (no web UI: that needs npm or a download).
build_srv() {
  local S=$W/llsrv
  [ -d "$S" ] || tar xJf .dev/llama-server.tar.xz -C "$W"
  [ -e "$W/srv.done" ] && return
  [ -f "$W/srv.pid" ] && kill -0 "$(cat "$W/srv.pid")" 2> /dev/null && return
  setsid nohup bash -c "cd $S && cmake -B build-cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    && cmake --build build-cuda -j14 --target llama-server llama-batched-bench && touch $W/srv.done" \
    > "$W/llama-srv-build.log" 2>&1 &
  echo $! > "$W/srv.pid"
}

few_ab() {
  [ -n "${FEW_NO_BUILD:-}" ] || build_srv
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  synth e2b
  mkdir -p "$OUT/few"
  for n in 0 8 16; do
    WGEMMA_FEW_TOKENS=$n .dev/xtask bench-batch --model "$W/models/e2b.gguf" --sequences 2,4,8,16 \
      --reps 2 --decode 64 --json > "$OUT/few/few-$n.jsonl" 2> "$OUT/few/few-$n.err"
  done
  few_prof
  python3 - "$OUT/few" << 'PY' | tee "$OUT/few.md"
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
runs = {n: {r["sequences"]: r for r in map(json.loads, (d / f"few-{n}.jsonl").read_text().splitlines())}
        for n in (0, 8, 16) if (d / f"few-{n}.jsonl").exists()}
print("| sequences | off | up to 8 | up to 16 |")
print("| ---: | ---: | ---: | ---: |")
for s in sorted({s for r in runs.values() for s in r}):
    cell = lambda n: f"{runs[n][s]['decode_tok_s']:,.0f}" if n in runs and s in runs[n] else "-"
    print(f"| {s} | {cell(0)} | {cell(8)} | {cell(16)} |")
PY
}

# The kernels of one batched step of 2, 4 and 8 E2B sequences, the few-token kernel off and
# on (up to 8), to stdout and $OUT/few/profile-N.txt.
few_prof() {
  synth e2b
  mkdir -p "$OUT/few"
  for n in ${FEW_PROF:-0 8}; do
    WGEMMA_FEW_TOKENS=$n .dev/xtask bench-batch --model "$W/models/e2b.gguf" --sequences 2,4,8 \
      --reps 1 --decode 8 --prompt 128 --profile > /dev/null 2> "$OUT/few/profile-$n.txt"
    echo "== WGEMMA_FEW_TOKENS=$n"
    grep -E "^step of|matvec|matmul|attn|norm|sample|head" "$OUT/few/profile-$n.txt" | head -60
  done
}

# The few-token kernel's shape swept (WGEMMA_FEW_TUNING "lanes a row,rows a group", FEW_TUNINGS;
# "-": the tuned choice; "noresid": that with WGEMMA_FUSIONS_OFF=residual_prologue),
# bench-batch on E2B at FEW_SEQS sequences; $OUT/few/sweep.md.
few_sweep() {
  synth e2b
  mkdir -p "$OUT/few"
  for t in ${FEW_TUNINGS:-- 16,1 8,2 8,1 32,1 4,2}; do
    f="$OUT/few/sweep-${t/,/x}.jsonl"
    case $t in
      -*) envs="" ;;
      noresid) envs="WGEMMA_FUSIONS_OFF=residual_prologue" ;;
      *:*) envs="${t#*:}" f="$OUT/few/sweep-${t%%:*}.jsonl" ;;
      *) envs="WGEMMA_FEW_TUNING=$t" ;;
    esac
    env $envs .dev/xtask bench-batch \
      --model "$W/models/e2b.gguf" --sequences "${FEW_SEQS:-3,4,8}" --reps 2 --decode 64 --json \
      > "$f" 2> "${f%.jsonl}.err" || tail -3 "${f%.jsonl}.err"
  done
  sweep_table "$OUT/few" tuning | tee "$OUT/few/sweep.md"
}

# bench-e2e of this build against .dev/xtask-base on MODELS, interleaved E2E_AB_ROUNDS times
# (default 2; E2E_ARGS adds arguments); $OUT/e2e_ab.txt.
e2e_ab() {
  synth $MODELS
  local m r side x
  for m in $MODELS; do
    for r in $(seq "${E2E_AB_ROUNDS:-2}"); do
      for side in base ours; do
        x=.dev/xtask && [ $side = base ] && x=.dev/xtask-base
        $x bench-e2e --model "$W/models/$m.gguf" --json ${E2E_ARGS:-} 2> /dev/null | tail -n 1 \
          | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(sys.argv[1], "prefill", round(d["prefill_tok_s"]), "decode", round(d["decode_tok_s"], 1))' "$m $side $r" \
          | tee -a "$OUT/e2e_ab.txt"
      done
    done
  done
}

# The aggregate decode tok/s of each run's sweep-RUN.jsonl (bench-batch lines) in directory $1,
# a row a run, a column a sequence count; $2 names the runs' column.
sweep_table() {
  python3 - "$1" "$2" << 'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(d.glob("sweep-*.jsonl")):
    for line in f.read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(f.stem[6:], {})[r["sequences"]] = r["decode_tok_s"]
seqs = sorted({s for r in rows.values() for s in r})
print(f"| {sys.argv[2]} | " + " | ".join(f"{s} seqs" for s in seqs) + " |")
print("| --- |" + " ---: |" * len(seqs))
for t, r in rows.items():
    print(f"| {t} | " + " | ".join(f"{r[s]:,.0f}" if s in r else "-" for s in seqs) + " |")
PY
}

# Batched decode's tiled products (9 to 64 rows) under the split over k's target and fewest
# steps (WGEMMA_SPLIT) and the tile (WGEMMA_COOP_TILE), one binary: each of SPLIT_RUNS names
# a run ("-": as tuned; "s1024x2": split target 1024 workgroups, 2 steps a part at least,
# for every token count ("s512x8": as before rule matmul-few-rows);
# "t16": 16-token tiles; "t16s1024x2": both); first the products' parity tests with 16-token
# tiles; bench-batch on E2B at SPLIT_SEQS; $OUT/split/sweep.md.
split_sweep() {
  synth e2b
  mkdir -p "$OUT/split"
  WGEMMA_COOP_TILE=16 CI=true WGEMMA_EXPECT_COOP=1 .dev/parity matmul 2>&1 \
    | grep "test result\|FAILED\|panicked" | tee "$OUT/split/parity-t16.txt"
  local t envs
  for t in ${SPLIT_RUNS:-- s512x4 s512x2 s1024x2 s2048x2 t16 t16s1024x2}; do
    envs=""
    [[ $t =~ t([0-9]+) ]] && envs+=" WGEMMA_COOP_TILE=${BASH_REMATCH[1]}"
    [[ $t =~ s([0-9]+)x([0-9]+) ]] && envs+=" WGEMMA_SPLIT=${BASH_REMATCH[1]},${BASH_REMATCH[2]}"
    env $envs .dev/xtask bench-batch --model "$W/models/e2b.gguf" \
      --sequences "${SPLIT_SEQS:-9,12,16,24,32,64}" --reps "${SPLIT_REPS:-1}" --decode 32 --json \
      > "$OUT/split/sweep-$t.jsonl" 2> "$OUT/split/sweep-$t.err" || tail -3 "$OUT/split/sweep-$t.err"
  done
  sweep_table "$OUT/split" run | tee "$OUT/split/sweep.md"
}

# Batched decode of this build against .dev/xtask-base (`BASE=REV bash
# benches/prepare-h100.sh`), base first, twice over: bench-batch on E2B at AB_SEQS, 64
# generated, 2 reps; $OUT/abb/sweep.md.
batch_ab() {
  synth e2b
  mkdir -p "$OUT/abb"
  local i x bin
  for i in 1 2; do
    for x in base ours; do
      bin=.dev/xtask
      [ $x = base ] && bin=.dev/xtask-base
      $bin bench-batch --model "$W/models/e2b.gguf" --sequences "${AB_SEQS:-3,4,8,16}" \
        --reps 2 --decode 64 --json > "$OUT/abb/sweep-$x$i.jsonl" 2> "$OUT/abb/sweep-$x$i.err" \
        || tail -3 "$OUT/abb/sweep-$x$i.err"
    done
  done
  sweep_table "$OUT/abb" run | tee "$OUT/abb/sweep.md"
}

depth_ab() {
  synth e2b
  mkdir -p "$OUT/depth"
  local i v
  for i in 1 2; do
    for v in cpu1:"--depth 1" cpu2:"--depth 2" gpu1:"--depth 1 --table-on-gpu" \
      gpu2:"--depth 2 --table-on-gpu"; do
      # shellcheck disable=SC2086
      .dev/xtask bench-batch --model "$W/models/e2b.gguf" --sequences "${DEPTH_SEQS:-1,4,16,64}" \
        --reps 2 --decode 64 --json ${v#*:} > "$OUT/depth/sweep-${v%%:*}-$i.jsonl" \
        2> "$OUT/depth/sweep-${v%%:*}-$i.err" || tail -3 "$OUT/depth/sweep-${v%%:*}-$i.err"
    done
  done
  sweep_table "$OUT/depth" run | tee "$OUT/depth/sweep.md"
}

# The E2B file and the llama-server build ready, for a `serve` call after this one.
srv_ready() {
  build_srv
  synth "${SERVE_MODEL:-e2b}"
  wait_for srv
}

serve() {
  build_srv
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  local S=$OUT/serve m=${SERVE_MODEL:-e2b} conc=${SERVE_CONCURRENCY:-1,4,16,64}
  local bin=$W/llsrv/build-cuda/bin args="--prompt 512 --decode 256 --json"
  mkdir -p "$S"
  synth "$m" ${BATCH_MODELS:-}
  # Ours after the build, which would otherwise take the CPU that records our steps.
  wait_for srv
  .dev/xtask bench-serve --model "$W/models/$m.gguf" --concurrency "$conc" $args \
    > "$S/ours.jsonl" 2> "$S/ours.err"
  # SERVE_LLAMA_ARGS: more llama-server flags (e.g. "-ctxcp 0 -cram 0": no context checkpoints
  # and no prompt cache in host memory, which cost it much with many streams of a SWA model).
  "$bin/llama-server" -m "$W/models/$m.gguf" -ngl 99 -fa on -np 64 -c $((64 * 784)) -b 2048 \
    -ub 512 ${SERVE_LLAMA_ARGS:-} --host 127.0.0.1 --port 8091 > "$S/llama-server.log" 2>&1 &
  local pid=$!
  .dev/xtask bench-serve --url http://127.0.0.1:8091 --server "llama-server ${SERVE_LLAMA_ARGS:-}" \
    --concurrency "$conc" $args > "$S/llama.jsonl" 2> "$S/llama.err"
  kill $pid
  python3 benches/serve_table.py "$S" | tee "$OUT/serve.md"
  for b in ${BATCH_MODELS:-}; do
    .dev/xtask bench-batch --model "$W/models/$b.gguf" --sequences 1,4,16,64 --json \
      > "$S/batch-ours-$b.jsonl" 2> "$S/batch-ours-$b.err"
    "$bin/llama-batched-bench" -m "$W/models/$b.gguf" -ngl 99 -fa on -c 45000 -b 2048 -ub 512 \
      -npp 512 -ntg 128 -npl 1,4,16,64 --output-format jsonl > "$S/batch-llama-$b.jsonl" 2>&1
  done
  [ -n "${BATCH_MODELS:-}" ] && (cd "$S" && for f in batch-*; do mv "$f" "${f#batch-}"; done) \
    && python3 benches/batch_table.py "$S" $BATCH_MODELS | tee "$OUT/batch.md"
  tar czf "$OUT/serve.tgz" -C "$OUT" serve && rm -rf "$S"
}

coop_compare() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  synth $MODELS e2b-mmproj e2b-audio-mmproj
  bench_images
  bench_clip
  local side xt m
  for side in base ours; do
    xt=.dev/xtask && [ "$side" = base ] && xt=.dev/xtask-base
    for m in $MODELS; do
      "$xt" bench-e2e --model "$W/models/$m.gguf" --decode 32 --reps 3 --json > "$OUT/pair-$side-e2e-$m.json"
    done
    mkdir -p "$OUT/vision-bench" && vision_runs "$xt" "pair-$side"
    "$xt" bench-audio --mmproj "$W/models/e2b-audio-mmproj.gguf" --model "$W/models/e2b.gguf" \
      --audio "$W/models/clip-30s.wav" --reps 5 --profile --json > "$OUT/pair-$side-audio.json" 2> /dev/null
  done
}
vision_ours() {
  synth e2b e2b-mmproj
  local V=$OUT/vision-bench && mkdir -p "$V"
  bench_images
  vision_runs .dev/xtask ours
  tar czf "$OUT/vision-ours.tgz" -C "$OUT" vision-bench
}

# bench-vision of both images with xtask $1, into $OUT/vision-bench/$2-SIZE.{json,err}.
vision_runs() {
  local xt=$1 tag=$2 size budget
  mkdir -p "$OUT/vision-bench"
  for case in "1008x624 280" "1920x1344 1120"; do
    read -r size budget <<< "$case"
    "$xt" bench-vision --mmproj "$W/models/e2b-mmproj.gguf" --model "$W/models/e2b.gguf" \
      --size "$size" --budget "$budget" --reps 5 --profile --json \
      > "$OUT/vision-bench/$tag-$size.json" 2> "$OUT/vision-bench/$tag-$size.err"
    tail -c 600 "$OUT/vision-bench/$tag-$size.json"; echo
  done
}

# vision_ours with .dev/xtask-base (run in the same call, after vision_ours).
vision_base() {
  vision_runs .dev/xtask-base base
  tar czf "$OUT/vision-ours.tgz" -C "$OUT" vision-bench
}

# vision_runs of .dev/xtask under each of AB_ENVS ("name:VAR=V,VAR2=V2 name2:"), one binary,
# into $OUT/vision-bench/NAME-SIZE.*; the image attention's kernel benchmarks first.
vision_ab() {
  synth e2b e2b-mmproj
  bench_images
  .dev/kernels --bench --warm-up-time 0.2 --measurement-time 0.5 'attend_image' > "$OUT/attend-kernels.txt" 2>&1
  python3 benches/summarize.py "$OUT/attend-kernels.txt" | tee "$OUT/attend-kernels-summary.txt"
  local v name env
  for v in ${AB_ENVS:-ours:}; do
    name=${v%%:*} env=${v#*:}
    (
      [ -n "$env" ] && export ${env//,/ }
      vision_runs .dev/xtask "$name"
    )
  done
  tar czf "$OUT/vision-ab.tgz" -C "$OUT" vision-bench
}

# The vision tower's tests against transformers' goldens (tests/fixtures, found where the
# binaries were built: /work/main) and the image prompts' teacher-forced argmax, on this GPU's
# kernels (tensor cores, f16).
vision_tests() {
  [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
  CI=true .dev/vision-tower 2>&1 | tail -n 30 | tee "$OUT/vision-tower.txt"
  CI=true .dev/vision-runtime 2>&1 | tail -n 30 | tee "$OUT/vision-runtime.txt"
}

# The audio tower's tests on this GPU's kernels (tensor cores, f16), fixtures found where
# the binaries were built (/work/main).
audio_tests() {
  [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
  CI=true .dev/audio-tower 2>&1 | tail -n 30 | tee "$OUT/audio-tower.txt"
  CI=true .dev/audio-runtime 2>&1 | tail -n 30 | tee "$OUT/audio-runtime.txt"
}

# Our side of audio_bench alone, into $OUT/audio-bench/.
audio_ours() {
  synth e2b e2b-audio-mmproj
  local A=$OUT/audio-bench && mkdir -p "$A"
  bench_clip
  .dev/xtask bench-audio --mmproj "$W/models/e2b-audio-mmproj.gguf" --model "$W/models/e2b.gguf" \
    --audio "$W/models/clip-30s.wav" --reps 5 --profile --json > "$A/ours.json" 2> "$A/ours.err"
  tail -c 800 "$A/ours.json"; echo
}

# audio_ours's encode with and without products split over k (WGEMMA_NO_SPLIT_K), side by
# side, into $OUT/audio-bench/split-{on,off}.json.
audio_split() {
  audio_ours
  local A=$OUT/audio-bench
  for mode in on off; do
    local no=0; [ "$mode" = off ] && no=1
    WGEMMA_NO_SPLIT_K=$no .dev/xtask bench-audio --mmproj "$W/models/e2b-audio-mmproj.gguf" \
      --audio "$W/models/clip-30s.wav" --reps 7 --profile --json > "$A/split-$mode.json" 2>> "$A/ours.err"
    echo "split $mode: $(tail -c 700 "$A/split-$mode.json")"
  done
}

audio_bench() {
  build_cuda
  audio_ours
  local A=$OUT/audio-bench
  wait_for cuda
  for rep in 1 2 3; do
    "$LL/build-cuda/bin/llama-mtmd-cli" -m "$W/models/e2b.gguf" --mmproj "$W/models/e2b-audio-mmproj.gguf" \
      --audio "$W/models/clip-30s.wav" -p "Transcribe this audio." -n 1 -ngl 99 --temp 0 --chat-template gemma \
      > "$A/llama-$rep.txt" 2>&1
  done
  grep -h "encod\|prompt eval time\|n_tokens\|error" "$A"/llama-*.txt | head -n 20
  python3 - "$A" <<'PY' | tee "$OUT/audio-bench.md"
import json, pathlib, re, statistics, sys
d = pathlib.Path(sys.argv[1])
o = json.loads((d / "ours.json").read_text().strip().splitlines()[-1])
enc, ttft = [], []
for f in sorted(d.glob("llama-*.txt")):
    t = f.read_text()
    m = re.findall(r"encoded in (\d+) ms", t) or re.findall(r"encoding done in (\d+) ms", t)
    if m: enc.append(sum(float(x) for x in m))
    p = re.search(r"prompt eval time =\s+([\d.]+) ms", t)
    if p: ttft.append(float(p.group(1)))
med = lambda v: f"{statistics.median(v):.1f}" if v else "?"
print("| clip | soft tokens | ours features ms | ours encode ms | ours TTFT ms | llama.cpp encode ms | llama.cpp prompt ms |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
print(f"| {o['seconds']:.0f} s | {o['soft_tokens']} | {o['features_ms']:.1f} | {o['encode_ms']:.1f} | {o['ttft_ms']:.1f} | {med(enc)} | {med(ttft)} |")
PY
  tar czf "$OUT/audio-bench.tgz" -C "$OUT" audio-bench && rm -rf "$A"
}

vision_bench() {
  build_cuda
  vision_ours
  local V=$OUT/vision-bench
  wait_for cuda
  local question="Describe this picture in detail: what do you see, which colours and shapes, and is anything unusual there?"
  for size in 1008x624 1920x1344; do
    for rep in 1 2 3; do
      "$LL/build-cuda/bin/llama-mtmd-cli" -m "$W/models/e2b.gguf" --mmproj "$W/models/e2b-mmproj.gguf" \
        --image "$W/models/img-$size.png" -p "$question" -n 1 -ngl 99 --temp 0 --chat-template gemma \
        > "$V/llama-$size-$rep.txt" 2>&1
    done
    grep -h "encoding done in\|encoded in\|prompt eval time\|image_tokens\|n_tokens" "$V"/llama-$size-*.txt | head -n 12
  done
  python3 - "$V" <<'PY' | tee "$OUT/vision-bench.md"
import json, pathlib, re, statistics, sys
d = pathlib.Path(sys.argv[1])
print("| image | soft tokens | ours encode ms | ours TTFT ms | llama.cpp encode ms | llama.cpp TTFT ms |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for size in ["1008x624", "1920x1344"]:
    o = json.loads((d / f"ours-{size}.json").read_text().strip().splitlines()[-1])
    enc, ttft = [], []
    for f in sorted(d.glob(f"llama-{size}-*.txt")):
        t = f.read_text()
        m = re.search(r"batch encoding done in (\d+) ms", t) or re.search(r"encoded in (\d+) ms", t)
        if m: enc.append(float(m.group(1)))
        p = re.search(r"prompt eval time =\s+([\d.]+) ms", t)
        if p: ttft.append(float(p.group(1)))
    med = lambda v: f"{statistics.median(v):.1f}" if v else "?"
    print(f"| {size} | {o['soft_tokens']} | {o['encode_ms']:.1f} | {o['ttft_ms']:.1f} | {med(enc)} | {med(ttft)} |")
PY
  tar czf "$OUT/vision-bench.tgz" -C "$OUT" vision-bench && rm -rf "$V"
}

# llama.cpp PR 24423 (DiffusionGemma) with CUDA, in the background.
build_dg() {
  local D=$W/lldg
  [ -d "$D" ] || tar xJf .dev/llama-dg.tar.xz -C "$W"
  [ -e "$W/dg.done" ] && return
  [ -f "$W/dg.pid" ] && kill -0 "$(cat "$W/dg.pid")" 2> /dev/null && return
  setsid nohup bash -c "cd $D && cmake -B build-cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    $CMAKE_COMMON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
    && cmake --build build-cuda -j14 --target llama-diffusion-cli && touch $W/dg.done" > "$W/llama-dg-build.log" 2>&1 &
  echo $! > "$W/dg.pid"
}

# Ours on the synthetic DiffusionGemma (the build runs meanwhile).
diffusion_start() {
  build_dg
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  mkdir -p "$OUT/diffusion"
  synth dg-26b-a4b
  for steps in ${DG_STEPS_LONG:-48} ${DG_STEPS_SHORT:-8}; do
    .dev/xtask bench-diffusion --model "$W/models/dg-26b-a4b.gguf" --prompt 512 --steps "$steps" \
      --reps 2 --json --profile > "$OUT/diffusion/ours-$steps.json" 2> "$OUT/diffusion/ours-$steps.err"
  done
}

# llama.cpp's side: whole runs of one block at two step counts, the stop rule off.
diffusion_finish() {
  wait_for dg
  local prompt n
  # Ours from an earlier call (diffusion_start) on this machine.
  mkdir -p "$OUT/diffusion" && cp -n "$R"/diffusion/ours-* "$OUT/diffusion/" 2> /dev/null
  # About 512 tokens of the synthetic vocabulary's letter pieces.
  prompt=$(python3 -c 'print(" ".join(["ab cd ef gh"] * 128))')
  for n in ${DG_STEPS_LONG:-48} ${DG_STEPS_SHORT:-8}; do
    for rep in 1 2; do
      /usr/bin/time -f "%e" -o "$OUT/diffusion/llama-$n-$rep.time" \
        "$W/lldg/build-cuda/bin/llama-diffusion-cli" -m "$W/models/dg-26b-a4b.gguf" -ngl 99 \
        -p "$prompt" -n 256 --diffusion-eb-max-steps "$n" --diffusion-eb-confidence 0 --seed 1 \
        > "$OUT/diffusion/llama-$n-$rep.out" 2> "$OUT/diffusion/llama-$n-$rep.err"
    done
  done
  python3 benches/diffusion_table.py "$OUT/diffusion" "${DG_STEPS_LONG:-48}" "${DG_STEPS_SHORT:-8}" | tee "$OUT/diffusion.md"
}

diffusion() {
  diffusion_start
  diffusion_finish
}

# Our DiffusionGemma step alone, every dispatch of one step timed (GPU timestamps), under
# each of DG_ENVS ("NAME:VAR=V,VAR2=V2"; default: "default:"); $OUT/dgprof/.
dg_prof() {
  mkdir -p "$OUT/dgprof"
  synth dg-26b-a4b
  local v name env
  for v in ${DG_ENVS:-default:}; do
    name=${v%%:*} env=${v#*:}
    env ${env//,/ } .dev/xtask bench-diffusion --model "$W/models/dg-26b-a4b.gguf" --prompt 512 \
      --steps 8 --reps 1 --json --profile --profile-each > "$OUT/dgprof/$name.json" 2> "$OUT/dgprof/$name.err"
    tail -n 1 "$OUT/dgprof/$name.json"
    # The step's dispatches grouped by kernel and workgroups (one product's shape each).
    python3 - "$OUT/dgprof/$name.err" <<'PY' | tee "$OUT/dgprof/$name.md"
import collections, re, sys
g = collections.defaultdict(lambda: [0, 0.0])
for line in open(sys.argv[1]):
    m = re.match(r"\s+\d+ (\S+)\s+(\d+) workgroups\s+([\d.]+) us", line)
    if m:
        k = (m[1], int(m[2]))
        g[k][0] += 1
        g[k][1] += float(m[3])
print("| kernel | workgroups | dispatches | ms |")
print("| --- | ---: | ---: | ---: |")
for (label, wg), (n, us) in sorted(g.items(), key=lambda kv: -kv[1][1])[:20]:
    print(f"| {label} | {wg} | {n} | {us / 1e3:.2f} |")
PY
  done
}

# One binary, variants switched by environment (AB_ENVS: "NAME:VAR=V,VAR2=V2 ..."; default:
# the prefill attention on cooperative matrices off and on), on the DiffusionGemma step and on
# text prefill/decode of AB_MODELS; $OUT/ab/.
ab() {
  mkdir -p "$OUT/ab"
  synth dg-26b-a4b
  local name env v m
  local envs=${AB_ENVS:-"fma:WGEMMA_NO_COOP_ATTENTION=1 coop:"}
  for v in $envs; do
    name=${v%%:*} env=${v#*:}
    env ${env//,/ } .dev/xtask bench-diffusion --model "$W/models/dg-26b-a4b.gguf" --prompt 512 --steps 8 \
      --reps 2 --json --profile > "$OUT/ab/dg-$name.json" 2> "$OUT/ab/dg-$name.err"
    echo "dg $name $(tail -n 1 "$OUT/ab/dg-$name.json")"
  done
  for m in ${AB_MODELS:-26b-a4b e4b}; do
    synth "$m"
    for v in $envs; do
      name=${v%%:*} env=${v#*:}
      env ${env//,/ } .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 64 --reps 3 \
        --json > "$OUT/ab/e2e-$m-$name.json" 2> "$OUT/ab/e2e-$m-$name.err"
      echo "$m $name $(tail -n 1 "$OUT/ab/e2e-$m-$name.json")"
    done
  done
}

# Node (the machine has none) and Dawn's package, unpacked once.
node_dawn() {
  [ -x "$W/node" ] || xz -dc .dev/node.xz > "$W/node" && chmod +x "$W/node"
  [ -d web/dawn/node_modules/webgpu ] || tar xJf .dev/dawn.tar.xz -C web/dawn
}

dawn() {
  node_dawn
  mkdir -p "$OUT/dawn"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  for m in $MODELS; do
    synth "$m"
    .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 128 --reps 3 --json \
      > "$OUT/dawn/native-$m.json" 2> "$OUT/dawn/native-$m.err"
    .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/$m.gguf" --prompt 512 \
      --decode 128 --reps 3 > "$OUT/dawn/dawn-$m.json" 2> "$OUT/dawn/dawn-$m.err"
    # Gemma 4 E2B/E4B with the per-layer table read a row per token (the page's
    # perLayerTable "fetch"; the default uploads it whole), and natively with the table on
    # the GPU.
    case $m in
      e2b | e4b)
        .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 128 --reps 3 --json \
          --table-on-gpu > "$OUT/dawn/native-table-$m.json" 2> "$OUT/dawn/native-table-$m.err"
        .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/$m.gguf" --prompt 512 \
          --decode 128 --reps 3 --per-layer-table fetch > "$OUT/dawn/dawn-fetch-$m.json" \
          2> "$OUT/dawn/dawn-fetch-$m.err"
        ;;
    esac
  done
  python3 benches/dawn_table.py "$OUT/dawn" $MODELS | tee "$OUT/dawn.md"
}

# Where the browser's time goes, on DAWNPROF_MODELS (default e2b): Dawn's per-kernel GPU
# times of one prefill and one decode step (timestamps unrounded through Dawn's unsafe APIs)
# and Node's CPU profile of the worker, $OUT/dawnprof-M.txt; then the same bench with Dawn's
# robustness (bounds clamping, which Chrome always keeps) off, to size what it costs.
dawnprof() {
  node_dawn
  mkdir -p "$OUT/dawn"
  local unsafe="enable-dawn-features=allow_unsafe_apis"
  for m in ${DAWNPROF_MODELS:-e2b}; do
    synth "$m"
    rm -rf "$W/cpuprof-$m"
    .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/$m.gguf" --prompt 512 \
      --decode 128 --reps 1 --profile --cpu-prof "$W/cpuprof-$m" --dawn "$unsafe" \
      --per-layer-table gpu \
      --dawn disable-dawn-features=timestamp_quantization \
      > "$OUT/dawn/dawnprof-$m.json" 2> "$OUT/dawn/dawnprof-$m.err"
    { python3 benches/dawn_profile.py "$OUT/dawn/dawnprof-$m.json"
      python3 benches/cpuprof_top.py "$W/cpuprof-$m" 30; } > "$OUT/dawnprof-$m.txt" 2>&1
    .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/$m.gguf" --prompt 512 \
      --decode 128 --reps 3 --dawn "$unsafe,disable_robustness" \
      > "$OUT/dawn/dawn-norobust-$m.json" 2> "$OUT/dawn/dawn-norobust-$m.err"
    tail -n 1 "$OUT/dawn/dawn-norobust-$m.json" >> "$OUT/dawnprof-$m.txt"
  done
}

# wasm + Dawn alone on MODELS, one timed run each (load, session creation, first and later
# time to first token): $OUT/dawn_only.txt.
dawn_only() {
  node_dawn
  mkdir -p "$OUT/dawn"
  for m in $MODELS; do
    synth "$m"
    .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/$m.gguf" --prompt 512 \
      --decode 128 --reps 1 > "$OUT/dawn/only-$m.json" 2> "$OUT/dawn/only-$m.err"
    echo "$m $(tail -n 1 "$OUT/dawn/only-$m.json")" >> "$OUT/dawn_only.txt"
  done
}

# The browser's prefill on Dawn's subgroup matrices (web/pkg's matmul_sgmat.wgsl, taken where
# the adapter has f16 ones): the adapter under each set of flags, then native bench-e2e and
# dawn-bench under each, on MODELS; $OUT/dawn_sgmat.txt (one line a run: model, flags, the
# engine's subgroup-matrix side, prefill and decode tok/s).
dawn_sgmat() {
  node_dawn
  mkdir -p "$OUT/dawn"
  local unsafe="enable-dawn-features=allow_unsafe_apis"
  local sets=(plain "$unsafe" "$unsafe,vulkan_enable_f16_on_nvidia")
  for f in "${sets[@]}"; do
    local flags=()
    [ "$f" = plain ] || flags=("$f")
    (cd web/dawn && "$W/node" adapter.mjs "${flags[@]}") >> "$OUT/dawn_sgmat.txt" 2>&1
  done
  # Correctness first: a tiny model's products on the f16 subgroup matrices (16 x 16 here)
  # against the browser's f32 tiles, through Dawn with its f16 toggle.
  .dev/xtask synth --preset tiny-gemma3 --dtype Q4_K "$W/models/tiny-q4k.gguf"
  .dev/xtask dawn-check --node "$W/node" --matrices-only --toggle vulkan_enable_f16_on_nvidia \
    --model "$W/models/tiny-q4k.gguf" >> "$OUT/dawn_sgmat.txt" 2> "$OUT/dawn/sgmat-check.err" \
    || echo "dawn-check failed: $(tail -n 3 "$OUT/dawn/sgmat-check.err")" >> "$OUT/dawn_sgmat.txt"
  for m in $MODELS; do
    synth "$m"
    .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 128 --reps 3 --json \
      > "$OUT/dawn/sgmat-native-$m.json" 2> "$OUT/dawn/sgmat-native-$m.err"
    echo "$m native $(tail -n 1 "$OUT/dawn/sgmat-native-$m.json")" >> "$OUT/dawn_sgmat.txt"
    local i=0
    for f in "${sets[@]}"; do
      local args=()
      [ "$f" = plain ] || args=(--dawn "$f")
      .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/$m.gguf" --prompt 512 \
        --decode 128 --reps 3 "${args[@]}" > "$OUT/dawn/sgmat-$m-$i.json" 2> "$OUT/dawn/sgmat-$m-$i.err"
      python3 -c "
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(sys.argv[2], sys.argv[3], 'sgmat', d.get('subgroup_matrix'), 'f16', d.get('shaderF16'),
      'prefill', d['prefill_tok_s'], 'decode', d['decode_tok_s'])" \
        "$OUT/dawn/sgmat-$m-$i.json" "$m" "$f" >> "$OUT/dawn_sgmat.txt" 2>&1
      i=$((i + 1))
    done
  done
  cat "$OUT/dawn_sgmat.txt"
}

# Dawn's per-kernel GPU times of E2B (table on the GPU) under each of DAWN_TOGGLES (Dawn's
# toggles to turn on, comma-separated, "-" for none): which kernels a toggle's work costs;
# $OUT/dawntoggles.txt.
dawntoggles() {
  node_dawn
  synth e2b
  mkdir -p "$OUT/dawn"
  for t in ${DAWN_TOGGLES:-- disable_robustness disable_workgroup_init}; do
    local on="enable-dawn-features=allow_unsafe_apis"
    [ "$t" = - ] || on+=",$t"
    .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/e2b.gguf" --prompt 512 \
      --decode 128 --reps 1 --profile --per-layer-table gpu --dawn "$on" \
      --dawn disable-dawn-features=timestamp_quantization \
      > "$OUT/dawn/toggle-$t.json" 2> "$OUT/dawn/toggle-$t.err"
    { echo "## toggles: $t"; python3 benches/dawn_profile.py "$OUT/dawn/toggle-$t.json"; } \
      >> "$OUT/dawntoggles.txt" 2>&1
  done
}

# The browser's prefill product (the f32 tiles of matmul.wgsl: no f16, no tensor cores) of
# this build against .dev/xtask-base's, alternating, on E2B natively under the browser's
# constraints (prefill tok/s and the matmul's kernel time), then this build's web/pkg on Dawn;
# $OUT/prefill_ab.txt. Carry .dev/xtask-base.xz beside the dawn step's files.
prefill_ab() {
  prefill_native_ab
  prefill_dawn
}

# prefill_ab's first half: the two builds natively under the browser's constraints (carry
# [".gl", ".dev/xtask.xz", ".dev/xtask-base.xz"]).
prefill_native_ab() {
  synth e2b
  mkdir -p "$OUT/dawn"
  local env="WGEMMA_NO_F16=1 WGEMMA_NO_COOP=1 WGEMMA_WEBGPU_LIMITS=1"
  for rep in 1 2; do
    for b in base new; do
      local x=.dev/xtask
      [ $b = base ] && x=.dev/xtask-base
      env $env $x bench-e2e --model "$W/models/e2b.gguf" --prompt 512 --decode 16 --reps 3 --json \
        > "$OUT/dawn/ab-$b-$rep.json" 2> /dev/null
      echo "$b $rep $(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("prefill", round(d["prefill_tok_s"]), "decode", round(d["decode_tok_s"]))' "$OUT/dawn/ab-$b-$rep.json")" \
        | tee -a "$OUT/prefill_ab.txt"
    done
  done
  for b in base new; do
    local x=.dev/xtask
    [ $b = base ] && x=.dev/xtask-base
    env $env $x bench-e2e --model "$W/models/e2b.gguf" --prompt 512 --decode 16 --reps 1 --profile \
      2>&1 > /dev/null | grep -E "^prefill|  matmul " | sed "s/^/$b: /" | tee -a "$OUT/prefill_ab.txt"
  done
}

# One binary under BASE_ENV, without and with AB_ENV (switches), interleaved twice: bench-e2e
# on AB_MODEL (default e2b), 512-token prompt, 16 decoded, 3 reps; then each side's prefill
# profile (its matmul line); $OUT/env_ab.txt.
env_ab() {
  local m=${AB_MODEL:-e2b} rep side env
  synth "$m"
  for rep in 1 2; do
    for side in off on; do
      env="${BASE_ENV:-}"
      [ $side = on ] && env+=" $AB_ENV"
      env $env .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 16 --reps 3 \
        --json > "$OUT/ab-$side-$rep.json" 2> /dev/null
      echo "$side $rep $(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("prefill", round(d["prefill_tok_s"]), "decode", round(d["decode_tok_s"]))' "$OUT/ab-$side-$rep.json")" \
        | tee -a "$OUT/env_ab.txt"
    done
  done
  for side in off on; do
    env="${BASE_ENV:-}"
    [ $side = on ] && env+=" $AB_ENV"
    env $env .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 16 --reps 1 \
      --profile 2>&1 > /dev/null | grep -E "^prefill|  matmul " | sed "s/^/$side: /" \
      | tee -a "$OUT/env_ab.txt"
  done
}

# One binary under BASE_ENV and each of AB_ENVS ("name:VAR=V,VAR2=V2 name2:"), interleaved
# twice: bench-e2e on each of AB_MODELS (default e2b), 512-token prompt, 16 decoded, 3 reps;
# then each side's prefill profile (its matmul lines); $OUT/envs_ab.txt.
envs_ab() {
  local m rep side name env
  for m in ${AB_MODELS:-e2b}; do
    synth "$m"
    for rep in 1 2; do
      for side in $AB_ENVS; do
        name=${side%%:*}
        env="${BASE_ENV:-} $(echo "${side#*:}" | tr , ' ')"
        env $env .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 16 --reps 3 \
          --json > "$OUT/envs-$m-$name-$rep.json" 2> /dev/null
        echo "$m $name $rep $(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("prefill", round(d["prefill_tok_s"]), "decode", round(d["decode_tok_s"]))' "$OUT/envs-$m-$name-$rep.json")" \
          | tee -a "$OUT/envs_ab.txt"
      done
    done
    for side in $AB_ENVS; do
      name=${side%%:*}
      env="${BASE_ENV:-} $(echo "${side#*:}" | tr , ' ')"
      env $env .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 16 --reps 1 \
        --profile 2>&1 > /dev/null | grep -E "^prefill|  matmul" | sed "s/^/$m $name: /" \
        | tee -a "$OUT/envs_ab.txt"
    done
  done
}

# The page's engine on Dawn from two packages, .dev/pkg-old.tar.xz and .dev/pkg-new.tar.xz
# (`tar cJf .dev/pkg-X.tar.xz -C web pkg` after `cargo xtask wasm` at each revision),
# interleaved twice: dawn-bench on PKG_MODELS (default gemma3-270m e2b), 512-token prompt,
# 128 generated, 3 reps; $OUT/pkg_ab.txt. Carry [".gl", ".dev/xtask.xz", ".dev/node.xz",
# ".dev/dawn.tar.xz", ".dev/pkg-old.tar.xz", ".dev/pkg-new.tar.xz"].
pkg_ab() {
  node_dawn
  mkdir -p "$OUT/dawn"
  local m rep side
  for m in ${PKG_MODELS:-gemma3-270m e2b}; do
    synth "$m"
    for rep in 1 2; do
      for side in old new; do
        rm -rf web/pkg && tar xJf ".dev/pkg-$side.tar.xz" -C web
        .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/$m.gguf" --prompt 512 \
          --decode 128 --reps 3 > "$OUT/dawn/pkg-$side-$m-$rep.json" 2> "$OUT/dawn/pkg-$side-$m-$rep.err"
        echo "$m $side $rep $(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("prefill", round(d["prefill_tok_s"]), "decode", round(d["decode_tok_s"]))' "$OUT/dawn/pkg-$side-$m-$rep.json")" \
          | tee -a "$OUT/pkg_ab.txt"
      done
    done
  done
}

# prefill_ab's second half: this build's web/pkg on Dawn next to native (carry [".gl",
# ".dev/xtask.xz", ".dev/node.xz", ".dev/dawn.tar.xz", "web/pkg"]); DAWN_ARGS adds
# dawn-bench arguments (e.g. "--knob WGEMMA_INT8_TILES=1").
prefill_dawn() {
  node_dawn
  synth e2b
  mkdir -p "$OUT/dawn"
  .dev/xtask dawn-bench --no-build --node "$W/node" --model "$W/models/e2b.gguf" --prompt 512 \
    --decode 128 --reps 3 ${DAWN_ARGS:-} > "$OUT/dawn/dawn-e2b.json" 2> "$OUT/dawn/dawn-e2b.err"
  .dev/xtask bench-e2e --model "$W/models/e2b.gguf" --prompt 512 --decode 128 --reps 3 --json \
    > "$OUT/dawn/native-e2b.json" 2> "$OUT/dawn/native-e2b.err"
  python3 benches/dawn_table.py "$OUT/dawn" e2b | tee -a "$OUT/prefill_ab.txt"
}

# Native under the browser's constraints (no shader-f16, so no tensor-core tiles; WebGPU's
# default limits), with and without subgroups, each with the per-kernel profile of one prefill
# and one decode step: where the browser's kernels lose to native's, apart from Dawn and wasm.
browserlike() {
  mkdir -p "$OUT/dawn"
  for m in ${BROWSERLIKE_MODELS:-e2b}; do
    synth "$m"
    for v in nosg sg; do
      local env="WGEMMA_NO_F16=1 WGEMMA_NO_COOP=1 WGEMMA_WEBGPU_LIMITS=1"
      [ $v = nosg ] && env+=" WGEMMA_NO_SUBGROUPS=1"
      env $env .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 128 --reps 3 \
        --json > "$OUT/dawn/native-$v-$m.json" 2> "$OUT/dawn/native-$v-$m.err"
      env $env .dev/xtask bench-e2e --model "$W/models/$m.gguf" --prompt 512 --decode 16 --reps 1 \
        --profile > /dev/null 2> "$OUT/dawn/profile-$v-$m.txt"
    done
  done
}

ATTN_ALL=WGEMMA_ATTEND_WHOLE_TILES=1,WGEMMA_ATTEND_NO_PREFETCH=1,WGEMMA_ATTEND_TWO_PASS=1,WGEMMA_ATTEND_K_AHEAD=1
ATTN_VARIANTS=${ATTN_VARIANTS:-"main: whole:WGEMMA_ATTEND_WHOLE_TILES=1 nopre:WGEMMA_ATTEND_NO_PREFETCH=1 two:WGEMMA_ATTEND_TWO_PASS=1 ahead:WGEMMA_ATTEND_K_AHEAD=1 ahead_whole:WGEMMA_ATTEND_K_AHEAD=1,WGEMMA_ATTEND_WHOLE_TILES=1 all:$ATTN_ALL lean:WGEMMA_ATTEND_WHOLE_TILES=1,WGEMMA_ATTEND_NO_PREFETCH=1,WGEMMA_ATTEND_TWO_PASS=1 b64:WGEMMA_ATTEND_BLOCK64=1 b64_ahead:WGEMMA_ATTEND_BLOCK64=1,WGEMMA_ATTEND_K_AHEAD=1,WGEMMA_ATTEND_WHOLE_TILES=1"}

shader_stats() {
  synth e2b-mmproj
  local D=$W/spirv v env && rm -rf "$D"
  WGEMMA_DUMP_SPIRV=$D .dev/xtask bench-vision --mmproj "$W/models/e2b-mmproj.gguf" \
    --size 1920x1344 --budget 1120 --reps 1 > /dev/null 2>&1
  if [ "${STATS_E2E:-1}" = 1 ]; then
    synth e2b
    WGEMMA_DUMP_SPIRV=$D .dev/xtask bench-e2e --model "$W/models/e2b.gguf" --prompt 512 \
      --decode 16 --reps 1 > /dev/null 2>&1
    # The browser's kernels (its integer-dot prefill tiles) under its constraints.
    WGEMMA_DUMP_SPIRV=$D WGEMMA_NO_F16=1 WGEMMA_NO_COOP=1 WGEMMA_WEBGPU_LIMITS=1 .dev/xtask \
      bench-e2e --model "$W/models/e2b.gguf" --prompt 512 --decode 16 --reps 1 > /dev/null 2>&1
  fi
  for v in $ATTN_VARIANTS; do
    env=${v#*:}
    [ -n "$env" ] && env WGEMMA_DUMP_SPIRV=$D ${env//,/ } .dev/xtask bench-vision \
      --mmproj "$W/models/e2b-mmproj.gguf" --reps 1 > /dev/null 2>&1
  done
  .dev/xtask shader-stats "$D" > "$OUT/shader-stats.txt" 2>&1
  grep -A2 -E "^(attend_coop|matmul_coop|matmul_int8|matvec)" "$OUT/shader-stats.txt" | head -c 11000
}

attn_ab() {
  synth e2b-mmproj
  CI=true WGEMMA_EXPECT_COOP=1 .dev/parity attention 2>&1 | tail -n 4 | tee "$OUT/parity-attn.txt"
  CI=true WGEMMA_EXPECT_COOP=1 env ${ATTN_ALL//,/ } .dev/parity attention 2>&1 | tail -n 4 \
    | tee "$OUT/parity-attn-all.txt"
  CI=true WGEMMA_EXPECT_COOP=1 WGEMMA_ATTEND_K_AHEAD=1 .dev/parity attention 2>&1 | tail -n 4 \
    | tee "$OUT/parity-attn-ahead.txt"
  CI=true WGEMMA_EXPECT_COOP=1 WGEMMA_ATTEND_BLOCK64=1 .dev/parity attention 2>&1 | tail -n 4 \
    | tee "$OUT/parity-attn-b64.txt"
  mkdir -p "$OUT/vision-bench"
  local i v name env f
  for i in $(seq "${ATTN_ROUNDS:-2}"); do
    for v in $ATTN_VARIANTS; do
      name=${v%%:*} env=${v#*:} f=$OUT/vision-bench/attn-$name-$i.json
      env ${env//,/ } .dev/xtask bench-vision --mmproj "$W/models/e2b-mmproj.gguf" \
        --size 1920x1344 --budget 1120 --reps 3 --profile --json > "$f" 2> /dev/null
      python3 -c "
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
att = [k for k in d['profile'] or [] if k[0].startswith('attend')]
print(sys.argv[2], 'encode ms', d['encode_ms'], 'attention', att)" "$f" "$name"
    done
  done
}

# Our side of 26B-A4B alone.
ours_moe() {
  synth 26b-a4b
  .dev/xtask bench-e2e --model "$W/models/26b-a4b.gguf" --prompt 128 --decode 64 --reps 3 --json | tee "$OUT/e2e-26b-a4b.json"
}

# The 26B-A4B mixture of experts at full size (15 GiB), both engines, shorter runs.
moe() {
  build_cuda
  ours_moe
  wait_for cuda
  "$LL/build-cuda/bin/llama-bench" -m "$W/models/26b-a4b.gguf" -ngl 99 -p 128 -n 64 -r 3 -fa 0,1 -o json \
    > "$OUT/llama-bench-26b-a4b.json" 2>> "$OUT/llama-bench.log"
  print_table table-26b 26b-a4b
}

for step in "$@"; do
  "$step"
  cp -a "$OUT"/. "$R"/
  echo "h100.sh: $step done at ${SECONDS}s" | tee -a "$OUT/steps.txt"
done
