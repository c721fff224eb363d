# Covers how a skipped test reaches ctest (tests/testutil/skip.h): a GoogleTest program whose every
# test skipped exits 77 -- ctest's SKIP_RETURN_CODE, "Skipped" -- not 0 ("Passed"); one whose
# tests ran, or skipped only in part, exits 0. As root it also runs the issue's case: the pager's
# tests run by an unprivileged user, to whom userfaultfd is closed, must not count as passed.
source "$(dirname "$0")/lib.sh"
out=$("$STATS_SHM_TEST" --gtest_filter=StatsShmTest.HeaderIsValidated 2>&1)
expect_status 0 $? "a program whose test ran"
out=$(ZRTIER_TEST_SKIP_ALL="checking skip reporting" "$STATS_SHM_TEST" 2>&1)
expect_status 77 $? "a program whose every test skipped (ZRTIER_TEST_SKIP_ALL)"
expect_contains "$out" "checking skip reporting" "the reason of the skip"

[[ $(id -u) == 0 ]] || { echo "PASS (not root: the unprivileged runs are left out)"; exit 0; }
command -v setpriv >/dev/null || { echo "PASS (no setpriv: the unprivileged runs are left out)"; exit 0; }
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
as_nobody test -x "$STATS_SHM_TEST" || { echo "PASS (the build is not readable by nobody)"; exit 0; }
cd /tmp
# Tests that need root skip for nobody: all of them skipped -> 77; one ran -> 0.
out=$(as_nobody "$STATS_SHM_TEST" \
  --gtest_filter='StatsShmTest.WriterUsesNoFileOfAnotherUser:StatsShmTest.NothingOfAnotherUserIsDeleted' 2>&1)
expect_status 77 $? "nobody: every selected test needs root"
expect_contains "$out" "needs root" "nobody: the reason of the skip"
out=$(as_nobody "$STATS_SHM_TEST" \
  --gtest_filter='StatsShmTest.WriterUsesNoFileOfAnotherUser:StatsShmTest.HeaderIsValidated' 2>&1)
expect_status 0 $? "nobody: one test skipped, one ran"
expect_contains "$out" "[  SKIPPED ] StatsShmTest.WriterUsesNoFileOfAnotherUser" "nobody: the skipped test"
# The issue's case: userfaultfd closed to unprivileged users.
if [[ $(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null) == 0 ]] && ! as_nobody test -r /dev/userfaultfd; then
  out=$(as_nobody timeout 250 "$PAGER_TEST" 2>&1)
  expect_status 77 $? "nobody: pager_test without userfaultfd"
  expect_contains "$out" "userfaultfd unavailable" "nobody: pager_test's reason"
fi
echo "PASS"
