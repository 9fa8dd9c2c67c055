#!/usr/bin/env bash
# Running out of device memory on the Vulkan backend (`--backend vulkan:max-memory=N` caps
# what it allocates): a cap below the weights fails the load with exit status 1 and a message naming
# the backend and the sizes; at every cap from nothing to enough, `generate` either gives the
# uncapped tokens or exits 1 with a message about vulkan memory, never a crash; no validation
# layer message anywhere.
# usage: oom.sh LMHOST TESTS_DATA_DIR
set -uo pipefail
lmhost=$1
data=$2
dense=$data/models/qwen3
quant=$data/models-mlx/qwen3-mlx4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

run() { # cap model -> $rc, $tmp/out, $tmp/err
    "$lmhost" generate --model "$2" --backend "vulkan:max-memory=$1" --tokens 1,2,3 \
        --max-tokens 40 >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if grep -q "validation:" "$tmp/err"; then fail "cap $1: validation layer messages"; fi
    cat "$tmp/err" >>"$tmp/all-err"
}

for model in "$dense" "$quant"; do
    name=$(basename "$model")
    "$lmhost" generate --model "$model" --backend vulkan --tokens 1,2,3 --max-tokens 40 \
        >"$tmp/want" 2>"$tmp/err" || { cat "$tmp/err"; fail "$name: uncapped run"; continue; }

    # far below the weights: the load fails, naming the backend and the sizes
    run 64K "$model"
    if [ "$rc" != 1 ]; then
        fail "$name, cap 64K: exit status $rc, want 1"
    elif ! grep -qE "out of vulkan memory loading .* \([0-9]+ bytes\)|backend vulkan refused" "$tmp/err" ||
        ! grep -qE "vulkan: out of device memory: cannot allocate .* max-memory=64.0 KiB" "$tmp/err"; then
        cat "$tmp/err"
        fail "$name, cap 64K: the message does not name the backend and the sizes"
    else
        echo "ok   $name, cap 64K: $(tail -1 "$tmp/err")"
    fi

    # every cap: the same tokens, or a clean error about vulkan memory
    n_ok=0 n_err=0
    for cap in 1 100 4K 16K 64K 128K 192K 256K 384K 512K 640K 768K 896K 1M 1100K 1150K 1200K 1300K 2M 16M; do
        run "$cap" "$model"
        if [ "$rc" = 0 ]; then
            if cmp -s "$tmp/out" "$tmp/want"; then
                n_ok=$((n_ok + 1))
            else
                fail "$name, cap $cap: other tokens: $(cat "$tmp/out")"
            fi
        elif [ "$rc" = 1 ] && grep -qiE "vulkan.*memory|memory.*vulkan" "$tmp/err"; then
            n_err=$((n_err + 1))
        else
            tail -5 "$tmp/err"
            fail "$name, cap $cap: exit status $rc without a message about vulkan memory"
        fi
    done
    echo "ok   $name: $n_ok caps ran, $n_err failed cleanly"
    [ "$n_ok" -gt 0 ] || fail "$name: no cap was enough"
done

"$lmhost" generate --model "$dense" --backend vulkan:max-memory=lots --tokens 1 \
    --max-tokens 1 >/dev/null 2>"$tmp/err"
rc=$?
if [ "$rc" = 1 ] && grep -q "max-memory=lots" "$tmp/err"; then
    echo "ok   a malformed cap is refused: $(tail -1 "$tmp/err")"
else
    fail "malformed cap: exit status $rc: $(cat "$tmp/err")"
fi

if [ "$fails" = 0 ]; then echo "all checks passed"; else echo "$fails checks failed"; fi
[ "$fails" = 0 ]
