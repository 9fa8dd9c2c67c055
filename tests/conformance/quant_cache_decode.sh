#!/usr/bin/env bash
# The quantized cache's decode attention (the plugin's kernel over the codes, on a model
# whose heads it takes: 64 values) against its dequantized copy with the backend's
# attention op: `logits --chunk 1` makes every token a decode step. Both read the same
# codes, so they agree to f32 rounding (1e-4 x max |logit|); and 8 bits stays within
# 4e-2 of the f32 cache.
# usage: quant_cache_decode.sh LMHOST COMPARE_LOGITS MODEL_DIR [LMHOST OPTION...]
set -u
lmhost=$1 cmp=$2 dir=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ids=$(seq -s, 3 5 250)
run() { # OUT CACHE [ENV...]
    local out=$1 cache=$2
    shift 2
    env "$@" "$lmhost" logits --model "$dir" --tokens "$ids" --chunk 1 --cache "$cache" \
        --out "$tmp/$out.npy" "${extra[@]}" > "$tmp/log" 2>&1 || { cat "$tmp/log"; echo "FAIL: $out"; exit 1; }
}
extra=("$@")
fail=0
run plain plain
for c in q8 q4; do
    run "$c" "$c"
    run "$c-copy" "$c" LMHOST_DEBUG="${LMHOST_DEBUG:+$LMHOST_DEBUG,}cq-dequant"
    printf '%s, kernel against copy: ' "$c"
    "$cmp" "$tmp/$c.npy" "$tmp/$c-copy.npy" 1e-4 || fail=1
done
printf 'q8 against the f32 cache: '
"$cmp" "$tmp/q8.npy" "$tmp/plain.npy" 4e-2 || fail=1
[ $fail = 0 ] && echo "ok" || { echo "FAIL"; exit 1; }
