#!/usr/bin/env bash
# The quantized cache (q8, q4) gives the same logits on Vulkan as on the CPU, in prefill
# and (q8) in decode steps: both run the cache plugin's own kernels (C and SPIR-V) on the
# same codes, so they agree as the plain cache's backends do (1e-3 x max |logit|), however
# far 4-bit codes are from the f32 model.
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
        # not 4 bits in decode steps: there the keys and values come from each backend's own
        # matrix-vector sums, and a value that sits on a code's boundary takes either code,
        # a step of 1/15 of its group's range (test_cache_quant checks those kernels on the
        # same inputs)
        codes="q8 q4"
        [ $chunk = 1 ] && codes=q8
        for c in $codes; do
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
