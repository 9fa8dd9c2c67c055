#!/usr/bin/env bash
# Batched decode gives each sequence the tokens it gets alone: `lmhost bench --batch N`
# decodes N sequences with one prompt together (a row each a step: the products take the
# several-row kernels, MoE routes every row) and compares each one's greedy tokens with
# the sequence decoded by itself. usage: batch_decode.sh LMHOST MODEL_DIR [bench options]
set -u
lmhost=$1 model=$2
shift 2
for n in 3 6; do
    out=$("$lmhost" bench --model "$model" --prompt 12 --gen 10 --batch $n --no-bandwidth "$@" 2>&1) ||
        { echo "$out"; exit 1; }
    line=$(grep "sequences together" <<<"$out")
    echo "$line"
    grep -q "greedy tokens as decoded alone: yes" <<<"$line" || {
        echo "$out"
        echo "FAIL: $n sequences decoded together differ from one decoded alone"
        exit 1
    }
done
