#!/usr/bin/env bash
# lmhost check-plugin, the authors' conformance kit: passes the olmo2 example on its fixture
# (with transformers' hidden states), names layer 1 as the first that differs when that
# layer's weights are perturbed (a bug an author would have), and refuses bad arguments.
# usage: check_plugin.sh LMHOST PLUGIN FIXTURE_DIR
set -u
lmhost=$1 plugin=$2 fixture=$3
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$lmhost" check-plugin --plugin "$plugin" --fixture "$fixture" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "exit $rc on a correct plugin"
grep -q "^check-plugin: PASS$" <<<"$out" || fail "no PASS line"
grep -q "^layer 2: max |d| = " <<<"$out" || fail "no per-layer comparison"
grep -q "^greedy: 12/12 tokens equal$" <<<"$out" || fail "greedy tokens not compared"

# The same fixture with layer 1's MLP output norm scaled by 1.5.
cp -r "$fixture" "$tmp/bad"
python3 - "$tmp/bad/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
t = json.loads(raw[8:8 + n])["model.layers.1.post_feedforward_layernorm.weight"]
assert t["dtype"] == "F32"
a, b = (8 + n + o for o in t["data_offsets"])
vals = struct.unpack("<%df" % ((b - a) // 4), raw[a:b])
raw[a:b] = struct.pack("<%df" % len(vals), *(v * 1.5 for v in vals))
open(path, "wb").write(raw)
PY
out=$("$lmhost" check-plugin --plugin="$plugin" --fixture="$tmp/bad" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 1 ] || fail "exit $rc on a model that differs"
grep -q "^layers: the first layer that differs is 1$" <<<"$out" || fail "layer 1 not named"
grep -q "^layer 0: .*ratio [0-9.e-]*)$" <<<"$out" || fail "layer 0 should still agree"
grep -q "^check-plugin: FAIL$" <<<"$out" || fail "no FAIL line"

# Bad arguments: clear errors, never a crash.
expect() { # exit-code pattern args...
    local want=$1 pat=$2
    shift 2
    local o
    o=$("$lmhost" check-plugin "$@" 2>&1)
    local r=$?
    [ $r -eq "$want" ] || fail "check-plugin $*: exit $r, want $want"
    grep -qE -- "$pat" <<<"$o" || fail "check-plugin $*: no line matching '$pat' in: $o"
}
expect 2 "--plugin FILE and --fixture DIR are required" --fixture "$fixture"
expect 1 "cannot open --plugin $tmp/none.so" --plugin "$tmp/none.so" --fixture "$fixture"
expect 1 "cannot read $tmp/empty/reference.json" --plugin "$plugin" --fixture "$tmp/empty"
expect 2 "--tolerance must be a number" --plugin "$plugin" --fixture "$fixture" --tolerance x
exit $((fails > 0))
