# Covers `zrtier bench scan`: it runs each mode, prints one JSON row per (mode, thread count) with
# the documented keys, restores a sequential scan ahead (prefetched > 0), measures the kernel
# baseline (kernel_gbps a number) or says on stderr why it cannot, leaves no swap device or cgroup
# behind, and rejects bad input with exit status 2.
source "$(dirname "$0")/lib.sh"

err=$(mktemp)
trap 'rm -f "$err"' EXIT
out=$("$ZRTIER" bench scan --bytes 64M --resident 8M --threads 1,2 --modes seq,rmw,strided,rand,rand4k \
      --touches 500 --json 2>"$err") || fail "bench scan failed: $(cat "$err")"
rows=$(grep -c '^{' <<<"$out")
expect_status 10 "$rows" "bench scan --json rows"
for key in '"mode": "seq"' '"mode": "rmw"' '"mode": "strided"' '"mode": "rand"' '"mode": "rand4k"' \
    '"threads": 1' '"threads": 2' '"gbps":' '"memcpy_gbps":' '"faults":' '"wp_faults":' '"prefetched":' '"kernel_gbps":'; do
  expect_contains "$out" "$key" "bench scan --json"
done
seq_prefetched=$(grep '"mode": "seq", "threads": 1' <<<"$out" | sed 's/.*"prefetched": \([0-9]*\).*/\1/')
[[ ${seq_prefetched:-0} -gt 0 ]] || fail "a sequential scan was not restored ahead: $out"
# The kernel baseline: a number in every row, or "-" everywhere with the reason on stderr.
kernel=$(sed -n 's/.*"kernel_gbps": \([^,}]*\).*/\1/p' <<<"$out" | sort -u)
if grep -q "no kernel baseline" "$err"; then
  [[ $kernel == '"-"' ]] || fail "kernel_gbps is '$kernel' although stderr says: $(cat "$err")"
  echo "note: no kernel baseline here: $(cat "$err")"
else
  grep -q '^[0-9][0-9.]*$' <<<"$kernel" || fail "kernel_gbps is not a number: $kernel"
  [[ $(wc -l <<<"$kernel") -ge 2 ]] || fail "one kernel_gbps for every row expected: $kernel"
fi
[[ -z $(ls -d /sys/fs/cgroup/memory/zrtier-bench-* /sys/fs/cgroup/zrtier-bench-* \
        /sys/fs/cgroup/unified/zrtier-bench-* 2>/dev/null) ]] || fail "a bench cgroup was left behind"
if [[ -r /proc/swaps ]] && grep -q "^/dev/zram" /proc/swaps; then
  # Only ours would be a zram swap device at the highest priority, 32767.
  awk '$1 ~ /^\/dev\/zram/ && $5 == 32767' /proc/swaps | grep -q . && fail "a bench swap device was left on"
fi
off=$("$ZRTIER" bench scan --bytes 16M --resident 4M --threads 1 --modes seq --no-kernel --json 2>"$err") ||
  fail "bench scan --no-kernel failed"
expect_contains "$off" '"kernel_gbps": "-"' "bench scan --no-kernel"
grep -q "kernel baseline" "$err" && fail "bench scan --no-kernel tried the kernel baseline: $(cat "$err")"
"$ZRTIER" bench scan --bytes nonsense 2>/dev/null; expect_status 2 $? "bench scan --bytes nonsense"
"$ZRTIER" bench scan --bytes 8M --modes sideways 2>/dev/null; expect_status 2 $? "bench scan --modes sideways"
echo "PASS"
