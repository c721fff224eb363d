# Covers `zrtier run`: option values validated (clear message, exit 2), the environment the command
# gets (LD_PRELOAD prepended, ZRTIER_* variables), exit status passthrough, 127 for a missing
# command, 128+N for a signal, and forwarding of SIGTERM/SIGUSR1 to the command.
source "$(dirname "$0")/lib.sh"
export ZRTIER_LIBRARY=$DUMMY_PRELOAD

err=$("$ZRTIER" run --pool 12Q -- true 2>&1); st=$?
expect_status 2 $st "run --pool 12Q"
expect_contains "$err" "--pool" "run --pool 12Q message"
expect_contains "$err" "12Q" "run --pool 12Q message"
expect_contains "$err" "64K" "run --pool 12Q message (accepted form)"
err=$("$ZRTIER" run --chunk 3000 -- true 2>&1); expect_status 2 $? "run --chunk 3000"
expect_contains "$err" "power of two" "run --chunk 3000 message"
err=$("$ZRTIER" run --codec lz5 -- true 2>&1); expect_status 2 $? "run --codec lz5"
expect_contains "$err" "auto|zstd|raw" "run --codec lz5 message"
# A store stack the store would refuse is a bad value up front, and leaves no spill folder.
nospill=$(mktemp -u /tmp/zrtier-nospill.XXXXXX)
err=$("$ZRTIER" run --backend ram+file+zram --spill "$nospill" -- true 2>&1)
expect_status 2 $? "run --backend ram+file+zram"
expect_contains "$err" "ZRTIER_STORE_BACKEND" "run --backend ram+file+zram"
[[ ! -e $nospill ]] || { rm -rf "$nospill"; fail "a refused --backend created the spill folder"; }
err=$("$ZRTIER" run --bogus -- true 2>&1); expect_status 2 $? "run --bogus"
expect_contains "$err" "--bogus" "run --bogus message"
err=$("$ZRTIER" run 2>&1); expect_status 2 $? "run without a command"
expect_contains "$err" "no command" "run without a command"

# (verify_asan_link_order=0: in a sanitizer build, zrtier itself then starts with libm preloaded.)
out=$(LD_PRELOAD=/lib/x86_64-linux-gnu/libm.so.6 ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0 "$ZRTIER" run --pool 2G --resident 25% --verify \
      --verbose --verbose --codec zstd -- sh -c 'echo "P=$LD_PRELOAD"; env | grep "^ZRTIER_" | sort')
expect_status 0 $? "run env"
expect_contains "$out" "P=$DUMMY_PRELOAD:/lib/x86_64-linux-gnu/libm.so.6" "LD_PRELOAD prepended"
expect_contains "$out" "ZRTIER_PINNED_POOL=2G" "env"
expect_contains "$out" "ZRTIER_RESIDENT_LIMIT=25%" "env"
expect_contains "$out" "ZRTIER_VERIFY=1" "env"
expect_contains "$out" "ZRTIER_VERBOSE=2" "env"
expect_contains "$out" "ZRTIER_CODEC=zstd" "env"
[[ "$out" != *ZRTIER_LIBRARY* ]] || fail "ZRTIER_LIBRARY must not reach the command"
# Without "--" the command starts at the first non-option; its own options stay its own.
out=$("$ZRTIER" run --pool 1G sh -c 'echo "args:$0:$1"' --pool x); expect_status 0 $? "run without --"
expect_contains "$out" "args:--pool:x" "command's own options"

"$ZRTIER" run -- sh -c 'exit 3'; expect_status 3 $? "child exit 3"
"$ZRTIER" run -- true; expect_status 0 $? "child exit 0"
err=$("$ZRTIER" run -- /nonexistent/cmd 2>&1); expect_status 127 $? "missing command"
expect_contains "$err" "not found" "missing command message"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo 'echo hi' > "$tmp/noexec"; chmod 644 "$tmp/noexec"
"$ZRTIER" run -- "$tmp/noexec" 2>/dev/null; expect_status 126 $? "non-executable command"
"$ZRTIER" run -- sh -c 'kill -KILL $$'; expect_status 137 $? "child killed by SIGKILL"

# SIGTERM to zrtier reaches the child, which dies of it: 128+15.
"$ZRTIER" run -- sh -c "echo \$\$ > $tmp/pid; exec sleep 30" & zpid=$!
for _ in $(seq 100); do [[ -s $tmp/pid ]] && break; sleep 0.05; done
[[ -s $tmp/pid ]] || fail "child did not start"
kill -TERM $zpid
wait $zpid; expect_status 143 $? "SIGTERM forwarded"

# SIGUSR1 is forwarded to a child that handles it and exits 42.
"$ZRTIER" run -- bash -c "trap 'exit 42' USR1; echo ready > $tmp/ready; while :; do sleep 0.05; done" &
zpid=$!
for _ in $(seq 100); do [[ -s $tmp/ready ]] && break; sleep 0.05; done
[[ -s $tmp/ready ]] || fail "child did not start"
kill -USR1 $zpid
wait $zpid; expect_status 42 $? "SIGUSR1 forwarded"
# A signal zrtier inherits as ignored stays ignored for the command (as without zrtier).
out=$(trap '' USR2; "$ZRTIER" run -- bash -c 'kill -USR2 $$; echo survived'); expect_status 0 $? "ignored SIGUSR2"
expect_contains "$out" "survived" "ignored SIGUSR2 stays ignored"
echo "PASS"
