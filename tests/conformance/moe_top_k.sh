#!/usr/bin/env bash
# --moe-top-k 1 against transformers with the model's experts-per-token set to 1
# (tools/make_topk_reference.py: tests/data/moe_top_k/FIXTURE-k1.npy): each family's router
# renormalises (or not) with the new k as transformers does. Within the conformance
# tolerance (1e-3 x max |logit|), loaded and with the experts streamed from disk.
# usage: moe_top_k.sh LMHOST MODEL_DIR REFERENCE.npy COMPARE_LOGITS [LMHOST OPTION...]
set -u
lmhost=$1 model=$2 ref=$3 compare=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompt=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt'][:16])))" "$model/reference.json")
for stream in "" "--stream-experts --expert-cache-mb 0.8"; do
    # shellcheck disable=SC2086 # $stream is two options or none
    "$lmhost" logits --model "$model" --tokens "$prompt" --moe-top-k 1 --out "$tmp/k1.npy" \
        $stream "$@" || { echo "FAIL: logits --moe-top-k 1 $stream"; exit 1; }
    "$compare" "$ref" "$tmp/k1.npy" 1e-3 || { echo "FAIL: --moe-top-k 1 $stream"; exit 1; }
done
# and the model's own k, given, is the model
"$lmhost" logits --model "$model" --tokens "$prompt" --out "$tmp/a.npy" "$@" || exit 1
"$lmhost" logits --model "$model" --tokens "$prompt" --moe-top-k 2 --out "$tmp/b.npy" "$@" || exit 1
"$compare" "$tmp/a.npy" "$tmp/b.npy" 0 || { echo "FAIL: --moe-top-k 2 (the model's) changed the logits"; exit 1; }
echo PASS
