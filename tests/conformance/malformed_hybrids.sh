#!/usr/bin/env bash
# Malformed recurrent and hybrid checkpoints through the CLI: each must fail with a clear
# message on stderr and exit status 1 (never a crash). Checkpoints are broken by renaming a
# tensor in the safetensors header (same length, so every offset stays valid) or by editing
# config.json. usage: malformed_hybrids.sh LMHOST MODELS_DIR
set -u
lmhost=$1
models=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

case_dir() { # name fixture: a fresh copy of a fixture to break
    rm -rf "${tmp:?}/$1"
    mkdir -p "$tmp/$1"
    cp "$models/$2/config.json" "$models/$2/model.safetensors" "$tmp/$1/"
    echo "$tmp/$1"
}

expect() { # name dir expected-substring
    local name=$1 dir=$2 want=$3
    "$lmhost" logits --model "$dir" --tokens 1,2,3 --out "$tmp/out.npy" 2>"$tmp/err" >/dev/null
    local rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
        echo "FAIL $name: exit $rc, stderr: $(cat "$tmp/err")"
        echo "     expected exit 1 and a message containing: $want"
        fails=$((fails + 1))
    else
        echo "ok   $name: $(head -c 300 "$tmp/err")"
    fi
}

rename_tensor() { # dir from to (same length): rename a tensor in the header
    python3 - "$1/model.safetensors" "$2" "$3" <<'PY'
import struct, sys
path, a, b = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
assert len(a) == len(b)
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
hdr = raw[8:8 + n]
i = hdr.find(b'"' + a + b'"')
assert i >= 0, a
hdr[i + 1:i + 1 + len(a)] = b
raw[8:8 + n] = hdr
open(path, "wb").write(raw)
PY
}

config() { # dir python-expression on d (the config dict)
    python3 - "$1/config.json" "$2" <<'PY'
import json, sys
path = sys.argv[1]
d = json.load(open(path))
exec(sys.argv[2])
json.dump(d, open(path, "w"))
PY
}

d=$(case_dir no-a-log mamba)
rename_tensor "$d" backbone.layers.1.mixer.A_log backbone.layers.1.mixer.A_lox
expect missing-A_log "$d" "missing tensor backbone.layers.1.mixer.A_log"

d=$(case_dir conv-kernel mamba2)
config "$d" "d['conv_kernel'] = 3"
expect conv-kernel-shape "$d" "conv1d.weight"

d=$(case_dir conv-kernel-one mamba2)
config "$d" "d['conv_kernel'] = 1"
expect conv-kernel-one "$d" "conv_kernel 1 is not supported"

d=$(case_dir time-step-limit mamba2)
config "$d" "d['time_step_limit'] = [0.5, 0.1]"
expect time-step-limit "$d" "time_step_limit"

d=$(case_dir heads-groups mamba2)
config "$d" "d['n_groups'] = 3"
expect heads-groups "$d" "groups"

d=$(case_dir state-size mamba)
config "$d" "d['state_size'] = 9"
expect state-size "$d" "shape mismatch"

d=$(case_dir dt-rank mamba)
config "$d" "d['time_step_rank'] = 'wide'"
expect dt-rank "$d" "time_step_rank 'wide'"

# layer patterns naming a kind the family does not have, in each family's own form
d=$(case_dir granite-layer-kind granitemoehybrid)
config "$d" "d['layer_types'][1] = 'sliding_attention'"
expect granite-unknown-layer "$d" "sliding_attention"

d=$(case_dir nemotron-pattern nemotron_h)
config "$d" "d.pop('layers_block_type', None); d['hybrid_override_pattern'] = 'M-X-'"
expect nemotron-unknown-letter "$d" "'X'"

d=$(case_dir qwen3-next-layer-kind qwen3_next)
config "$d" "d['layer_types'][0] = 'mamba2'"
expect qwen3-next-unknown-layer "$d" "mamba2"

d=$(case_dir jamba-block-type jamba)
config "$d" "d['layers_block_type'] = ['mamba', 'retnet', 'mamba', 'attention']"
expect jamba-unknown-layer "$d" "retnet"

d=$(case_dir jamba-period jamba)
config "$d" "d['attn_layer_period'] = 0"
expect jamba-zero-period "$d" "attn_layer_period"

d=$(case_dir falcon-multipliers falcon_h1)
config "$d" "d['ssm_multipliers'] = [1.0, 1.0]"
expect falcon-multipliers "$d" "ssm_multipliers"

d=$(case_dir qwen3-next-heads qwen3_next)
config "$d" "d['linear_num_key_heads'] = 3"
expect qwen3-next-heads "$d" "not a multiple"

exit $((fails > 0))
