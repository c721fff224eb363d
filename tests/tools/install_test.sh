# Covers the installation: `cmake --install` puts zrtier and zrtier-top in bin/, libzrtier.so in
# lib/ and the public headers in include/zrtier/; the installed zrtier prints its version and
# `zrtier run` preloads the installed library (found next to bin/).
source "$(dirname "$0")/lib.sh"

prefix=$(mktemp -d /tmp/zrtier-install-test.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
"$CMAKE" --install "$BUILD_DIR" --prefix "$prefix" >/dev/null || fail "cmake --install failed"
for f in bin/zrtier bin/zrtier-top lib/libzrtier.so include/zrtier/options.h include/zrtier/stats.h \
    include/zrtier/version.h include/zrtier/control.h; do
  [[ -e $prefix/$f ]] || fail "not installed: $f"
done
out=$("$prefix/bin/zrtier" --version) || fail "zrtier --version failed"
expect_contains "$out" "zrtier " "zrtier --version"
out=$("$prefix/bin/zrtier-top" --version) || fail "zrtier-top --version failed"
expect_contains "$out" "zrtier-top " "zrtier-top --version"
out=$(env -u ZRTIER_LIBRARY "$prefix/bin/zrtier" run -- sh -c 'echo "$LD_PRELOAD"') || fail "zrtier run failed"
expect_contains "$out" "$prefix/lib/libzrtier.so" "zrtier run's LD_PRELOAD"
echo "PASS"
