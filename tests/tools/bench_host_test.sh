# Covers `zrtier bench host`: it runs, checks the decoded bytes itself, prints one JSON row per
# thread count with the documented keys, and rejects a bad size with exit status 2.
source "$(dirname "$0")/lib.sh"

out=$("$ZRTIER" bench host --bytes 8M --threads 1 --threads 2 --json) || fail "bench host failed"
rows=$(grep -c '^{' <<<"$out")
expect_status 2 "$rows" "bench host --json rows"
for key in '"threads": 1' '"threads": 2' '"memcpy_gbps":' '"stream_copy_gbps":' '"decode_gbps":' '"decode_gbps_per_thread":' '"engine_read_gbps":'; do
  expect_contains "$out" "$key" "bench host --json"
done
"$ZRTIER" bench host --bytes nonsense 2>/dev/null; expect_status 2 $? "bench host --bytes nonsense"
echo "PASS"
