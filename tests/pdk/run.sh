#!/usr/bin/env bash
# The plugin development kit as an outside author meets it: installs lmhost into a
# temporary prefix, copies examples/plugins/* out of the source tree, builds each family
# there against that prefix alone (pkg-config lmhost-plugin; once with its meson.build,
# installed into the prefix's plugin directory, once with its Makefile), and runs the
# families' fixtures through the installed host on the CPU and on Vulkan (lavapipe).
# usage: tests/pdk/run.sh CHECK_MODEL [WORKDIR]
#   CHECK_MODEL: tests/conformance/check_model from a build of this tree
#   WORKDIR: where the prefix and the builds go (a new temporary directory by default)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
check=$(realpath "$1")
work=${2:-$(mktemp -d)}
mkdir -p "$work"
work=$(realpath "$work")
prefix=$work/prefix
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

echo "--- install into $prefix"
meson setup "$work/build" "$src" --prefix "$prefix" -Dbuildtype=release -Dtests=false \
    >"$work/setup.log" || { cat "$work/setup.log"; exit 1; }
ninja -C "$work/build" >"$work/build.log" || { tail -30 "$work/build.log"; exit 1; }
meson install -C "$work/build" --quiet >/dev/null
lmhost=$prefix/bin/lmhost
# a package's staged install: the same tree under DESTDIR
DESTDIR=$work/stage meson install -C "$work/build" --quiet >/dev/null
for f in bin/lmhost include/lmhost/lmhost.h; do
    [ -f "$work/stage$prefix/$f" ] || fail "DESTDIR install lacks $f"
done
[ -n "$(find "$work/stage$prefix" -name lmhost-backend-cpu.so -path '*/lmhost/plugins/*')" ] ||
    fail "DESTDIR install lacks the plugins"
rm -rf "$work/stage"

pc=$(find "$prefix" -name lmhost-plugin.pc | head -1)
[ -n "$pc" ] || { echo "FAIL: no lmhost-plugin.pc under $prefix"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
plugindir=$(pkg-config --variable=plugindir lmhost-plugin)
abi=$(pkg-config --variable=abi_version lmhost-plugin)
[ -f "$(pkg-config --variable=includedir lmhost-plugin)/lmhost/lmhost.h" ] || fail "headers not installed"
[ -f "$(pkg-config --variable=includedir lmhost-plugin)/lmhost/toolcall.h" ] || fail "toolcall.h not installed"
"$lmhost" --version | grep -q "plugin ABI $abi)" || fail "lmhost-plugin.pc says ABI $abi, the host: $("$lmhost" --version)"
# The installed host finds the installed plugins by default, and nothing of the build tree.
listed=$("$lmhost" plugins 2>&1)
grep -q "file: $plugindir/lmhost-backend-cpu.so" <<<"$listed" || fail "installed plugins not listed: $listed"
grep -q "file: $plugindir/lmhost-toolcall-hermes.so" <<<"$listed" ||
    fail "installed tool-call plugins not listed: $listed"
if grep -q "file: $src\|file: $work/build" <<<"$listed"; then fail "the installed host loads build-tree plugins"; fi

echo "--- build the examples outside the tree"
cp -r "$src/examples/plugins" "$work/examples"
families=()
for dir in "$work"/examples/*/; do
    fam=$(basename "$dir")
    [ -f "$dir/$fam.c" ] || continue
    families+=("$fam")
    if ! { meson setup "$work/ex-$fam" "$dir" && ninja -C "$work/ex-$fam" &&
        meson install -C "$work/ex-$fam" --quiet; } >"$work/ex-$fam.log" 2>&1; then
        cat "$work/ex-$fam.log"
        fail "$fam: meson build"
    fi
    grep -i "warning" "$work/ex-$fam.log" && fail "$fam: warnings"
    mkdir -p "$work/mk-$fam"
    cp "$dir"/* "$work/mk-$fam/"
    make -s -C "$work/mk-$fam" CFLAGS="-O2 -Wall -Wextra -Werror" >"$work/mk-$fam.log" 2>&1 ||
        { cat "$work/mk-$fam.log"; fail "$fam: make"; }
    rm -f "$work/mk-$fam"/*.c # the directory is now a plugin directory
done
echo "families: ${families[*]}"
listed=$("$lmhost" plugins 2>&1)
have_vulkan=0
grep -q "^backend vulkan" <<<"$listed" && have_vulkan=1

echo "--- fixtures through the installed host"
for fam in "${families[@]}"; do
    grep -q "file: $plugindir/lmhost-arch-$fam.so" <<<"$listed" || fail "$fam: not listed from $plugindir"
    for fx in "$src"/tests/data/models/"$fam" "$src"/tests/data/models/"$fam"[_-]*; do
        [ -f "$fx/reference.json" ] || continue
        # the meson-installed plugin, found in the default path
        "$check" "$lmhost" "$fx" f32 auto || fail "$(basename "$fx") (cpu)"
        if [ $have_vulkan = 1 ]; then
            "$check" "$lmhost" "$fx" f32 auto --backend vulkan || fail "$(basename "$fx") (vulkan)"
        fi
        # the Makefile's build, given with --plugin-dir (it wins over the installed one)
        "$check" "$lmhost" "$fx" f32 auto --plugin-dir "$work/mk-$fam" ||
            fail "$(basename "$fx") (cpu, Makefile build)"
    done
done
[ ${#families[@]} -gt 0 ] || fail "no example family found"
echo "pdk: $fails failures"
[ $fails -eq 0 ] && [ -z "${2:-}" ] && rm -rf "$work"
exit $((fails > 0))
