#!/usr/bin/env bash
# Runs the whole test suite: every ctest test of the release build, then the concurrency tests
# (ctest label `concurrency`) under ASan+UBSan and under TSan in their own build folders.
#   scripts/test.sh                    # everything
#   ZRTIER_SANITIZERS=0 scripts/test.sh  # release build only
# Tests that find a kernel feature missing report "skipped" with the reason (exit code 77).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
jobs=$(nproc)

[[ -f "$BUILD_DIR/CMakeCache.txt" ]] || { echo "test: run scripts/setup.sh first" >&2; exit 1; }
# The layers first: every #include against the table in runtime/README.md.
python3 scripts/check-includes.py
cmake --build "$BUILD_DIR" -j "$jobs"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$jobs")

if [[ "${ZRTIER_SANITIZERS:-1}" != 0 ]]; then
  werror=OFF; [[ "${CI:-}" == true ]] && werror=ON
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  for san in address thread; do
    dir="$BUILD_DIR-$san"
    echo "test: concurrency tests under -fsanitize=$san ($dir)"
    cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DZRTIER_SANITIZE=$san \
      -DZRTIER_WERROR=$werror >/dev/null
    targets=$(cd "$dir" && ctest -N -L concurrency | sed -n 's/^ *Test *#[0-9]*: \(.*\)$/\1/p')
    [[ -n "$targets" ]] || { echo "test: no concurrency tests found" >&2; exit 1; }
    cmake --build "$dir" -j "$jobs" --target $targets
    (cd "$dir" && ZRTIER_TEST_STRESS_SECONDS=${ZRTIER_SAN_STRESS_SECONDS:-20} \
      TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
      ctest --output-on-failure -L concurrency)
  done
fi
echo "test: all suites passed"
