#!/usr/bin/env bash
# A cache plugin of ABI 1.9 (tests/plugins/old) found first: a model without attention sinks
# runs on it; gpt_oss, whose layers have sinks (ABI 1.10), is refused with a message naming
# the plugin and its ABI, not run without them. Skipped where the gpt_oss plugin is not built.
# usage: check_old_cache.sh LMHOST OLD_PLUGIN_DIR MODELS_DIR
set -u
lmhost=$1
dir=$2
models=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
if ! "$lmhost" logits --model "$models/qwen3" --tokens 1,2,3 --out "$tmp/q.npy" --cache f32 \
    --plugin-dir "$dir" >"$tmp/out" 2>&1; then
    echo "FAIL: qwen3 on the 1.9 cache plugin: $(cat "$tmp/out")"
    fails=$((fails + 1))
fi
if ! "$lmhost" plugins 2>/dev/null | grep -q "gpt_oss"; then
    echo "SKIP: the gpt_oss plugin is not built"
    exit 77
fi
if "$lmhost" logits --model "$models/gpt_oss" --tokens 1,2,3 --out "$tmp/g.npy" --cache f32 \
    --plugin-dir "$dir" >"$tmp/out" 2>&1; then
    echo "FAIL: gpt_oss ran on a cache plugin of ABI 1.9"
    fails=$((fails + 1))
elif ! grep -q "cache plugin plain (plugin ABI 1.9) cannot apply" "$tmp/out"; then
    echo "FAIL: gpt_oss refused without naming the plugin: $(cat "$tmp/out")"
    fails=$((fails + 1))
fi
# and with the plugins of this build it runs
if ! "$lmhost" logits --model "$models/gpt_oss" --tokens 1,2,3 --out "$tmp/g.npy" --cache f32 \
    >"$tmp/out" 2>&1; then
    echo "FAIL: gpt_oss on this build's cache plugin: $(cat "$tmp/out")"
    fails=$((fails + 1))
fi
cat "$tmp/out"
exit $((fails > 0))
