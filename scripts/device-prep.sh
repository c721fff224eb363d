#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device call: the GPU machine has no liburing, no
# nlohmann-json and no network, so liburing-dev and nlohmann-json3-dev are downloaded from Debian
# and unpacked into .device/uring and .device/nlohmann (git-ignored), which the device call
# carries. scripts/device-check.sh builds against them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/debs/uring .device/debs/nlohmann .device/uring .device/nlohmann
(cd .device/debs/uring && apt-get download liburing-dev liburing2 >/dev/null)
(cd .device/debs/nlohmann && apt-get download nlohmann-json3-dev >/dev/null)
for f in .device/debs/uring/*.deb; do dpkg -x "$f" .device/uring; done
for f in .device/debs/nlohmann/*.deb; do dpkg -x "$f" .device/nlohmann; done
# The headers only: the package's examples and documentation are not needed to build.
rm -rf .device/nlohmann/usr/share/doc
echo "device-prep: liburing unpacked into .device/uring, nlohmann-json into .device/nlohmann (carry .device)"
