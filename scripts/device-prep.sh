#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device call: the GPU machine has no liburing and no
# network, so liburing-dev is downloaded from Debian and unpacked into .device/uring (git-ignored),
# which the device call carries. scripts/device-check.sh builds against it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/debs .device/uring
(cd .device/debs && apt-get download liburing-dev liburing2 >/dev/null)
for f in .device/debs/*.deb; do dpkg -x "$f" .device/uring; done
echo "device-prep: liburing unpacked into .device/uring (carry .device)"
