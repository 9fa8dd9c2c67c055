#!/usr/bin/env bash
# A sliding-window layer's cache stays at `window` positions: generate 4x the window on
# the mistral fixture (window 8) and read the rows each layer holds from `lmhost bench`.
# usage: window_cache.sh LMHOST MODEL_DIR
set -u
out=$("$1" bench --model "$2" --prompt 8 --gen 32 --no-bandwidth 2>&1) || { echo "$out"; exit 1; }
echo "$out"
grep -q "sliding-window layers (window 8): 8..8 in 4 layers" <<<"$out" || {
    echo "FAIL: sliding-window layers do not hold exactly 8 positions after 40"
    exit 1
}
# and with a prompt longer than the window in one step, back to 8 once decoding
out=$("$1" bench --model "$2" --prompt 40 --gen 32 --no-bandwidth 2>&1) || { echo "$out"; exit 1; }
grep -q "sliding-window layers (window 8): 8..8 in 4 layers" <<<"$out" || {
    echo "$out"
    echo "FAIL: after a 40-row prefill the ring did not shrink back to the window"
    exit 1
}
echo "ok: 8 rows per sliding-window layer after 72 positions"
