#!/usr/bin/env bash
# Batch invariance: a prompt's logits are the same bits whether it is fed in one chunk,
# in chunks of 7 rows or token by token (decode), on every SIMD path. This is what keeps
# continuous batching and chunked prefill from changing any answer.
# usage: batch_invariance.sh LMHOST SIMD_PATH MODEL_DIR...
set -u
lmhost=$1
simd=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
for dir in "$@"; do
    name=$(basename "$dir")
    tokens=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt'])))" \
        "$dir/reference.json")
    for chunk in 512 7 1; do
        if ! LMHOST_DEBUG="${LMHOST_DEBUG:+$LMHOST_DEBUG,}simd=$simd" "$lmhost" logits --model "$dir" --tokens "$tokens" --chunk "$chunk" \
            --out "$tmp/$chunk.npy" 2>"$tmp/err"; then
            # a path this CPU (or build) lacks: skipped, as check_model skips it
            if grep -q "cannot run that path" "$tmp/err"; then
                echo "SKIP: $(cat "$tmp/err")"
                exit 77
            fi
            echo "FAIL $name chunk $chunk: $(cat "$tmp/err")"
            fails=$((fails + 1))
        fi
    done
    for chunk in 7 1; do
        if cmp -s "$tmp/512.npy" "$tmp/$chunk.npy"; then
            echo "ok   $name ($simd): chunks of $chunk == one chunk"
        else
            echo "FAIL $name ($simd): chunks of $chunk differ from one chunk"
            fails=$((fails + 1))
        fi
    done
done
exit $((fails > 0))
