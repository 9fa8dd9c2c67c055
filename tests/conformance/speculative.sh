#!/usr/bin/env bash
# Speculative decoding through `generate` (the stable contract): with a draft model of the
# same vocabulary, or with prompt lookup, the greedy continuation equals the target's
# reference; a seeded sampled run gives the tokens it gives without speculation. Pairs
# cover each way a rejected proposal is undone: keys and values cut back (qwen3), a
# sliding-window ring cut back after it wrapped (mistral, gemma3: windows of 8, prompts of
# 40), a recurrent target or draft taken back to a snapshot (qwen3_5, nemotron_h). A
# draft of the target itself accepts every greedy proposal. Also the prefix path: a hybrid's
# prompt restored from another sequence's state (--restore-prefix) continues as the reference.
# usage: speculative.sh LMHOST MODELS_DIR [LMHOST OPTION...]   (e.g. --backend vulkan)
set -u
lmhost=$1 models=$2
shift 2
extra=("$@")
fails=0
ref() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(','.join(map(str, r[sys.argv[2]])))" "$models/$1/reference.json" "$2"; }
tokens() { python3 -c "import json,sys; print(','.join(map(str, json.loads(sys.stdin.read())['tokens'])))"; }

# gen TARGET EXPECTED LABEL OPTION...: greedy, 12 tokens
gen() {
    local target=$1 want=$2 label=$3
    shift 3
    local out got
    out=$("$lmhost" generate --model "$models/$target" --tokens "$(ref "$target" prompt)" \
        --max-tokens 12 "${extra[@]}" "$@" 2>/tmp/spec-$$.err) || {
        echo "FAIL $label: exit $?"
        cat /tmp/spec-$$.err
        fails=$((fails + 1))
        return
    }
    got=$(tokens <<<"$out")
    if [ "$got" != "$want" ]; then
        echo "FAIL $label: $got, want $want"
        fails=$((fails + 1))
    else
        echo "ok   $label $(grep -o 'accepted ([0-9.]*%); [0-9.]* tokens a step' /tmp/spec-$$.err)"
    fi
}

for pair in qwen3:qwen3-bf16 qwen3:qwen3_5 qwen3_5:qwen3 qwen3_5:qwen3_5 nemotron_h:qwen3 \
    mistral:mistral gemma3:qwen3 llama:llama-bf16; do
    t=${pair%%:*} d=${pair#*:}
    want=$(ref "$t" greedy)
    gen "$t" "$want" "$t drafted by $d" --draft-model "$models/$d"
    gen "$t" "$want" "$t drafted by $d, 2 a step" --draft-model="$models/$d" --draft-max=2
done
for t in qwen3 qwen3_5 nemotron_h mistral gemma3 llama; do
    gen "$t" "$(ref "$t" greedy)" "$t with prompt lookup" --spec ngram
done
# a draft of the target itself: every greedy proposal accepted
out=$("$lmhost" generate --model "$models/mistral" --tokens "$(ref mistral prompt)" --max-tokens 12 \
    "${extra[@]}" --draft-model "$models/mistral" 2>&1 >/dev/null)
if grep -q "11 proposed, 11 accepted\|accepted (100.0%)" <<<"$out"; then
    echo "ok   self-draft: every proposal accepted"
else
    echo "FAIL self-draft: $out"
    fails=$((fails + 1))
fi
# seeded sampling: the same tokens with and without proposals
for pair in qwen3:qwen3 qwen3_5:qwen3 nemotron_h:nemotron_h gemma3:gemma3; do
    t=${pair%%:*} d=${pair#*:}
    args=(generate --model "$models/$t" --tokens "$(ref "$t" prompt)" --max-tokens 40 --ignore-eos
        --temperature 0.7 --top-k 20 --seed 5 "${extra[@]}")
    a=$("$lmhost" "${args[@]}" 2>/dev/null)
    b=$("$lmhost" "${args[@]}" --draft-model "$models/$d" --draft-max 3 2>/dev/null)
    c=$("$lmhost" "${args[@]}" --spec ngram 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]; then
        echo "ok   $t sampled (seed 5): same tokens drafted by $d and with prompt lookup"
    else
        echo "FAIL $t sampled: plain $a, drafted $b, lookup $c"
        fails=$((fails + 1))
    fi
done
# the prefix path on hybrids and a window
for t in qwen3_5 nemotron_h mistral; do
    gen "$t" "$(ref "$t" greedy)" "$t with 30 prompt tokens restored" --restore-prefix 30
done
# option errors: usage exit 2
for bad in "--spec draft" "--spec ngram --draft-model $models/qwen3" "--spec beam" "--draft-max 0 --spec ngram" \
    "--draft-max 65 --spec ngram" "--restore-prefix 40"; do
    # shellcheck disable=SC2086
    "$lmhost" generate --model "$models/qwen3" --tokens 1,2,3 --max-tokens 2 $bad >/dev/null 2>&1
    rc=$?
    [ "$rc" = 2 ] && echo "ok   refused: $bad" || {
        echo "FAIL $bad: exit $rc, want 2"
        fails=$((fails + 1))
    }
done
rm -f /tmp/spec-$$.err
[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
