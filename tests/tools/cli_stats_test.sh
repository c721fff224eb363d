# Covers `zrtier stats`: text, --json and --prometheus snapshots of a live process's shared-memory
# block (published by a helper process), exit 1 for a PID without statistics, and cleanup of the
# block of a process killed with SIGKILL.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
export ZRTIER_TEST_STATS_DIR=$tmp
coproc PUB { exec "$PUBLISHER" 60; }
pid=; trap '[[ -n $pid ]] && kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
read -r word pid <&"${PUB[0]}" || fail "publisher did not start"
[[ "$word" == ready ]] || fail "publisher said '$word'"
[[ -f $tmp/zrtier.$pid ]] || fail "no block at $tmp/zrtier.$pid"

out=$("$ZRTIER" stats); expect_status 0 $? "stats"
expect_contains "$out" "pid $pid" "stats text"
expect_contains "$out" "faults_missing" "stats text"
expect_contains "$out" "stats_publisher" "stats text (command line)"
# The publisher's copies: half ready at the call, all of them before the GPU needed them.
expect_contains "$out" "prefetch hits 50% (100% in time)" "stats text (prefetch hits)"
json=$("$ZRTIER" stats "$pid" --json); expect_status 0 $? "stats --json"
expect_contains "$json" "\"pid\": $pid" "stats --json"
faults=$(grep -o '"faults_missing": [0-9]*' <<<"$json" | grep -o '[0-9]*$')
(( faults >= 4242 )) || fail "faults_missing=$faults, expected >= 4242"
expect_contains "$json" '"region_bytes": 4294967296' "stats --json"
expect_contains "$json" '"base": 139637976727552' "stats --json region row"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["processes"][0]["histograms"]["fault_latency"]["count"] >= 0' <<<"$json" \
    || fail "stats --json is not valid JSON"
fi
prom=$("$ZRTIER" stats --prometheus); expect_status 0 $? "stats --prometheus"
expect_contains "$prom" "# TYPE zrtier_faults_missing_total counter" "prometheus"
expect_contains "$prom" "zrtier_faults_missing_total{pid=\"$pid\"" "prometheus"
expect_contains "$prom" "zrtier_fault_latency_seconds{pid=\"$pid\",quantile=\"0.99\"}" "prometheus"
"$ZRTIER" stats --json --prometheus >/dev/null 2>&1; expect_status 2 $? "--json excludes --prometheus"
"$ZRTIER" stats 999999999 >/dev/null 2>&1; expect_status 1 $? "stats of a pid without a block"

kill -9 "$pid"; wait "$pid" 2>/dev/null
[[ -f $tmp/zrtier.$pid ]] || fail "SIGKILL should leave the block behind"
out=$("$ZRTIER" stats); expect_status 0 $? "stats after the kill"
expect_contains "$out" "no process" "stats after the kill"
[[ ! -f $tmp/zrtier.$pid ]] || fail "stale block not cleaned up"
echo "PASS"
