#!/usr/bin/env bash
# The TurboQuant cache end to end on random models whose heads its codes take (128 and 64
# values), through `lmhost logits` (the stable contract):
#  - decode attention on the codes (`--chunk 1`: every token a decode step) against the
#    prefill path, which decodes the same rows to f32 for the backend's attention: both read
#    the same codes when every row is encoded at once (hot=0,start=0,step=1), so they agree
#    to f32 rounding (1e-4 x max |logit|); for tq3, tq4 and tq3 with qjl=off;
#  - rows kept in the hot f16 window (start past the prompt) give the f16 cache's logits,
#    in decode and in prefill;
#  - the hot window policy (hot=8,start=16,step=4: migrations from the ring, rows encoded
#    straight from a long step, the ring wrapping) decodes and prefills without error, its
#    decode within the codes' error of the f32 cache, tq4 nearer than tq3 on average;
#  - bad settings are refused with a message.
# usage: tq_cache.sh LMHOST COMPARE_LOGITS MODEL_DIR... [-- LMHOST OPTION...]
set -u
lmhost=$1 cmp=$2
shift 2
dirs=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do dirs+=("$1"); shift; done
[ $# -gt 0 ] && shift
extra=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ids=$(seq -s, 3 5 250)
fail=0
run() { # DIR OUT CACHE [LOGITS OPTION...]
    local dir=$1 out=$2 cache=$3
    shift 3
    "$lmhost" logits --model "$dir" --tokens "$ids" --cache "$cache" --out "$tmp/$out.npy" \
        "$@" "${extra[@]}" > "$tmp/log" 2>&1 || { cat "$tmp/log"; echo "FAIL: $out"; fail=1; }
}
same() { # A B TOL WHAT
    printf '%s: ' "$4"
    "$cmp" "$tmp/$1.npy" "$tmp/$2.npy" "$3" || fail=1
}
maxdiff() { # A B: max |a - b| / max |b| as compare_logits prints it
    "$cmp" "$tmp/$1.npy" "$tmp/$2.npy" 1e9 | sed -n 's/.*ratio \([0-9.e+-]*\).*/\1/p'
}
for dir in "${dirs[@]}"; do
    m=$(basename "$dir")
    echo "== $m"
    run "$dir" f32 f32 --chunk 1
    run "$dir" f16-d f16 --chunk 1
    run "$dir" f16-p f16
    for c in tq3 tq4 tq3,qjl=off; do
        run "$dir" "$c-d" "$c,hot=0,start=0,step=1" --chunk 1
        run "$dir" "$c-p" "$c,hot=0,start=0,step=1"
        same "$c-d" "$c-p" 1e-4 "$m $c, codes against decoded rows"
    done
    run "$dir" hot-d tq3,start=100000 --chunk 1
    run "$dir" hot-p tq3,start=100000
    same hot-d f16-d 1e-4 "$m tq3 hot rows against the f16 cache, decode"
    same hot-p f16-p 1e-5 "$m tq3 hot rows against the f16 cache, prefill"
    for c in tq3 tq4; do
        run "$dir" "$c-w" "$c,hot=8,start=16,step=4" --chunk 1
        run "$dir" "$c-w3" "$c,hot=8,start=16,step=4" --chunk 3
        run "$dir" "$c-w32" "$c,hot=8,start=16,step=4" --chunk 32
    done
    d3=$(maxdiff tq3-w f32) d4=$(maxdiff tq4-w f32)
    echo "$m window policy against f32: tq3 $d3, tq4 $d4"
    awk -v a="$d3" -v b="$d4" 'BEGIN { exit !(a < 0.6 && b < a) }' ||
        { echo "FAIL: $m: the coded caches drift too far from f32 (or tq4 is not nearer)"; fail=1; }
done
for bad in "tq3,hot=-1" "tq3,step=0" "tq3,bogus=1" "tq4,qjl=on" "tq3,qjl=maybe" "tq3,hot"; do
    if "$lmhost" logits --model "${dirs[0]}" --tokens 1,2 --cache "$bad" --out "$tmp/x.npy" \
        "${extra[@]}" > "$tmp/log" 2>&1; then
        echo "FAIL: --cache $bad was accepted"
        fail=1
    elif ! grep -q "cache turboquant" "$tmp/log"; then
        cat "$tmp/log"
        echo "FAIL: --cache $bad: no message naming the cache"
        fail=1
    fi
done
[ $fail = 0 ] && echo ok || { echo FAIL; exit 1; }
