#!/usr/bin/env bash
# `lmhost bench` prints what a token costs in the cache (row_bytes, plugin ABI 1.8), summed
# over the layers of every backend's cache, and a sequence's cache at 32768 positions and at
# the bench's context. The fixtures' layers hold 2 K/V heads of 32: 256 bytes of keys and
# 256 of values a position in f32, 2 x (8 + 2) words = 80 bytes each in q8 (a scale and bias
# for the group of 32), 2 x (4 + 2) words = 48 in q4. gemma3's layers 0, 1 and 3 keep a
# window of 8, so they count at most 8 positions.
# usage: bench_cache_bytes.sh LMHOST MODELS_DIR [bench options...]
set -u
lmhost=$1 models=$2
shift 2
check() { # model, bench options (one word), the line wanted
    out=$("$lmhost" bench --model "$models/$1" --prompt 32 --gen 2 --no-bandwidth --no-peak \
        $2 "${@:4}" 2>&1) || { echo "$out"; exit 1; }
    grep -qxF -- "$3" <<<"$out" || {
        grep "^cache" <<<"$out"
        echo "FAIL: $1 $2: want the line '$3'"
        exit 1
    }
    echo "ok: $1 $2: $3"
}
check llama "" "cache f32: 2048 bytes/token (K 1024, V 1024); 64.00 MiB at 32768 tokens, 68.00 KiB at 34 tokens" "$@"
check llama "--cache=q8" "cache q8: 640 bytes/token (K 320, V 320); 20.00 MiB at 32768 tokens, 21.25 KiB at 34 tokens" "$@"
check llama "--cache=quant:q4" "cache quant:q4: 384 bytes/token (K 192, V 192); 12.00 MiB at 32768 tokens, 12.75 KiB at 34 tokens" "$@"
check llama "--cache=f16" "cache f16: 1024 bytes/token (K 512, V 512); 32.00 MiB at 32768 tokens, 34.00 KiB at 34 tokens" "$@"
# 160 x (32768 + 3 x 8) and 160 x (34 + 3 x 8) bytes
g3="cache q8: 640 bytes/token (K 320, V 320); 5.00 MiB at 32768 tokens, 9.06 KiB at 34 tokens (sliding-window layers count at most their window)"
check gemma3 "--cache=q8" "$g3" "$@"
# the layers split over two backends' caches: the same sums
check gemma3 "--cache=q8 --gpu-layers=2" "$g3" "$@"
