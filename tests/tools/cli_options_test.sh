# Covers `zrtier options` (text and Markdown, generated from the option table), --help of every
# subcommand, the cpu idle line of `zrtier doctor`, and usage errors (exit status 2).
source "$(dirname "$0")/lib.sh"

out=$("$ZRTIER" options) || fail "zrtier options failed"
expect_contains "$out" "ZRTIER_PINNED_POOL" "options"
expect_contains "$out" "--pool" "options"
md=$("$ZRTIER" options --markdown) || fail "zrtier options --markdown failed"
expect_contains "$md" '| `ZRTIER_CHUNK` | `--chunk` | `256K` |' "options --markdown"
# Every option of the table appears exactly once in the Markdown table (header + separator + rows).
rows=$(grep -c '^| `ZRTIER_' <<<"$md")
text_rows=$(($(wc -l <<<"$out") - 1))
expect_status "$text_rows" "$rows" "options rows (text vs markdown)"

for sub in run options stats top doctor demo bench; do
  help=$("$ZRTIER" "$sub" --help 2>&1) || fail "zrtier $sub --help: exit status $?"
  expect_contains "$help" "Usage:" "zrtier $sub --help"
done
help=$("$ZRTIER" --help) || fail "zrtier --help"
for sub in run options stats top doctor demo bench; do expect_contains "$help" "$sub" "zrtier --help"; done
# Every option with a run flag appears in `zrtier run --help`.
runhelp=$("$ZRTIER" run --help)
for flag in $(grep -o '`--[a-z-]*`' <<<"$md" | tr -d '`'); do
  expect_contains "$runhelp" "$flag" "zrtier run --help"
done

# `zrtier doctor` reports how idle CPUs wait, as this machine's sysfs says.
doc=$("$ZRTIER" doctor 2>&1)
expect_contains "$doc" "verdict:" "zrtier doctor"
expect_contains "$doc" "cpu idle" "zrtier doctor"
if [[ $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null) == haltpoll &&
      $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null) == 0 ]]; then
  expect_contains "$doc" "WARN  cpu idle" "zrtier doctor on a VM whose idle vCPUs halt at once"
else
  expect_contains "$doc" "OK    cpu idle" "zrtier doctor"
fi

"$ZRTIER" 2>/dev/null; expect_status 2 $? "zrtier without a subcommand"
"$ZRTIER" nosuch 2>/dev/null; expect_status 2 $? "zrtier nosuch"
echo "PASS"
