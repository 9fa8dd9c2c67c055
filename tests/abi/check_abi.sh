#!/usr/bin/env bash
# A plugin built against ABI 1.0's headers, in DIR, is listed as such and runs its fixture
# on the CPU and on Vulkan (lavapipe) through today's host.
# usage: check_abi.sh LMHOST CHECK_MODEL DIR MODEL_DIR
set -u
lmhost=$1 check=$2 dir=$3 model=$4
fails=0
out=$("$lmhost" plugins --plugin-dir "$dir" 2>&1)
if ! grep -A1 -E "^architecture olmo2 .*\(ABI 1\.0\)" <<<"$out" | grep -q "file: $dir/"; then
    echo "FAIL: the ABI 1.0 build of olmo2 is not the one listed:"
    echo "$out"
    fails=1
fi
"$check" "$lmhost" "$model" f32 auto --plugin-dir "$dir" || fails=1
if "$lmhost" plugins 2>/dev/null | grep -q "^backend vulkan"; then
    "$check" "$lmhost" "$model" f32 auto --plugin-dir "$dir" --backend vulkan || fails=1
fi
exit $fails
