#!/usr/bin/env bash
# `lmhost bench` counts the work of prefill's matrix products: twice their multiply-adds a
# prompt token, here against the fixtures' shapes.
# - llama: a layer's q 64x128, k and v 64x64, o 128x64, gate, up and down 64x128 make 49152
#   multiply-adds a token (4 layers); the tied head (64x512 = 32768) runs once a chunk, for
#   its last row's logits.
# - qwen3_moe: a layer's attention 24576, the router 64x8 and two of eight experts (gate,
#   up and down 64x64 each) 24576; the head as above.
# usage: bench_flops.sh LMHOST MODELS_DIR
set -u
check() { # model, chunk, want
    out=$("$1" bench --model "$2/$3" --prompt 32 --chunk "$4" --gen 2 --no-bandwidth --no-peak 2>&1) ||
        { echo "$out"; exit 1; }
    grep -q "^prefill matrix products: $5 FLOP a token, " <<<"$out" || {
        echo "$out"
        echo "FAIL: $3, chunks of $4: want $5 FLOP a token"
        exit 1
    }
}
check "$1" "$2" llama 32 $((2 * (4 * 49152 + 32768 / 32)))
check "$1" "$2" llama 8 $((2 * (4 * 49152 + 4 * 32768 / 32)))
check "$1" "$2" qwen3_moe 32 $((2 * (4 * (24576 + 512 + 24576) + 32768 / 32)))
echo "ok: prefill's matrix products counted as the fixtures' shapes make them"
