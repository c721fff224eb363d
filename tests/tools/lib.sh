# Helpers for the tools tests: fail/expect with a message, a private stats directory.
set -u
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
expect_status() {  # expect_status WANT GOT WHAT
  [[ "$1" == "$2" ]] || fail "$3: exit status $2, expected $1"
}
expect_contains() {  # expect_contains HAYSTACK NEEDLE WHAT
  [[ "$1" == *"$2"* ]] || fail "$3: output lacks '$2'; got:
$1"
}
