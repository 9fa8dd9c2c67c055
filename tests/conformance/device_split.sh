#!/usr/bin/env bash
# Layers split over several devices (--devices, --split layer, --tensor-split): each device an
# instance of the backend, so the CPU backend's "devices" and two instances on lavapipe's one
# device run the same machinery as two GPUs. The same kernels run every layer, so a split
# model gives the same bits as the whole one: logits of a prefill, and greedy tokens through
# the cache (decode steps cross the boundary every step). The options' errors are clear.
# usage: device_split.sh LMHOST BACKEND DEVICES MODEL_DIR...   (DEVICES: "0,1" or "0,0")
set -u
lmhost=$1
backend=$2
devs=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
toks=1,5,9,2,7,3,11,4,8,6,12,10
fail() {
    echo "FAIL $*"
    fails=$((fails + 1))
}

for dir in "$@"; do
    m=$(basename "$dir")
    base=(--model "$dir" --backend "$backend" --precision exact)
    "$lmhost" logits "${base[@]}" --tokens $toks --out "$tmp/whole.npy" 2>"$tmp/err" ||
        { fail "$m: whole model: $(cat "$tmp/err")"; continue; }
    g_whole=$("$lmhost" generate "${base[@]}" --tokens $toks --max-tokens 10 2>/dev/null)
    # the devices evenly (by their free memory), then by --tensor-split (=value spelling)
    for split in "" "--tensor-split=1,3"; do
        what="$m --devices $devs ${split:-(by free memory)}"
        # shellcheck disable=SC2086
        if ! LMHOST_LOG=3 "$lmhost" logits "${base[@]}" --devices "$devs" $split --tokens $toks \
            --out "$tmp/split.npy" 2>"$tmp/err"; then
            fail "$what: $(tail -3 "$tmp/err")"
            continue
        fi
        grep -q "layers split over 2 devices" "$tmp/err" || fail "$what: no split in the log"
        cmp -s "$tmp/whole.npy" "$tmp/split.npy" || fail "$what: logits differ from the whole"
        # shellcheck disable=SC2086
        g=$("$lmhost" generate "${base[@]}" --devices "$devs" $split --tokens $toks \
            --max-tokens 10 2>/dev/null)
        [ "$g" = "$g_whole" ] || fail "$what: generated $g, whole $g_whole"
        echo "ok   $what: same logits, $g"
    done
done

# the placement bench reports: each device's layers and memory
dir=$1
out=$("$lmhost" bench --model "$dir" --backend "$backend" --devices "$devs" --tensor-split 1,3 \
    --prompt 8 --gen 4 --no-bandwidth --no-peak 2>&1)
n=$(grep -c "^backend $backend (device [0-9], layers [0-9]*-[0-9]*) memory" <<<"$out")
[ "$n" = 2 ] && echo "ok   bench: $(grep "^backend" <<<"$out" | tr '\n' ' ')" ||
    fail "bench: $n per-device memory lines in: $out"

# the server's /health: each device's memory and layers (a model with a tokenizer)
sdir=$(dirname "$0")/../../examples/tiny-chat
"$lmhost" serve --model "$sdir" --backend "$backend" --devices "$devs" --tensor-split 1,3 \
    --port 0 2>"$tmp/serve.log" &
pid=$!
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.*serving .* on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$tmp/serve.log")
    [ -n "$port" ] && break
    sleep 0.1
done
for _ in $(seq 100); do # (200 once the model is loaded)
    curl -sf "http://127.0.0.1:$port/health" >"$tmp/health" && break
    sleep 0.1
done
mem=$(python3 -c 'import json,sys; print(json.dumps([[m["device"], m["layers"]] for m in json.load(sys.stdin)["memory"]]))' <"$tmp/health")
kill "$pid"
wait "$pid"
first=${devs%%,*}
second=${devs##*,}
nl=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c=c.get("text_config",c); print(c["num_hidden_layers"])' "$sdir/config.json")
want="[[$first, [0, $((nl / 4 - 1))]], [$second, [$((nl / 4)), $((nl - 1))]]]"
[ "$mem" = "$want" ] && echo "ok   /health memory: $mem" || fail "/health memory: $mem, wanted $want"

# errors: a failure (not a crash: no signal's 128+N) with a message that says what is wrong
expect() { # want args...
    local want=$1
    shift
    "$lmhost" logits --model "$dir" --tokens 1,2 --out "$tmp/e.npy" "$@" 2>"$tmp/err" >/dev/null
    local got=$?
    if [ "$got" -eq 0 ] || [ "$got" -ge 128 ] || ! grep -qF -- "$want" "$tmp/err"; then
        fail "$*: exit $got, stderr: $(cat "$tmp/err") (wanted a failure and: $want)"
    else
        echo "ok   $*: $(head -c 200 "$tmp/err")"
    fi
}
expect "--tensor-split goes with --devices" --tensor-split 1,1
expect "only 'layer' is supported" --devices 0,1 --split row
expect "has 3 values for 2 devices" --devices 0,1 --tensor-split 1,2,3
expect "add up to 0" --devices 0,1 --tensor-split 0,0
expect "--device and --devices" --device 0 --devices 0,1
expect "at most 8 values" --devices 0,0,0,0,0,0,0,0,0
expect "comma-separated integers" --devices 0,x
expect "ends with a comma" --devices=0,
expect "layers cannot be split over 8 devices" --backend "$backend" --devices 0,0,0,0,0,0,0,0 \
    --gpu-layers 3
if [ "$backend" = vulkan ]; then
    expect "Vulkan device 9 requested" --backend vulkan --devices 0,9
fi

if [ "$fails" -ne 0 ]; then
    echo "$fails failed"
    exit 1
fi
echo "all passed"
