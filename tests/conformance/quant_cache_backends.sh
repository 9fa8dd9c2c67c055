#!/usr/bin/env bash
# The quantized cache (q8) gives the same logits on Vulkan as on the CPU, in prefill and in
# decode steps: both run the cache plugin's own kernels (C and SPIR-V) on the same codes,
# so they agree as the plain cache's backends do (1e-3 x max |logit|). Not 4 bits: the keys
# and values come from each backend's own sums (products, attention: f32 in different
# orders), and a value on a code's boundary takes either code, a step of 1/15 of its
# group's range, which moved qwen3's logits by 2e-2 once the CPU's attention changed its
# order by 5e-7 (issue 29); test_cache_quant checks the 4-bit kernels on the same inputs.
# usage: quant_cache_backends.sh LMHOST COMPARE_LOGITS MODEL_DIR...
set -u
lmhost=$1 cmp=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for dir in "$@"; do
    # a fixture's prompt, or (a model without a reference) token ids of our own; prefill in
    # one step, then every token a decode step of its own (--chunk 1)
    ids=$(seq -s, 3 5 250)
    [ -f "$dir/reference.json" ] &&
        ids=$(tr -d ' \n' < "$dir/reference.json" | sed -n 's/.*"prompt":\[\([0-9,]*\)\].*/\1/p')
    for chunk in 512 1; do
        for c in q8; do
            for be in cpu vulkan; do
                "$lmhost" logits --model "$dir" --tokens "$ids" --cache "$c" --backend "$be" \
                    --chunk $chunk --out "$tmp/$be.npy" > "$tmp/log" 2>&1 ||
                    { cat "$tmp/log"; echo "FAIL: $be $c $dir"; exit 1; }
            done
            printf '%s %s, chunks of %s: ' "$(basename "$dir")" "$c" "$chunk"
            "$cmp" "$tmp/vulkan.npy" "$tmp/cpu.npy" 1e-3 || fail=1
        done
    done
done
[ $fail = 0 ] && echo "ok" || { echo "FAIL: Vulkan and CPU disagree"; exit 1; }
