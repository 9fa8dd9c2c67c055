#!/usr/bin/env bash
# Malformed model directories through the CLI: each must fail with a clear message on
# stderr and exit status 1 (never a crash, which would show as a signal, 128+N).
# usage: malformed_cli.sh LMHOST FIXTURE_DIR MLX_FIXTURE_DIR
set -u
lmhost=$1
fixture=$2
mlx_fixture=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

case_dir() { # name: a fresh copy of the fixture to break
    rm -rf "${tmp:?}/$1"
    mkdir -p "$tmp/$1"
    cp "$fixture/config.json" "$fixture/model.safetensors" "$tmp/$1/"
    echo "$tmp/$1"
}

expect() { # name dir expected-substring [extra args]
    local name=$1 dir=$2 want=$3
    shift 3
    "$lmhost" logits --model "$dir" --tokens 1,2,3 --out "$tmp/out.npy" "$@" 2>"$tmp/err" >/dev/null
    local rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
        echo "FAIL $name: exit $rc, stderr: $(cat "$tmp/err")"
        echo "     expected exit 1 and a message containing: $want"
        fails=$((fails + 1))
    else
        echo "ok   $name: $(head -c 300 "$tmp/err")"
    fi
}

set_key() { # dir key value: rewrite one "key": value line of config.json
    sed -i -E "s/(\"$2\": )[^,]*(,?)$/\1$3\2/" "$1/config.json"
}

d=$(case_dir truncated)
truncate -s 1000 "$d/model.safetensors"
expect truncated-file "$d" "model.safetensors"

d=$(case_dir header-past-eof)
printf '\xff\xff\xff\x00\x00\x00\x00\x00{}' >"$d/model.safetensors"
expect header-length-past-eof "$d" "model.safetensors"

d=$(case_dir header-not-json)
printf '\x10\x00\x00\x00\x00\x00\x00\x00{not json at all' >"$d/model.safetensors"
expect header-not-json "$d" "model.safetensors"

d=$(case_dir zero-heads)
set_key "$d" num_attention_heads 0
expect zero-heads "$d" "num_attention_heads must be positive"

d=$(case_dir heads-type)
set_key "$d" num_attention_heads '"four"'
expect heads-not-integer "$d" "num_attention_heads must be an integer"

d=$(case_dir more-layers)
set_key "$d" num_hidden_layers 5
expect missing-tensor "$d" "missing tensor model.layers.4."

d=$(case_dir wrong-shape)
set_key "$d" intermediate_size 96
expect wrong-shape "$d" "shape mismatch for tensor model.layers.0.mlp.gate_proj.weight"

d=$(case_dir unknown-type)
set_key "$d" model_type '"no_such_family"'
expect unknown-model-type "$d" "unknown model type 'no_such_family' (known:"

d=$(case_dir bad-eps)
set_key "$d" rms_norm_eps -1
expect bad-eps "$d" "rms_norm_eps"

d=$(case_dir no-config)
rm "$d/config.json"
expect missing-config "$d" "config.json"

d=$(case_dir config-not-json)
echo '{"model_type": ' >"$d/config.json"
expect config-not-json "$d" "config.json"

d=$(case_dir ok)
expect unknown-backend "$d" "unknown backend plugin 'nope'" --backend nope
expect unknown-cache "$d" "unknown cache 'nope' (formats: f32, f16" --cache nope
"$lmhost" logits --model "$d" --tokens 1,99999 --out "$tmp/o.npy" 2>"$tmp/err"
if [ $? -ne 1 ] || ! grep -q "out of range" "$tmp/err"; then
    echo "FAIL token-out-of-range: $(cat "$tmp/err")"
    fails=$((fails + 1))
else
    echo "ok   token-out-of-range: $(cat "$tmp/err")"
fi

# MLX-quantized checkpoints: formats not supported yet, widths outside MLX's, broken
# scales and per-module overrides.
mlx_case() { # name python-statements-on-config-dict-c: a fresh copy of the MLX fixture
    rm -rf "${tmp:?}/$1"
    mkdir -p "$tmp/$1"
    cp "$mlx_fixture/config.json" "$mlx_fixture/model.safetensors" "$tmp/$1/"
    python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); $2; json.dump(c, open(p, 'w'))" \
        "$tmp/$1/config.json"
    echo "$tmp/$1"
}
for m in mxfp4 nvfp4 mxfp8; do
    d=$(mlx_case "mode-$m" "c['quantization']['mode'] = '$m'; c.pop('quantization_config', None)")
    expect "quant-mode-$m" "$d" "quantization mode \"$m\" is not supported yet"
done
d=$(mlx_case mode-unknown "c['quantization']['mode'] = 'fancy'; c.pop('quantization_config', None)")
expect quant-mode-unknown "$d" "unknown quantization mode \"fancy\""
d=$(mlx_case bits-7 "c['quantization']['bits'] = 7; c.pop('quantization_config', None)")
expect quant-bits-7 "$d" "7-bit groups of 64 are not supported"
d=$(mlx_case no-quantization "c.pop('quantization', None); c.pop('quantization_config', None)")
expect quant-missing-config "$d" "config.json has no \"quantization\""
d=$(mlx_case bad-override "c['quantization']['model.layers.0.mlp.gate_proj'] = 3; c.pop('quantization_config', None)")
expect quant-bad-override "$d" "must be an object or false"
d=$(mlx_case wrong-group "c['quantization']['group_size'] = 32; c.pop('quantization_config', None)")
expect quant-group-mismatch "$d" "model.layers.0"

[ "$fails" -eq 0 ] && echo "all malformed cases rejected cleanly"
exit $((fails > 0))
