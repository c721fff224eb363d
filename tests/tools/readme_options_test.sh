# Covers README.md's option table: it must be exactly what `zrtier options --markdown` prints (the
# option table in include/zrtier/options.h is the single source). To regenerate it:
#   python3 - <<'PY'
#   import re, subprocess
#   t = subprocess.run(["build/tools/zrtier", "options", "--markdown"], capture_output=True, text=True).stdout
#   s = open("README.md").read()
#   s = re.sub(r"(<!-- BEGIN zrtier options --markdown -->\n).*?(<!-- END)", lambda m: m.group(1) + t + m.group(2), s, flags=re.S)
#   open("README.md", "w").write(s)
#   PY
source "$(dirname "$0")/lib.sh"
readme="$(dirname "$0")/../../README.md"
[[ -f $readme ]] || skip "no README.md"
want=$("$ZRTIER" options --markdown)
have=$(sed -n '/^<!-- BEGIN zrtier options --markdown -->$/,/^<!-- END zrtier options --markdown -->$/p' "$readme" | sed '1d;$d')
[[ -n $have ]] || fail "README.md has no generated option table (BEGIN/END markers)"
if [[ "$want" != "$have" ]]; then
  diff <(echo "$have") <(echo "$want") >&2
  fail "README.md's option table is out of date: regenerate it (see the top of $0)"
fi
echo "PASS"
