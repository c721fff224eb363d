# Covers the statistics file (ZRTIER_STATS_FILE) end to end: a process under the runtime exits and
# its file (%p expanded) holds its final counters; `zrtier stats FILE` and `--file FILE` print it
# as a table, JSON equal to the file's values and a Prometheus text the strict checker accepts;
# unreadable files fail with exit 1; and the real shim preloaded by `zrtier run --stats-file`
# (over the fake CUDA runtime) leaves a file with the copies and evictions it made.
source "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 is needed to check the JSON"
validate="python3 $(dirname "$0")/prom_validate.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ZRTIER_TEST_STATS_DIR=$tmp

out=$(ZRTIER_STATS_FILE="$tmp/pub.%p.json" "$PUBLISHER" 0.3); expect_status 0 $? "publisher"
pid=$(awk '/^ready/ {print $2}' <<<"$out")
final=$(grep '^final ' <<<"$out")
[[ -n $pid && -n $final ]] || fail "publisher said: $out"
file=$tmp/pub.$pid.json
[[ -f $file ]] || fail "no statistics file at $file: $(ls "$tmp")"
[[ $(stat -c %a "$file") == 600 ]] || fail "mode $(stat -c %a "$file"), expected 600"
[[ -z $(ls "$tmp" | grep -v "^pub.$pid.json$") ]] || fail "left behind: $(ls "$tmp")"

# The file holds the counters the process had when it exited.
python3 - "$file" "$final" "$pid" <<'PY' || fail "the file's values"
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
want = dict(kv.split("=") for kv in sys.argv[2].split()[1:])
for k, v in want.items():
    assert d["stats"][k] == int(v), (k, d["stats"][k], v)
assert d["pid"] == int(sys.argv[3]) and d["final"] is True
assert d["stats"]["region_bytes"] == 4 << 30
h = d["histograms"]["fault_latency"]
assert sum(h["buckets"]) * 20000 == h["sum_ns"] > 0, h
assert d["regions"] == [{"base": 0x7f0000000000, "size": 4 << 30, "resident_bytes": 0,
                         "stored_raw_bytes": 0, "stored_bytes": 0}], d["regions"]
PY

text=$("$ZRTIER" stats "$file"); expect_status 0 $? "stats FILE"
expect_contains "$text" "pid $pid  ran " "stats FILE"
expect_contains "$text" "exited (final statistics)" "stats FILE"
expect_contains "$text" "faults_missing" "stats FILE"
expect_contains "$text" "stats_publisher" "stats FILE (command line)"
json=$("$ZRTIER" stats --file "$file" --json); expect_status 0 $? "stats --file --json"
printf '%s\n' "$json" >"$tmp/saved.json"
# What zrtier stats prints from the file is what the runtime wrote, value for value.
python3 - "$file" "$tmp/saved.json" <<'PY' || fail "stats --file --json differs from the file"
import json, sys
f = json.load(open(sys.argv[1], encoding="utf-8"))
p = json.load(open(sys.argv[2], encoding="utf-8"))["processes"]
assert len(p) == 1, p
p = p[0]
for k in ("pid", "pid_ns", "cmdline", "version", "start_unix_ns", "taken_unix_ns", "final",
          "stats", "regions"):
    assert p[k] == f[k], (k, p[k], f[k])
for name, h in f["histograms"].items():
    assert p["histograms"][name]["buckets"] == h["buckets"], name
    assert p["histograms"][name]["sum_ns"] == h["sum_ns"], name
    assert p["histograms"][name]["count"] == sum(h["buckets"]), name
PY
# Saved --json output reads back too.
again=$("$ZRTIER" stats --json "$tmp/saved.json"); expect_status 0 $? "stats of saved --json"
[[ "$again" == "$json" ]] || fail "saved --json does not read back the same"

prom=$("$ZRTIER" stats --prometheus --file "$file"); expect_status 0 $? "stats --file --prometheus"
$validate --labels pid,cmd --except zrtier_build_info <<<"$prom" >/dev/null || fail "prometheus text"
faults=$(sed -n 's/^final .*faults_missing=\([0-9]*\).*/\1/p' <<<"$final")
expect_contains "$prom" "zrtier_faults_missing_total{pid=\"$pid\",cmd=\"" "prometheus"
grep -q "^zrtier_faults_missing_total{pid=\"$pid\",.*} $faults\$" <<<"$prom" || fail "faults in prometheus"
grep -q "^zrtier_process_exited{pid=\"$pid\",.*} 1\$" <<<"$prom" || fail "exited in prometheus"

"$ZRTIER" stats --file "$tmp/none.json" >/dev/null 2>&1; expect_status 1 $? "a missing file"
echo '{"pid": 1}' >"$tmp/bad.json"
err=$("$ZRTIER" stats "$tmp/bad.json" 2>&1 >/dev/null); expect_status 1 $? "a file without stats"
expect_contains "$err" "not a zrtier statistics file" "a file without stats"
printf '{"pid": 1, "stats": {}' >"$tmp/cut.json"
"$ZRTIER" stats "$tmp/cut.json" >/dev/null 2>&1; expect_status 1 $? "a truncated file"

# The real shim, preloaded by zrtier run, over the fake CUDA runtime.
if [[ -n ${PRELOAD_TEST:-} ]]; then
  ZRTIER_STATS=0 "$ZRTIER" run --pool 512K --resident 2M --min-alloc 1M \
    --stats-file "$tmp/shim.%p.json" -- "$PRELOAD_TEST" \
    --gtest_filter=Preload.RegionRoundTripExactBytes:Preload.ColdDataBeyondTheResidentLimit \
    >"$tmp/preload.log" 2>&1 || { cat "$tmp/preload.log" >&2; fail "preload_test under zrtier run"; }
  shim=$(ls "$tmp"/shim.*.json 2>/dev/null)
  [[ $(wc -w <<<"$shim") == 1 ]] || fail "expected one shim statistics file, got: $shim"
  python3 - "$shim" <<'PY' || fail "the shim's statistics file"
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
s = d["stats"]
assert "preload_test" in d["cmdline"], d["cmdline"]
assert s["h2d_copies"] >= 2 and s["h2d_bytes"] >= 6 << 20, s
assert s["d2h_copies"] >= 1, s
assert s["evictions"] > 0 and s["faults_missing"] + s["faults_zero"] > 0, s
PY
  "$ZRTIER" stats --prometheus "$shim" | $validate --labels pid,cmd --except zrtier_build_info \
    >/dev/null || fail "prometheus text of the shim's file"
fi
echo "PASS"
