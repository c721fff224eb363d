# Covers `zrtier doctor`'s verdict against what the engine really does: for root and for an
# unprivileged user (nobody), doctor says "cannot work" exactly when `zrtier demo` cannot start the
# engine, and then names the fixes; `zrtier run` says so before the command starts and, with
# --require (ZRTIER_REQUIRE=1), does not start it (status 69); the preloaded shim with
# ZRTIER_REQUIRE=1 ends a program it cannot manage with status 69. Doctor also states the fork and
# security models.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); chmod 755 "$tmp"; trap 'rm -rf "$tmp"' EXIT
export ZRTIER_TEST_STATS_DIR=$tmp ZRTIER_STATS=0 ZRTIER_LIBRARY=$DUMMY_PRELOAD

# check_user LABEL RUNNER...: doctor's verdict for the user RUNNER runs as must match the demo's.
check_user() {
  local label=$1; shift
  local doc dst demo mst
  doc=$("$@" "$ZRTIER" doctor 2>&1); dst=$?
  demo=$("$@" "$ZRTIER" demo --gib 0.0625 --layer-mib 8 --seconds 0.2 --quiet 2>&1); mst=$?
  if [[ $mst == 0 ]]; then
    expect_status 0 $dst "$label: demo works, so doctor must pass: $doc"
    expect_contains "$doc" "verdict: " "$label doctor"
    expect_contains "$doc" "fork: a forked child reads every managed buffer as the parent has it at the child's first touch" "$label doctor's fork model"
    expect_contains "$doc" "security: statistics blocks are created O_EXCL|O_NOFOLLOW" "$label doctor's security model"
    [[ "$doc" != *"cannot work"* ]] || fail "$label: demo works but doctor says it cannot: $doc"
    [[ "$doc" != *FAIL* ]] || fail "$label: demo works but doctor FAILs: $doc"
  else
    expect_contains "$demo" "cannot start the engine" "$label demo"
    expect_status 1 $dst "$label: demo cannot start the engine, so doctor must fail: $doc"
    expect_contains "$doc" "cannot work here for" "$label doctor verdict"
    expect_contains "$doc" "FAIL  engine" "$label doctor names the engine"
    if [[ "$demo" == *"userfaultfd unavailable"* ]]; then
      expect_contains "$doc" "FAIL  userfaultfd" "$label doctor names userfaultfd"
      expect_contains "$doc" "vm.unprivileged_userfaultfd=1" "$label doctor's fix (sysctl)"
      expect_contains "$doc" "/dev/userfaultfd" "$label doctor's fix (device)"
    fi
  fi
  echo "$label: demo status $mst, doctor status $dst"
  return $mst
}

check_user root env
[[ $(id -u) == 0 ]] || { echo "PASS (as $(id -un) only; the unprivileged half needs root)"; exit 0; }
command -v setpriv >/dev/null || skip "setpriv (util-linux) is needed to run as nobody"
as_nobody() { env HOME=/ setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
as_nobody test -x "$ZRTIER" || skip "nobody cannot execute $ZRTIER (a parent folder is private)"
check_user nobody as_nobody; nobody_demo=$?

# zrtier run before the command: a warning, or with --require a refusal (69), never silence.
out=$(as_nobody "$ZRTIER" run -- true 2>&1); st=$?
expect_status 0 $st "zrtier run as nobody: $out"
out_req=$(as_nobody "$ZRTIER" run --require -- sh -c 'echo started' 2>&1); st_req=$?
if [[ $nobody_demo == 0 ]]; then
  [[ "$out" != *"cannot start"* ]] || fail "zrtier run warns although the engine starts: $out"
  expect_status 0 $st_req "zrtier run --require as nobody (engine starts): $out_req"
else
  expect_contains "$out" "zrtier cannot start, so true runs without it" "zrtier run warning"
  expect_status 69 $st_req "zrtier run --require as nobody: $out_req"
  [[ "$out_req" != *started* ]] || fail "--require started the command: $out_req"
  expect_contains "$out_req" "ZRTIER_REQUIRE=1" "zrtier run --require message"
  # The same refusal through the environment.
  ZRTIER_REQUIRE=1 as_nobody "$ZRTIER" run -- true 2>/dev/null
  expect_status 69 $? "ZRTIER_REQUIRE=1 zrtier run as nobody"
fi
"$ZRTIER" run --require -- true; expect_status 0 $? "zrtier run --require as root"

# The shim itself, preloaded without zrtier run, in a program that allocates pinned memory.
if [[ -n ${PRELOAD_TEST:-} && -n ${SHIM:-} && $nobody_demo != 0 ]]; then
  out=$(as_nobody env LD_PRELOAD="$SHIM" ZRTIER_REQUIRE=1 ZRTIER_MIN_ALLOC=1M "$PRELOAD_TEST" \
        --gtest_filter=Preload.RegionRoundTripExactBytes 2>&1); st=$?
  expect_status 69 $st "ZRTIER_REQUIRE=1 shim as nobody: $out"
  expect_contains "$out" "cannot start and ZRTIER_REQUIRE=1" "shim message"
  expect_contains "$out" "userfaultfd unavailable" "shim names the cause"
fi
echo "PASS"
