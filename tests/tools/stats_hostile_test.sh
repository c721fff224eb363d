# Covers `zrtier stats` and zrtier-top against hostile files and processes in the stats directory:
# a block is mode 0600; escape sequences in a command line never reach the terminal raw (text,
# Prometheus and zrtier-top output; JSON escapes them); a FIFO named like a block stops neither
# reader; and a reader deletes nothing that is not a stale block of its own user (another user's
# block of a dead process, a symlink).
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
export ZRTIER_TEST_STATS_DIR=$tmp
# ESC ] (set the window title) ... BEL, ESC [ (CSI: clear the screen), and the C1 CSI in UTF-8.
evil=$'\e]0;pwned\a\e[2J\xc2\x9b31m'
coproc PUB { exec "$PUBLISHER" 60 "$evil"; }
pid=; trap '[[ -n $pid ]] && kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
read -r word pid <&"${PUB[0]}" || fail "publisher did not start"
[[ "$word" == ready ]] || fail "publisher said '$word'"

# Row 10 of the hardening issue: the block (and the command line in it) is for its owner only.
[[ $(stat -c %a "$tmp/zrtier.$pid") == 600 ]] || fail "block mode $(stat -c %a "$tmp/zrtier.$pid"), expected 600"

# Row 10: escape sequences in the command line.
raw() { [[ "$1" == *$'\e'* || "$1" == *$'\a'* || "$1" == *$'\xc2\x9b'* ]]; }
out=$("$ZRTIER" stats 2>&1); expect_status 0 $? "stats"
expect_contains "$out" "pid $pid" "stats text"
expect_contains "$out" "?]0;pwned??[2J?31m" "stats text (command line, controls replaced)"
raw "$out" && fail "stats text prints the command line's escape sequences raw"
prom=$("$ZRTIER" stats --prometheus 2>&1); expect_status 0 $? "stats --prometheus"
raw "$prom" && fail "stats --prometheus prints the command line's escape sequences raw"
json=$("$ZRTIER" stats --json 2>&1); expect_status 0 $? "stats --json"
raw "$json" && fail "stats --json prints the command line's escape sequences raw"
expect_contains "$json" '\u001b]0;pwned\u0007\u001b[2J\u009b31m' "stats --json (escaped)"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; d=json.load(sys.stdin); assert "\x1b]0;pwned" in d["processes"][0]["cmdline"]' <<<"$json" \
    || fail "stats --json is not valid JSON or lost the command line: $json"
fi
top=$("$ZRTIER_TOP" --once --interval 0.2 2>&1); expect_status 0 $? "zrtier-top --once"
expect_contains "$top" "$pid" "zrtier-top --once"
raw "$top" && fail "zrtier-top --once prints the command line's escape sequences raw"

# Row 7: a FIFO named like a block (of a live pid: ours) stops neither reader.
mkfifo "$tmp/zrtier.$$"
out=$(timeout 10 "$ZRTIER" stats 2>&1); status=$?
[[ $status != 124 ]] || fail "zrtier stats hangs on a FIFO"
expect_status 0 $status "stats with a FIFO"
expect_contains "$out" "pid $pid" "stats with a FIFO"
expect_contains "$out" "not a regular file" "stats with a FIFO (reported)"
out=$(timeout 10 "$ZRTIER_TOP" --once --interval 0.2 2>&1); status=$?
[[ $status != 124 ]] || fail "zrtier-top hangs on a FIFO"
expect_status 0 $status "zrtier-top --once with a FIFO"
[[ -p $tmp/zrtier.$$ ]] || fail "the FIFO was deleted"
rm -f "$tmp/zrtier.$$"

# Row 8: nothing but a stale block of our own user is deleted.
kill -9 "$pid"; wait "$pid" 2>/dev/null
[[ -f $tmp/zrtier.$pid ]] || fail "SIGKILL should leave the block behind"
ln -s "$tmp/zrtier.$pid" "$tmp/zrtier.999999999"  # a symlink named for a pid with no process
if [[ $(id -u) == 0 ]]; then
  chown 65534:65534 "$tmp/zrtier.$pid"  # another user's block of a dead process
  "$ZRTIER" stats >/dev/null 2>&1; expect_status 0 $? "stats"
  "$ZRTIER_TOP" --once --interval 0.2 >/dev/null 2>&1; expect_status 0 $? "zrtier-top --once"
  [[ -f $tmp/zrtier.$pid ]] || fail "another user's block was deleted"
  chown 0:0 "$tmp/zrtier.$pid"
fi
out=$("$ZRTIER" stats 2>&1); expect_status 0 $? "stats after the kill"
expect_contains "$out" "no process" "stats after the kill"
[[ ! -f $tmp/zrtier.$pid ]] || fail "our own stale block not cleaned up"
[[ -L $tmp/zrtier.999999999 ]] || fail "a symlink was deleted"
echo "PASS"
