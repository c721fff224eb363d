#!/usr/bin/env bash
# Runs the whole test suite: every ctest test of the release build, then under ASan+UBSan the
# concurrency tests (ctest label `concurrency`) and every unit test of the engine, codec, T0 pool
# and shim (label `unit`), and under TSan the concurrency tests, each in its own build folder.
#   scripts/test.sh                    # everything
#   ZRTIER_SANITIZERS=0 scripts/test.sh  # release build only
# Tests that find a kernel feature missing report "skipped" with the reason: a test program whose
# every test skipped exits 77 and ctest shows it as Skipped (tests/testutil/skip.h). At the end the
# skipped tests are counted: whole programs (ctest) and single test cases (GoogleTest). With
# CI=true a core suite skipped entirely fails the run: the engine, the shim and the stores must
# run in CI, not pass by skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
jobs=$(nproc)
# The core suites, by ctest name.
core='^(engine_|shim_|held_|pager_|memory_budget_|ram_store|file_store|tiered_store|tiers_stress|zram_store|uring|region_)'

[[ -f "$BUILD_DIR/CMakeCache.txt" ]] || { echo "test: run scripts/setup.sh first" >&2; exit 1; }

skipped_programs=()  # "name (build dir)"
skipped_core=()
skipped_cases=0
# run_ctest DIR [ctest arguments...]: runs ctest in DIR and collects its skipped tests; a failure
# ends the script after the skip summary.
run_ctest() {
  local dir=$1 status=0 name
  shift
  local log
  log=$(mktemp)
  (cd "$dir" && ctest "$@") 2>&1 | tee "$log" || status=$?
  # ctest's summary: "The following tests did not run:" then "<tab> 12 - name (Skipped)".
  while IFS= read -r name; do
    skipped_programs+=("$name ($dir)")
    [[ $name =~ $core ]] && skipped_core+=("$name ($dir)")
  done < <(sed -n 's/^[[:space:]]*[0-9][0-9]* - \(.*\) (Skipped)$/\1/p' "$log")
  # GoogleTest's line per skipped case: "[  SKIPPED ] Suite.Name (12 ms)".
  local last="$dir/Testing/Temporary/LastTest.log" n=0
  [[ -f $last ]] && n=$(grep -cE '^\[  SKIPPED \] [^ ]+ \([0-9]+ ms\)$' "$last" || true)
  skipped_cases=$((skipped_cases + n))
  rm -f "$log"
  if [[ $status != 0 ]]; then
    summary
    exit "$status"
  fi
}
summary() {
  echo "test: ${#skipped_programs[@]} test programs skipped entirely, $skipped_cases test cases skipped in all"
  local p
  for p in "${skipped_programs[@]}"; do echo "test:   skipped: $p"; done
}

# The layers first: every #include against the table in runtime/README.md.
python3 scripts/check-includes.py
cmake --build "$BUILD_DIR" -j "$jobs"
run_ctest "$BUILD_DIR" --output-on-failure -j "$jobs"

if [[ "${ZRTIER_SANITIZERS:-1}" != 0 ]]; then
  werror=OFF; [[ "${CI:-}" == true ]] && werror=ON
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  for san in address thread; do
    dir="$BUILD_DIR-$san"
    # ASan+UBSan: the concurrency tests and every unit test of the engine, codec, T0 pool and
    # shim; TSan: the concurrency tests.
    labels=concurrency; [[ $san == address ]] && labels='concurrency|unit'
    echo "test: $labels tests under -fsanitize=$san ($dir)"
    cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DZRTIER_SANITIZE=$san \
      -DZRTIER_WERROR=$werror >/dev/null
    targets=$(cd "$dir" && ctest -N -L "$labels" | sed -n 's/^ *Test *#[0-9]*: \(.*\)$/\1/p')
    [[ -n "$targets" ]] || { echo "test: no concurrency tests found" >&2; exit 1; }
    cmake --build "$dir" -j "$jobs" --target $targets
    ZRTIER_TEST_STRESS_SECONDS=${ZRTIER_SAN_STRESS_SECONDS:-20} \
      TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
      run_ctest "$dir" --output-on-failure -L "$labels"
  done
fi
summary
if [[ "${CI:-}" == true && ${#skipped_core[@]} -gt 0 ]]; then
  echo "test: FAILED: core suites skipped entirely in CI (their reasons: Testing/Temporary/LastTest.log):" >&2
  for p in "${skipped_core[@]}"; do echo "test:   $p" >&2; done
  exit 1
fi
echo "test: all suites passed"
