# Covers zrtier-top as a user sees it: in a real terminal (tmux, 120x40) against a live
# `zrtier demo`, the screen shows the demo's process and tiers, the numbers change between two
# captures, h shows the help, s/r sort (with the marker), / filters, a resize re-lays the frame
# out, and q quits (the pane closes).
source "$(dirname "$0")/lib.sh"
command -v tmux >/dev/null || skip "tmux is not installed"
tmp=$(mktemp -d)
export ZRTIER_TEST_STATS_DIR=$tmp
sock="zrtier-top-test-$$"
T() { tmux -L "$sock" "$@"; }
demo=
cleanup() { T kill-server 2>/dev/null; [[ -n $demo ]] && kill "$demo" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

"$ZRTIER" demo --gib 0.25 --layer-mib 16 --seconds 120 --quiet >"$tmp/demo.out" 2>&1 & demo=$!
for _ in $(seq 200); do [[ -f $tmp/zrtier.$demo ]] && break; sleep 0.05; done
if [[ ! -f $tmp/zrtier.$demo ]]; then
  if grep -q "cannot start the engine" "$tmp/demo.out"; then skip "zrtier demo: $(cat "$tmp/demo.out")"; fi
  fail "zrtier demo published no statistics: $(cat "$tmp/demo.out")"
fi

T new-session -d -s top -x 120 -y 40 \
  "env ZRTIER_TEST_STATS_DIR=$tmp LANG=C.UTF-8 LC_ALL=C.UTF-8 $ZRTIER_TOP --interval 0.5"
capture() { T capture-pane -p -t top; }
screen=
# Until a whole frame is on screen: a capture can land while top is still drawing one (the CI run
# of 2026-11-22 caught the frame down to "Copies", before the "Faults" line).
for _ in $(seq 100); do
  screen=$(capture)
  [[ "$screen" == *"T1 resident"* && "$screen" == *"Faults"* ]] && break
  sleep 0.1
done
expect_contains "$screen" "zrtier-top  1 process" "header"
expect_contains "$screen" " $demo " "process row"
expect_contains "$screen" "zrtier demo" "command"
expect_contains "$screen" "T2 store" "tiers"
expect_contains "$screen" "Faults" "faults line"
expect_contains "$screen" "▕" "UTF-8 bars in a UTF-8 locale"
# The numbers (everything below the header and title lines) change while the demo runs.
numbers() { grep -E '^( *>|  T|Compression|Copies|Faults|Evictions|Spill|  [a-zA-Z0-9]+ +)' <<<"$1"; }
first=$(numbers "$screen")
changed=
for _ in $(seq 40); do
  sleep 0.5
  second=$(numbers "$(capture)")
  [[ "$first" != "$second" ]] && { changed=1; break; }
done
[[ -n $changed ]] || fail "the numbers did not change in 20 s:
$first"

T send-keys -t top h; sleep 0.5
expect_contains "$(capture)" "select a process" "help screen"
T send-keys -t top x; sleep 0.5
[[ "$(capture)" != *"select a process"* ]] || fail "any key should close the help"

T send-keys -t top s; sleep 0.5
screen=$(capture)
expect_contains "$screen" "sort: resident" "s changes the sort key"
expect_contains "$screen" "▼RESIDENT" "sort marker on the sorted column"
T send-keys -t top r; sleep 0.5
expect_contains "$(capture)" "▲RESIDENT" "r reverses the order"
T send-keys -t top r; sleep 0.5
# The filter: a substring of the command keeps the demo, another hides it; Esc clears it.
T send-keys -t top / d e m o Enter; sleep 0.5
screen=$(capture)
expect_contains "$screen" "filter: demo" "filter shown"
expect_contains "$screen" " $demo " "the filter keeps the demo"
T send-keys -t top / x y z; sleep 0.5
screen=$(capture)
expect_contains "$screen" "Filter (Enter keeps, Esc clears): demoxyz_" "filter prompt"
expect_contains "$screen" "no process matches the filter" "the filter hides the demo"
T send-keys -t top Escape; sleep 0.7
screen=$(capture)
[[ "$screen" != *"filter:"* ]] || fail "Esc should clear the filter: $screen"
expect_contains "$screen" " $demo " "the demo is back"
T send-keys -t top p; sleep 0.5
expect_contains "$(capture)" "[PAUSED]" "p pauses"
T send-keys -t top p; sleep 0.5
[[ "$(capture)" != *"[PAUSED]"* ]] || fail "p again resumes"

T resize-window -t top -x 90 -y 30 2>/dev/null || T resize-pane -t top -x 90 -y 30
sleep 1
screen=$(capture)
header=$(head -1 <<<"$screen")
[[ "$header" == *"h help  q quit" ]] || fail "header not re-laid out for 90 columns: '$header'"
(( ${#header} <= 90 )) || fail "header wider than the window (${#header})"

T send-keys -t top q
for _ in $(seq 50); do T has-session -t top 2>/dev/null || break; sleep 0.1; done
T has-session -t top 2>/dev/null && fail "q did not quit zrtier-top"
echo "PASS"
