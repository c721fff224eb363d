# Covers `zrtier demo`: a small run through the real engine evicts, compresses, faults and verifies
# every byte (exit 0, summary numbers non-zero), and publishes statistics while it runs.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export ZRTIER_TEST_STATS_DIR=$tmp
out=$("$ZRTIER" demo --gib 0.125 --layer-mib 8 --seconds 1 --quiet 2>&1); st=$?
if [[ $st != 0 && "$out" == *"cannot start the engine"* ]]; then skip "$out"; fi
expect_status 0 $st "zrtier demo: $out"
expect_contains "$out" "OK: every byte came back" "demo result"
expect_contains "$out" "0 layers differed" "demo verification"
grep -Eq 'evictions +[1-9][0-9]*' <<<"$out" || fail "no evictions: $out"
grep -Eq 'faults +[1-9][0-9]*' <<<"$out" || fail "no faults: $out"
grep -Eq 'verified +[0-9.]+[KMG] read back' <<<"$out" || fail "nothing verified: $out"
grep -Eq 'held as .* \(1\.[3-9][0-9]x\)' <<<"$out" || fail "bf16 should compress 1.3-2x: $out"
[[ -z "$(ls "$tmp")" ]] || fail "the demo left its statistics block behind: $(ls "$tmp")"
"$ZRTIER" demo --gib 0 2>/dev/null; expect_status 2 $? "--gib 0 is rejected"
echo "PASS"
