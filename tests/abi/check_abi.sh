#!/usr/bin/env bash
# A plugin built against ABI 1.0's headers, in DIR, is listed as such and runs its fixture
# through today's host (with the LMHOST OPTIONS given: --backend vulkan).
# usage: check_abi.sh LMHOST CHECK_MODEL DIR MODEL_DIR [LMHOST OPTION...]
set -u
lmhost=$1 check=$2 dir=$3 model=$4
shift 4
fails=0
out=$("$lmhost" plugins --plugin-dir "$dir" 2>&1)
if ! grep -A1 -E "^architecture olmo2 .*\(ABI 1\.0\)" <<<"$out" | grep -q "file: $dir/"; then
    echo "FAIL: the ABI 1.0 build of olmo2 is not the one listed:"
    echo "$out"
    fails=1
fi
"$check" "$lmhost" "$model" f32 auto --plugin-dir "$dir" "$@" || fails=1
exit $fails
