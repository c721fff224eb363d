# Covers `zrtier bench scan`: it runs each mode, prints one JSON row per (mode, thread count) with
# the documented keys, restores a sequential scan ahead (prefetched > 0), and rejects bad input
# with exit status 2.
source "$(dirname "$0")/lib.sh"

out=$("$ZRTIER" bench scan --bytes 64M --resident 8M --threads 1,2 --modes seq,rmw,strided,rand,rand4k \
      --touches 500 --json) || fail "bench scan failed"
rows=$(grep -c '^{' <<<"$out")
expect_status 10 "$rows" "bench scan --json rows"
for key in '"mode": "seq"' '"mode": "rmw"' '"mode": "strided"' '"mode": "rand"' '"mode": "rand4k"' \
    '"threads": 1' '"threads": 2' '"gbps":' '"memcpy_gbps":' '"faults":' '"prefetched":' '"kernel_gbps":'; do
  expect_contains "$out" "$key" "bench scan --json"
done
seq_prefetched=$(grep '"mode": "seq", "threads": 1' <<<"$out" | sed 's/.*"prefetched": \([0-9]*\).*/\1/')
[[ ${seq_prefetched:-0} -gt 0 ]] || fail "a sequential scan was not restored ahead: $out"
"$ZRTIER" bench scan --bytes nonsense 2>/dev/null; expect_status 2 $? "bench scan --bytes nonsense"
"$ZRTIER" bench scan --bytes 8M --modes sideways 2>/dev/null; expect_status 2 $? "bench scan --modes sideways"
echo "PASS"
