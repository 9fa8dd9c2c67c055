#!/usr/bin/env bash
# `lmhost bench` counts the stored keys and values each decode step's attention reads (the
# cache plugin's bytes_read, ABI 1.5) and adds them to the weights in decode's bandwidth
# bound. The fixtures' layers hold 2 K/V heads of 32 + 32 f32 values: 512 bytes a row.
# A step at position p (p + 1 rows stored) reads p + 1 rows of a full-attention layer and
# min(p + 1, window) of a sliding one: each row once, however the kernel tiles it.
# usage: bench_cache_reads.sh LMHOST MODELS_DIR [bench options...]
set -u
lmhost=$1 models=$2
shift 2
check() { # model, prompt, gen, want bytes a token
    out=$("$lmhost" bench --model "$models/$1" --prompt "$2" --gen "$3" --no-bandwidth --no-peak \
        "${@:5}" 2>&1) || { echo "$out"; exit 1; }
    grep -q "^cache bytes read per decoded token: .* ($4 bytes: " <<<"$out" || {
        echo "$out"
        echo "FAIL: $1, prompt $2, $3 tokens: want $4 cache bytes read a token"
        exit 1
    }
}
# llama: 4 full layers; steps at positions 32, 33: (33 + 34) x 4 rows over 2 steps
check llama 32 2 $(((33 + 34) * 4 * 512 / 2)) "$@"
# gemma3: layers 0, 1 and 3 slide over 8 positions, layer 2 sees all; positions 16..19
check gemma3 16 4 $(((17 + 18 + 19 + 20 + 3 * 4 * 8) * 512 / 4)) "$@"
# the same after a prompt longer than the window in one step (the ring shrinks back)
check gemma3 40 4 $(((41 + 42 + 43 + 44 + 3 * 4 * 8) * 512 / 4)) "$@"

# The bound with cache reads, from the printed figures: the bandwidth over the weights'
# bytes and the cache's; its ratio is decode's rate over it.
out=$("$lmhost" bench --model "$models/llama" --prompt 32 --gen 2 --no-peak "$@" 2>&1) ||
    { echo "$out"; exit 1; }
echo "$out" | grep -E "^(chain|decode|cache bytes|memory|device memory)"
awk -v kv=$(((33 + 34) * 4 * 512 / 2)) '
/^decode: / { D = $8 }
/^memory read bandwidth: / { B = $4 * 1e9 }
/^device memory read bandwidth / { B = $7 * 1e9 }
/^decode bound by bandwidth \(weight reads\): / { W = $7 }
/^decode bound by bandwidth \(weight and cache reads\): / { K = $9; R = $14; sub(/%$/, "", R) }
function near(a, b, rel) { return a > 0 && b > 0 && (a - b <= rel * b) && (b - a <= rel * b) }
END {
    if (!(B > 0 && W > 0 && D > 0)) { print "FAIL: no bandwidth, weight bound or decode line"; exit 1 }
    if (!(K > 0)) { print "FAIL: no bound with cache reads"; exit 1 }
    # bytes a token as the two bounds give them: weights B / W, with the cache B / K
    if (!near(B / K - B / W, kv, 0.01)) { printf "FAIL: the bounds differ by %g bytes a token, want %d\n", B / K - B / W, kv; exit 1 }
    if (!(R + 0 >= 100 * D / K - 0.51 && R + 0 <= 100 * D / K + 0.51)) { printf "FAIL: ratio %g%%, want 100 x %g / %g\n", R, D, K; exit 1 }
}' <<<"$out" || exit 1
echo "ok: decode's cache reads counted and in its bandwidth bound"
