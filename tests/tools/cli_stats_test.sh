# Covers `zrtier stats`: text, --json and --prometheus snapshots of a live process's shared-memory
# block (published by a helper process whose command line is not valid UTF-8), the JSON parsed
# strictly, the Prometheus text checked by a strict parser (prom_validate.py) and served over HTTP
# by --listen until SIGTERM, exit 1 for a PID without statistics, and cleanup of the block of a
# process killed with SIGKILL.
source "$(dirname "$0")/lib.sh"
validate="python3 $(dirname "$0")/prom_validate.py --labels pid,cmd --except zrtier_build_info"
tmp=$(mktemp -d)
export ZRTIER_TEST_STATS_DIR=$tmp
# The extra arguments (ignored by the publisher) put quotes, a backslash, an escape character and
# bytes that are not UTF-8 into its command line.
coproc PUB { exec "$PUBLISHER" 60 'q"uote\' $'\e[31m' $'caf\xc3\xa9\xff\xfe'; }
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
command -v python3 >/dev/null || skip "python3 is needed to check JSON and the Prometheus text"
"$ZRTIER" stats "$pid" --json >"$tmp/stats.json"; expect_status 0 $? "stats --json"
# Strict: the bytes must be UTF-8 (json.load of a UTF-8 file fails otherwise).
python3 - "$tmp/stats.json" "$pid" <<'PY' || fail "stats --json: $(cat "$tmp/stats.json")"
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8", errors="strict"))["processes"][0]
assert d["pid"] == int(sys.argv[2])
assert d["stats"]["faults_missing"] >= 4242, d["stats"]["faults_missing"]
assert d["stats"]["region_bytes"] == 4294967296
assert d["regions"][0]["base"] == 139637976727552
assert d["histograms"]["fault_latency"]["count"] == sum(d["histograms"]["fault_latency"]["buckets"])
assert d["cmdline"].endswith('q"uote\\ \x1b[31m caf\u00e9\ufffd\ufffd'), repr(d["cmdline"])
PY
prom=$("$ZRTIER" stats --prometheus); expect_status 0 $? "stats --prometheus"
$validate <<<"$prom" >/dev/null || fail "stats --prometheus is not valid exposition text"
expect_contains "$prom" "# TYPE zrtier_faults_missing_total counter" "prometheus"
expect_contains "$prom" "zrtier_faults_missing_total{pid=\"$pid\",cmd=\"" "prometheus"
expect_contains "$prom" "# TYPE zrtier_fault_seconds_total counter" "prometheus (ns as seconds)"
expect_contains "$prom" "# TYPE zrtier_fault_latency_seconds histogram" "prometheus"
expect_contains "$prom" 'zrtier_build_info{version="' "prometheus"
# The publisher records fault latencies of 20 us: bucket [16.384, 32.768) us.
printf '%s\n' "$prom" >"$tmp/prom.txt"
python3 - "$pid" "$tmp/prom.txt" <<'PY' || fail "prometheus histogram of the publisher"
import re, sys
pid = sys.argv[1]
text = open(sys.argv[2], encoding="utf-8").read()
def value(pattern):
    m = re.search("^" + pattern + r" (\S+)$", text, re.M)
    assert m, pattern
    return float(m.group(1))
lab = r'zrtier_fault_latency_seconds_(\w+)\{pid="' + pid + r'",cmd="[^\n]*?"'
count = value(lab.replace(r"(\w+)", "count") + r"\}")
assert value(lab.replace(r"(\w+)", "bucket") + r',le="0.000016384"\}') == 0
assert value(lab.replace(r"(\w+)", "bucket") + r',le="0.000032768"\}') == count
assert abs(value(lab.replace(r"(\w+)", "sum") + r"\}") - count * 20e-6) < 1e-9
PY
"$ZRTIER" stats --json --prometheus >/dev/null 2>&1; expect_status 2 $? "--json excludes --prometheus"
"$ZRTIER" stats --listen 127.0.0.1:0 >/dev/null 2>&1; expect_status 2 $? "--listen needs --prometheus"

# --listen: GET /metrics serves the same text; SIGTERM ends it cleanly.
coproc SRV { exec "$ZRTIER" stats --prometheus --listen 127.0.0.1:0; }
srv=$SRV_PID
read -r line <&"${SRV[0]}" || fail "--listen printed nothing"
url=$(grep -o 'http://127.0.0.1:[0-9]*/metrics' <<<"$line") || fail "--listen said '$line'"
python3 - "$url" "$pid" "$tmp/scrape.txt" <<'PY' || fail "scrape of $url"
import sys, urllib.request, urllib.error
url, pid, out = sys.argv[1:]
with urllib.request.urlopen(url, timeout=10) as r:
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
    body = r.read()
open(out, "wb").write(body)
assert f'zrtier_faults_missing_total{{pid="{pid}"'.encode() in body
try:
    urllib.request.urlopen(url.replace("/metrics", "/nope"), timeout=10)
    raise SystemExit("/nope answered")
except urllib.error.HTTPError as e:
    assert e.code == 404, e.code
req = urllib.request.Request(url, data=b"x", method="POST")
try:
    urllib.request.urlopen(req, timeout=10)
    raise SystemExit("POST answered")
except urllib.error.HTTPError as e:
    assert e.code == 405, e.code
PY
$validate <"$tmp/scrape.txt" >/dev/null || fail "the scraped text is not valid exposition text"
kill -TERM "$srv"
for _ in $(seq 50); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
kill -0 "$srv" 2>/dev/null && { kill -9 "$srv"; fail "--listen did not stop on SIGTERM"; }
wait "$srv"; expect_status 0 $? "--listen after SIGTERM"
"$ZRTIER" stats 999999999 >/dev/null 2>&1; expect_status 1 $? "stats of a pid without a block"

kill -9 "$pid"; wait "$pid" 2>/dev/null
[[ -f $tmp/zrtier.$pid ]] || fail "SIGKILL should leave the block behind"
out=$("$ZRTIER" stats); expect_status 0 $? "stats after the kill"
expect_contains "$out" "no process" "stats after the kill"
[[ ! -f $tmp/zrtier.$pid ]] || fail "stale block not cleaned up"
echo "PASS"
