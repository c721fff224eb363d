#!/usr/bin/env bash
# Installs the .deb into a fresh Debian chroot and checks it as a new user would: `zrtier
# --version`, `zrtier doctor`, `zrtier run -- true`, `man -w zrtier`, and a CUDA program (the
# test suite's preload_test over the fake CUDA runtime) under LD_PRELOAD=/usr/lib/libzrtier.so,
# with `zrtier stats` showing it. Needs root, debootstrap and the network (not run by CI).
#   scripts/package-check.sh [CHROOT_DIR]      (default: a fresh folder under /tmp, removed after)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $EUID == 0 ]] || { echo "package-check: needs root (chroot, mounts)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "package-check: apt-get install debootstrap" >&2; exit 2; }
BUILD=${BUILD_DIR:-build}
(cd "$BUILD" && cpack -G DEB >/dev/null)
deb=$(ls -t "$BUILD"/zrtier_*_amd64.deb | head -1)
root=${1:-$(mktemp -d /tmp/zrtier-package-check.XXXXXX)}
mounts=()
cleanup() {
  local busy=no
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[$i]}" 2>/dev/null || busy=yes; done
  # The bind mounts lead to the host's /dev, /proc, ...: never remove a tree that still has one.
  if [[ $busy == yes ]]; then echo "package-check: a mount under $root is still there; not removed" >&2
  elif [[ -z ${1:-} ]]; then rm -rf --one-file-system "$root"; fi
}
trap 'cleanup "${1:-}"' EXIT
[[ -x $root/bin/bash ]] || debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
for m in proc sys dev dev/shm run; do
  mkdir -p "$root/$m"; mount --bind "/$m" "$root/$m"; mounts+=("$root/$m")
done
mkdir -p "$root/tmp/zrtier-check"
cp "$deb" "$root/tmp/zrtier-check/"
cp -a "$BUILD"/tests/fake_cuda/lib/libcudart.so* "$BUILD"/tests/shim/preload_test "$root/tmp/zrtier-check/"
chroot "$root" bash -euo pipefail -c '
cd /tmp/zrtier-check
apt-get install -y -qq ./zrtier_*_amd64.deb man-db >/dev/null 2>&1
zrtier --version
zrtier-top --version
zrtier doctor | tail -1
zrtier run -- true && echo "zrtier run -- true: exit 0"
man -w zrtier zrtier-top
LD_LIBRARY_PATH=$PWD LD_PRELOAD=/usr/lib/libzrtier.so ZRTIER_MIN_ALLOC=1M ./preload_test --gtest_filter=Preload.* >test.log 2>&1 &
pid=$!
seen=no
for i in $(seq 40); do
  out=$(zrtier stats "$pid" 2>/dev/null || true)
  if grep -q "preload_test" <<<"$out"; then seen=yes; head -2 <<<"$out"; break; fi
  sleep 0.1
done
wait "$pid" || { tail -20 test.log; echo "FAIL: preload_test under the installed library"; exit 1; }
[[ $seen == yes ]] || { echo "FAIL: zrtier stats never showed the preloaded process"; exit 1; }
echo "PASS: the installed package works in a fresh Debian"
'
