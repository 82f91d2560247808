#!/usr/bin/env bash
# Pairs of `bench-e2e` runs of .dev/xtask and .dev/xtask-base (BASE=REV bash
# benches/prepare-h100.sh) on the same synthetic files, alternating which side runs first, for
# changes smaller than one run's noise. On the device:
#   PAIRS=4 bash benches/pairs.sh   (writes $OUT/pairs/ and $OUT/pairs.md)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/wgemma-out}
W=$PWD/target/h100
MODELS=${MODELS:-"gemma3-270m e2b e4b"}
mkdir -p "$OUT/pairs" "$W/models"
# The Vulkan loader, as benches/h100.sh installs it.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
chmod +x .dev/xtask*
for m in $MODELS; do
  [ -f "$W/models/$m.gguf" ] || .dev/xtask synth "$W/models/$m.gguf" --preset "$m" > /dev/null
done
for i in $(seq 1 "${PAIRS:-2}"); do
  order="ours base"
  [ $((i % 2)) = 0 ] && order="base ours"
  for side in $order; do
    x=.dev/xtask
    [ "$side" = base ] && x=.dev/xtask-base
    for m in $MODELS; do
      "$x" bench-e2e --model "$W/models/$m.gguf" --json --reps "${REPS:-5}" > "$OUT/pairs/$i-$side-$m.json"
    done
  done
done
python3 benches/pairs.py "$OUT/pairs" $MODELS | tee "$OUT/pairs.md"
