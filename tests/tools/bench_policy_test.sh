# Covers `zrtier bench policy`: one JSON row per case and cache fraction with the issue's keys, and
# --by-pass: one row per pass whose hits add up to the same hit ratios as the main table (for
# zrtier, Belady and LRU); a case that does not exist, or --by-pass with --pool, is exit status 2.
source "$(dirname "$0")/lib.sh"

table=$("$ZRTIER" bench policy --passes 6 --json) || fail "bench policy failed"
expect_status 18 "$(grep -c '^{' <<<"$table")" "bench policy --json rows"
for key in '"case": "cyclic_changing"' '"case": "fwdbwd_noisy"' '"cache_fraction": 0.25' \
  '"zrtier":' '"lru":' '"belady":' '"order_known_vs_belady":' \
  '"after_learning_vs_belady":'; do
  expect_contains "$table" "$key" "bench policy --json"
done

passes=$("$ZRTIER" bench policy --passes 6 --by-pass fwdbwd_changing --fraction 0.5 --json) ||
  fail "bench policy --by-pass failed"
expect_status 6 "$(grep -c '^{' <<<"$passes")" "bench policy --by-pass rows"
python3 - "$table" "$passes" <<'PY' || fail "--by-pass does not add up to the table"
import json, sys
rows = list(map(json.loads, sys.argv[1].splitlines()))
if any(r["after_learning_vs_belady"] > 1 for r in rows):
    sys.exit("the after-learning reference beat Belady's optimum")
row = next(r for r in rows
           if r["case"] == "fwdbwd_changing" and r["cache_fraction"] == 0.5)
passes = [json.loads(l) for l in sys.argv[2].splitlines()]
total = sum(p["chunk_accesses"] for p in passes)
for key in ("zrtier", "belady", "lru"):
    ratio = sum(p[key] for p in passes) / total
    if abs(ratio - row[key]) > 0.00006:  # the table prints 4 decimals
        sys.exit(f"{key}: {ratio:.5f} by pass, {row[key]} in the table")
    print(f"{key}: {ratio:.4f} by pass = {row[key]} in the table")
for ref in ("order_known", "after_learning"):
    if sum(p[ref] for p in passes) > sum(p["belady"] for p in passes):
        sys.exit(f"the {ref} reference beat Belady's optimum")
if passes[0]["after_learning"] != passes[0]["zrtier"]:
    sys.exit("the after-learning reference's first pass is not zrtier's")
PY

"$ZRTIER" bench policy --by-pass nonsense 2>/dev/null; expect_status 2 $? "bench policy --by-pass nonsense"
"$ZRTIER" bench policy --by-pass cyclic --pool 2>/dev/null
expect_status 2 $? "bench policy --by-pass with --pool"
"$ZRTIER" bench policy --by-pass cyclic --fraction 2 2>/dev/null
expect_status 2 $? "bench policy --fraction 2"
echo "PASS"
