#!/usr/bin/env bash
# Installs what zrtier needs (Debian/Ubuntu, apt-get) and configures + builds it into build/.
#   scripts/setup.sh            # release build with tests
#   BUILD_DIR=out scripts/setup.sh
# Set ZRTIER_SKIP_APT=1 to skip the package step (e.g. on a machine without apt or network).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

packages=(build-essential cmake ninja-build pkg-config libzstd-dev liburing-dev libnuma-dev
  libcli11-dev nlohmann-json3-dev libgtest-dev googletest tmux zstd)
if [[ "${ZRTIER_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [[ $(id -u) != 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

if [[ ! -f /usr/local/cuda/include/cuda_runtime_api.h ]]; then
  echo "setup: the CUDA toolkit headers are missing (/usr/local/cuda/include/cuda_runtime_api.h)." >&2
  echo "       Install the CUDA toolkit; zrtier builds against its headers and never links libcudart." >&2
  exit 1
fi

werror=OFF; [[ "${CI:-}" == true ]] && werror=ON
generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZRTIER_WERROR=$werror
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built into $BUILD_DIR/ (tools: $BUILD_DIR/tools/zrtier, preload: $BUILD_DIR/preload/libzrtier.so)"
