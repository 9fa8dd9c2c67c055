#!/usr/bin/env bash
# Experts streamed from disk (--stream-experts) give the fully loaded model's logits and
# greedy tokens bit for bit, with the smallest budget the model allows (the top_k experts of
# every expert weight resident, so nearly every token evicts and reads):
#  - a budget below that minimum is refused, the message naming the minimum;
#  - the prompt one row a step (no product is split) and, where the backend's expert product
#    rounds the same at any row count (the CPU's), the whole prompt in one step, whose
#    products are split into row ranges whose experts fit the stacks (on Vulkan the split
#    ranges take the matrix-vector kernels where the whole prompt takes the tiled ones, so
#    there they are compared to 1e-5 x max |logit|);
#  - greedy generation, and `bench` saying experts were missed and read (so the stream ran);
#  - --moe-top-k at the model's own top_k changes nothing.
# usage: stream_experts.sh LMHOST MODEL_DIR COMPARE_LOGITS [LMHOST OPTION...]
set -u
lmhost=$1 model=$2 compare=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
prompt=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt'][:16])))" "$model/reference.json")

out=$("$lmhost" logits --model "$model" --tokens 1 --out "$tmp/x.npy" --stream-experts \
    --expert-cache-mb 0.01 "$@" 2>&1) && fail "a budget of 0.01 MB was accepted"
need=$(sed -n 's/.*cannot hold the [0-9]* experts a token routes to in every layer: that takes \([0-9.]*\) MB.*/\1/p' <<<"$out")
[ -n "$need" ] || fail "no minimum named: $out"
budget=$(python3 -c "print(f'{float(\"$need\") + 0.01:.2f}')")
echo "minimum budget $need MB; streaming with $budget MB"
stream=(--stream-experts --expert-cache-mb="$budget")

"$lmhost" logits --model "$model" --tokens "$prompt" --chunk 1 --out "$tmp/a1.npy" "$@" || fail "logits"
"$lmhost" logits --model "$model" --tokens "$prompt" --chunk 1 --out "$tmp/b1.npy" "${stream[@]}" "$@" ||
    fail "logits, streamed"
"$compare" "$tmp/a1.npy" "$tmp/b1.npy" 0 || fail "one row a step: streamed logits differ"
whole_tol=0
case " $* " in *" --backend vulkan "* | *" --backend=vulkan "*) whole_tol=1e-5 ;; esac
"$lmhost" logits --model "$model" --tokens "$prompt" --out "$tmp/a.npy" "$@" || fail "logits"
"$lmhost" logits --model "$model" --tokens "$prompt" --out "$tmp/b.npy" "${stream[@]}" "$@" ||
    fail "logits, streamed"
"$compare" "$tmp/a.npy" "$tmp/b.npy" $whole_tol || fail "the whole prompt: streamed logits differ"

ga=$("$lmhost" generate --model "$model" --tokens "$prompt" --max-tokens 12 --ignore-eos "$@") ||
    fail "generate"
gb=$("$lmhost" generate --model "$model" --tokens "$prompt" --max-tokens 12 --ignore-eos \
    "${stream[@]}" "$@") || fail "generate, streamed"
[ "$ga" = "$gb" ] || fail "greedy tokens differ: $ga against $gb"
k=$("$lmhost" generate --model "$model" --tokens "$prompt" --max-tokens 12 --ignore-eos \
    "${stream[@]}" --moe-top-k "$(python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
c = c.get('text_config', c)
print(next(c[k] for k in ('num_experts_per_tok', 'top_k_experts', 'experts_per_token') if k in c))" "$model/config.json")" "$@") ||
    fail "generate --moe-top-k"
[ "$ga" = "$k" ] || fail "--moe-top-k at the model's top_k changed the tokens: $k"
echo "greedy: $gb"

b=$("$lmhost" bench --model "$model" --prompt 12 --gen 12 --no-bandwidth --no-peak "${stream[@]}" "$@") ||
    fail "bench"
line=$(grep "experts streamed" <<<"$b") || fail "bench says nothing of the experts: $b"
echo "$line"
grep -Eq '[1-9][0-9]* misses' <<<"$line" || fail "no expert was missed: the stream did not run"
echo "PASS"
