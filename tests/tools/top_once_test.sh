# Covers `zrtier-top --once` and `zrtier top --once`: the plain-text snapshot lists a live process
# (published by a helper) with its tier bytes, rates and latencies, and no terminal escapes or key
# hints; `zrtier-top --version`.
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
export ZRTIER_TEST_STATS_DIR=$tmp
coproc PUB { exec "$PUBLISHER" 60; }
pid=; trap '[[ -n $pid ]] && kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
read -r word pid <&"${PUB[0]}" || fail "publisher did not start"

for top in "$ZRTIER_TOP" "$ZRTIER top"; do
  out=$($top --once --interval 0.5); expect_status 0 $? "$top --once"
  expect_contains "$out" "1 process" "$top --once header"
  expect_contains "$out" "$pid" "$top --once process row"
  expect_contains "$out" "zrtier_stats_publisher" "$top --once command"
  expect_contains "$out" "T1 resident" "$top --once tiers"
  expect_contains "$out" "1.00G  of 2.00G limit" "$top --once resident bytes"
  expect_contains "$out" "ratio 1.50x" "$top --once compression ratio"
  # The publisher adds 1 MiB of H2D per 50 ms (~21 MB/s) and 200 faults/s of ~20 us.
  grep -Eq 'H2D (1[5-9]|2[0-9]) MB/s' <<<"$out" || fail "H2D rate not ~21 MB/s: $out"
  grep -Eq 'Faults +[12][0-9]{2}/s +p50 [0-9.]+us' <<<"$out" || fail "faults/s or p50 missing: $out"
  [[ "$out" != *$'\x1b'* ]] || fail "--once output contains escape sequences"
  [[ "$out" != *"q quit"* ]] || fail "--once output shows key hints: $out"
done
out=$("$ZRTIER_TOP" --version); expect_status 0 $? "zrtier-top --version"
[[ "$out" =~ ^zrtier-top\ [0-9]+\.[0-9]+ ]] || fail "zrtier-top --version: $out"
"$ZRTIER_TOP" --interval 0 --once >/dev/null 2>&1; expect_status 2 $? "--interval 0 is rejected"
"$ZRTIER_TOP" </dev/null >/dev/null 2>&1; expect_status 1 $? "no terminal without --once"
echo "PASS"
