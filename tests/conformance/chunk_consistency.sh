#!/usr/bin/env bash
# A prompt fed in one chunk, in chunks of 7 and token by token gives the same logits within
# a tolerance, for backends that are not bit-exact across step sizes: a recurrent model on a
# GPU takes the chunked (matrix) form of its scans for long steps and the one-step form for
# short ones. usage: chunk_consistency.sh LMHOST COMPARE_LOGITS TOL MODEL_DIR [lmhost options]
set -u
lmhost=$1 compare=$2 tol=$3 dir=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tokens=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt'])))" \
    "$dir/reference.json")
for chunk in 512 7 1; do
    "$lmhost" logits --model "$dir" --tokens "$tokens" --chunk "$chunk" --out "$tmp/$chunk.npy" "$@" \
        >/dev/null 2>"$tmp/err" || {
        echo "FAIL $(basename "$dir") chunk $chunk: $(cat "$tmp/err")"
        exit 1
    }
done
fails=0
for chunk in 7 1; do
    if out=$("$compare" "$tmp/$chunk.npy" "$tmp/512.npy" "$tol" 2>&1); then
        echo "ok   $(basename "$dir"): chunks of $chunk against one chunk: $out"
    else
        echo "FAIL $(basename "$dir"): chunks of $chunk against one chunk: $out"
        fails=$((fails + 1))
    fi
done
exit $((fails > 0))
