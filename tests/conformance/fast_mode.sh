#!/usr/bin/env bash
# Fast mode (--precision fast) on MLX-quantized models, CPU backend: int8 activations and
# integer dot products. A prompt's logits are the same bits in one chunk, in chunks of 7
# and token by token (decode against prefill); they differ from exact mode's (so the fast
# kernels really ran) and stay within TOL x max |logit| of them with the same decided
# argmax (compare_logits).
# usage: fast_mode.sh LMHOST COMPARE_LOGITS SIMD_PATH TOL MODEL_DIR...
set -u
lmhost=$1
compare=$2
simd=$3
tol=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
for dir in "$@"; do
    name=$(basename "$dir")
    tokens=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt'])))" \
        "$dir/reference.json")
    for run in exact:512 fast:512 fast:7 fast:1; do
        p=${run%%:*}
        chunk=${run##*:}
        if ! LMHOST_DEBUG="${LMHOST_DEBUG:+$LMHOST_DEBUG,}simd=$simd" "$lmhost" logits --model "$dir" --tokens "$tokens" --chunk "$chunk" \
            --precision "$p" --backend cpu --out "$tmp/$p-$chunk.npy" 2>"$tmp/err"; then
            if grep -q "cannot run that path" "$tmp/err"; then
                echo "SKIP: $(cat "$tmp/err")"
                exit 77
            fi
            echo "FAIL $name $p chunk $chunk: $(cat "$tmp/err")"
            fails=$((fails + 1))
        fi
    done
    for chunk in 7 1; do
        if cmp -s "$tmp/fast-512.npy" "$tmp/fast-$chunk.npy"; then
            echo "ok   $name ($simd, fast): chunks of $chunk == one chunk"
        else
            echo "FAIL $name ($simd, fast): chunks of $chunk differ from one chunk"
            fails=$((fails + 1))
        fi
    done
    if cmp -s "$tmp/exact-512.npy" "$tmp/fast-512.npy"; then
        echo "FAIL $name ($simd): fast mode gave exact mode's bits (the fast kernels did not run)"
        fails=$((fails + 1))
    fi
    if "$compare" "$tmp/exact-512.npy" "$tmp/fast-512.npy" "$tol"; then
        echo "ok   $name ($simd): fast within $tol of exact"
    else
        echo "FAIL $name ($simd): fast against exact"
        fails=$((fails + 1))
    fi
done
exit $((fails > 0))
