#!/usr/bin/env bash
# Runs a command in a Debian trixie root with Mesa from trixie-backports, whose lavapipe
# (Vulkan 1.4) gives Dawn in Node what Debian 12's does not: an adapter at all, with
# `shader-f16`, `subgroups` and `chromium-experimental-subgroup-matrix` (8 x 8 x 8 f16 and
# 8-bit integer products, subgroups of 8 lanes). So the browser build's kernels for GPUs with
# those features run on this machine's CPU through the engine Chrome uses.
#
#   scripts/dawn-lavapipe.sh COMMAND [ARG]...
#
# The root is made once, outside the checkout, in ~/.cache/wgemma/dawn-lavapipe (debootstrap,
# about 200 MB; needs root or sudo); this checkout is mounted inside it at its own path (so
# paths built into the xtask binary hold there too) for the command, which runs there as root
# with the host's `node` as /usr/local/bin/node. Node's `webgpu` package must already be in
# web/dawn/node_modules (`cargo xtask dawn-bench` installs it; the root has no npm).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
mirror=http://deb.debian.org/debian
cache="${XDG_CACHE_HOME:-$HOME/.cache}/wgemma"
mkdir -p "$cache"
root="$(realpath "$cache")/dawn-lavapipe"
case "$root$repo" in
  *[[:space:]]*)
    echo "dawn-lavapipe: $root or $repo holds a space; give a plain XDG_CACHE_HOME" >&2
    exit 1
    ;;
esac
# One run at a time: each mounts /proc and /dev in the root and takes them down after.
exec 9>"$root.lock"
flock 9
# The mounts under the root, deepest first.
mounts_inside() {
  local all
  all=$(findmnt -rn -o TARGET)
  printf '%s\n' "$all" | while read -r t; do
    case "$t" in "$root"/*) echo "$t" ;; esac
  done | sort -r
}
# A run killed before its cleanup leaves its mounts (of whatever checkout): take them down
# before anything else, and never remove the root while something is mounted in it (a
# checkout would go with it).
for m in $(mounts_inside); do
  $sudo umount "$m"
done
if [ ! -e "$root/.ready" ]; then
  scripts/apt-install-missing.sh debootstrap
  if [ -n "$(mounts_inside)" ]; then
    echo "dawn-lavapipe: $root still has mounts; not removing it" >&2
    exit 1
  fi
  $sudo rm -rf --one-file-system "$root"
  $sudo debootstrap --variant=minbase trixie "$root" "$mirror" >/dev/null
  echo "deb $mirror trixie-backports main" | $sudo tee "$root/etc/apt/sources.list.d/backports.list" >/dev/null
  $sudo chroot "$root" apt-get update -qq
  $sudo chroot "$root" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq -t trixie-backports mesa-vulkan-drivers libvulkan1 >/dev/null
  $sudo touch "$root/.ready"
fi
$sudo install -m 755 "$(command -v node)" "$root/usr/local/bin/node"
$sudo mkdir -p "$root$repo" "$root/proc" "$root/dev"
mounts=("$root$repo" "$root/proc" "$root/dev")
cleanup() {
  for m in "${mounts[@]}"; do
    $sudo umount "$m" 2>/dev/null || true
  done
}
trap cleanup EXIT
$sudo mount --bind "$repo" "$root$repo"
$sudo mount -t proc proc "$root/proc"
$sudo mount --bind /dev "$root/dev"
# Only lavapipe: the root's other drivers would find no device here anyway.
$sudo chroot "$root" env -C "$repo" VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.json \
  HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin "$@"
