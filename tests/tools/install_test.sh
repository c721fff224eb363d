# Covers the installation: `cmake --install` puts zrtier and zrtier-top in bin/, libzrtier.so in
# lib/, the public headers in include/zrtier/ and the man pages in share/man/man1/ (which name
# every subcommand and option, and render without a groff warning); the installed zrtier prints
# its version and `zrtier run` preloads the installed library (found next to bin/).
source "$(dirname "$0")/lib.sh"

prefix=$(mktemp -d /tmp/zrtier-install-test.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
"$CMAKE" --install "$BUILD_DIR" --prefix "$prefix" >/dev/null || fail "cmake --install failed"
for f in bin/zrtier bin/zrtier-top lib/libzrtier.so include/zrtier/options.h include/zrtier/stats.h \
    include/zrtier/version.h include/zrtier/control.h share/man/man1/zrtier.1 \
    share/man/man1/zrtier-top.1; do
  [[ -e $prefix/$f ]] || fail "not installed: $f"
done
man1=$prefix/share/man/man1
for sub in run options stats top doctor demo bench "bench scan" "bench codec"; do
  grep -q "^\.SS zrtier $sub\$" "$man1/zrtier.1" || fail "zrtier.1 has no section for zrtier $sub"
done
for var in $("$prefix/bin/zrtier" options | awk 'NR > 1 {print $1}'); do
  grep -q "$var" "$man1/zrtier.1" || fail "zrtier.1 does not name $var"
done
grep -q -- "--interval" "$man1/zrtier-top.1" || fail "zrtier-top.1 does not name --interval"
if command -v groff >/dev/null; then
  for page in zrtier.1 zrtier-top.1; do
    warn=$(groff -man -Tutf8 -ww -z "$man1/$page" 2>&1)
    [[ -z $warn ]] || fail "groff warns about $page: $warn"
  done
fi
out=$("$prefix/bin/zrtier" --version) || fail "zrtier --version failed"
expect_contains "$out" "zrtier " "zrtier --version"
out=$("$prefix/bin/zrtier-top" --version) || fail "zrtier-top --version failed"
expect_contains "$out" "zrtier-top " "zrtier-top --version"
out=$(env -u ZRTIER_LIBRARY "$prefix/bin/zrtier" run -- sh -c 'echo "$LD_PRELOAD"') || fail "zrtier run failed"
expect_contains "$out" "$prefix/lib/libzrtier.so" "zrtier run's LD_PRELOAD"
echo "PASS"
