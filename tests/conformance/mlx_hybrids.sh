#!/usr/bin/env bash
# MLX conversions of the recurrent and hybrid families through the CLI. For each fixture
# whose plugin is built:
#   mlx      mlx_layout.py rewrites the Hugging Face fixture as mlx-lm's converter would
#            (sanitize: [C, K, 1] convolutions, stacked switch_mlp experts, Granite's split
#            input_linear, Qwen's 1 + w norms and language_model.model. names, Falcon-H1's
#            multipliers folded into weights); check_model against the ORIGINAL reference.
#   mlx-q4   that layout quantized by `lmhost quantize --bits 4` (the mixers' in/out/x
#            projections, attention, MLPs, experts, embedding and head; the experts handed
#            over one tensor each, mlx_layout.py --per-expert, since lmhost quantize takes
#            2-D tensors only and stacks them into switch_mlp itself); the result is checked
#            to be mlx-lm's quantized layout, and `lmhost dequantize` of it to be the float
#            layout's tensors within a 4-bit step; the dequantized model (no quantized
#            kernel runs) gives the logits and greedy continuation that check_model holds
#            the quantized model to.
# Falcon-H1 also runs mlx_layout.py --falcon-mup, the fixture with every muP multiplier
# made a power of two other than 1 and the weights divided by it (the same math), as
# Hugging Face checkpoint (hf-mup) and converted (mlx-mup, mlx-mup-q4): folding the
# multipliers, and applying at run time the ones mlx-lm does not fold, is then exercised.
# One ok / FAIL / SKIP line per check; exit 1 on any failure.
# usage: mlx_hybrids.sh LMHOST CHECK_MODEL MODELS_DIR   (KEEP=1: leave the dirs made, for
# a look; their folder is printed)
set -u
if [ $# -ne 3 ]; then
    echo "usage: mlx_hybrids.sh LMHOST CHECK_MODEL MODELS_DIR" >&2
    exit 2
fi
lmhost=$1 check=$2 models=$3
conv="$(cd "$(dirname "$0")" && pwd)/mlx_layout.py"
tmp=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
fails=0
plugins=$("$lmhost" plugins 2>/dev/null | grep '^ *model types:')
if [ -z "$plugins" ]; then
    echo "FAIL: '$lmhost plugins' lists no architecture plugin"
    exit 1
fi

fail() { # name message [log file]
    echo "FAIL $1: $2"
    [ $# -gt 2 ] && [ -s "$3" ] && sed 's/^/     /' "$3" | tail -n 15
    fails=$((fails + 1))
}

check() { # name dir: check_model against dir's reference.json / logits.npy
    if "$check" "$lmhost" "$2" f32 auto >"$tmp/log" 2>&1; then
        echo "ok   $1: $(grep -m1 '^logits' "$tmp/log")"
    else
        fail "$1" "check_model exit $?" "$tmp/log"
    fi
}

convert() { # name src dst [option]: mlx_layout.py, 0 when it worked
    if python3 "$conv" "${@:2}" >"$tmp/log" 2>&1; then return 0; fi
    fail "$1" "mlx_layout.py ${*:2} failed" "$tmp/log"
    return 1
}

layout_ok() { # name dir: the quantized dir is in mlx-lm's layout, its mixers quantized
    python3 - "$2" >"$tmp/log" 2>&1 <<'PY'
import json, re, struct, sys
d = sys.argv[1]
raw = open(d + "/model.safetensors", "rb").read(1 << 20)
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
h.pop("__metadata__", None)
q = [k[:-len(".scales")] for k in h if k.endswith(".scales")]
bad = [k for k in h if ".experts." in k or ("conv1d.weight" in k and h[k]["shape"][-1] != 1)]
if bad:
    sys.exit("not mlx-lm's layout: %s" % ", ".join(bad[:4]))
for k in q:
    if h[k + ".weight"]["dtype"] != "U32" or k + ".biases" not in h:
        sys.exit("%s: not an MLX quantized triple" % k)
mix = [k for k in q if re.search(r"\.(mamba|mixer|linear_attn)\.(in_proj|in_proj_\w+|x_proj|out_proj)$", k)]
if not mix:
    sys.exit("no recurrent mixer projection is quantized")
stacked = [k for k in h if ".switch_mlp." in k and k.endswith(".weight")]
unq = [k for k in stacked if h[k]["dtype"] != "U32"]
if unq:
    sys.exit("experts left unquantized: %s" % ", ".join(unq[:3]))
print("%d quantized (%d mixer projections, %d stacked expert tensors)" % (len(q), len(mix), len(stacked)))
PY
}

same_weights() { # dequantized-dir float-dir: the same tensors, quantized ones within a step
    python3 - "$1" "$2" >"$tmp/log" 2>&1 <<'PY'
import json, struct, sys
def load(d):
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        a, b = v["data_offsets"]
        data = raw[8 + n + a:8 + n + b]
        if v["dtype"] == "F32":
            vals = struct.unpack("<%df" % (len(data) // 4), data)
        elif v["dtype"] == "F16":
            vals = struct.unpack("<%de" % (len(data) // 2), data)
        elif v["dtype"] == "BF16":
            hs = struct.unpack("<%dH" % (len(data) // 2), data)
            vals = struct.unpack("<%df" % len(hs), struct.pack("<%dI" % len(hs), *[x << 16 for x in hs]))
        else:
            sys.exit("%s: %s is %s" % (d, k, v["dtype"]))
        out[k] = (v["shape"], vals)
    return out
dq, ref = load(sys.argv[1]), load(sys.argv[2])
if sorted(dq) != sorted(ref):
    sys.exit("tensor names differ: %s" % sorted(set(dq) ^ set(ref))[:4])
worst = 0.0
for k in dq:
    (s1, a), (s2, b) = dq[k], ref[k]
    if s1 != s2:
        sys.exit("%s: shape %s, the float model's %s" % (k, s1, s2))
    top = max(abs(x) for x in b) or 1.0
    err = max(abs(x - y) for x, y in zip(a, b)) / top
    worst = max(worst, err)
    if err > 0.14:  # MLX's affine 4-bit error is at most a step, (max - min) / 15 of a group
        sys.exit("%s: dequantized differs from the float weights by %.3g x max|w|" % (k, err))
print("dequantized weights within %.3g x max|w| of the float model's" % worst)
PY
}

quantized() { # name mlx-dir float-mlx-dir: quantize, reference from the dequantized copy, check
    local name=$1 src=$2 float=$3 q=$tmp/$1 dq=$tmp/$1-dq
    if ! "$lmhost" quantize --model "$src" --out "$q" --bits 4 >"$tmp/log" 2>&1; then
        fail "$name" "lmhost quantize failed" "$tmp/log"
        return
    fi
    if ! layout_ok "$name" "$q"; then
        fail "$name" "$(tail -n 1 "$tmp/log")"
        return
    fi
    local what
    what=$(cat "$tmp/log")
    if ! "$lmhost" dequantize --model "$q" --out "$dq" >"$tmp/log" 2>&1; then
        fail "$name" "lmhost dequantize failed" "$tmp/log"
        return
    fi
    if ! same_weights "$dq" "$float"; then
        fail "$name" "$(tail -n 1 "$tmp/log")"
        return
    fi
    what="$what; $(cat "$tmp/log")"
    local prompt gen
    prompt=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt"])))' \
        "$src/reference.json")
    if ! "$lmhost" logits --model "$dq" --tokens "$prompt" --out "$q/logits.npy" >"$tmp/log" 2>&1 ||
        ! gen=$("$lmhost" generate --model "$dq" --tokens "$prompt" --max-tokens 12 2>"$tmp/log"); then
        fail "$name" "the dequantized model does not run" "$tmp/log"
        return
    fi
    python3 - "$q" "$prompt" "$gen" <<'PY'
import json, struct, sys
d, prompt, gen = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(d + "/logits.npy", "rb").read()
hl = struct.unpack("<H", raw[8:10])[0]
hdr = raw[10:10 + hl].decode()
shape = hdr[hdr.index("'shape':") + 8:].split(")")[0].strip(" (")
n, v = [int(x) for x in shape.split(",") if x.strip()]
vals = struct.unpack("<%df" % (n * v), raw[10 + hl:10 + hl + 4 * n * v])
top1, margin = [], []
for r in range(n):
    row = sorted(range(v), key=lambda i: -vals[r * v + i])
    top1.append(row[0])
    margin.append(vals[r * v + row[0]] - vals[r * v + row[1]])
json.dump({"prompt": [int(x) for x in prompt.split(",")], "greedy": json.loads(gen)["tokens"],
           "top1": top1, "top1_margin": margin}, open(d + "/reference.json", "w"))
PY
    check "$name ($what)" "$q"
}

# fixture and the plugin's model type (the fixture's config says which)
for fam in mamba mamba2 jamba falcon_h1 granitemoehybrid nemotron_h qwen3_next qwen3_5; do
    src=$models/$fam
    if [ ! -f "$src/config.json" ]; then
        echo "SKIP $fam: no fixture at $src"
        continue
    fi
    type=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_type"])' "$src/config.json")
    if ! grep -qw -- "$type" <<<"$plugins"; then
        echo "SKIP $fam: no plugin for model type $type is built"
        continue
    fi
    # f32 in mlx-lm's layout, against the Hugging Face reference
    if convert "$fam-mlx" "$src" "$tmp/$fam-mlx"; then
        check "$fam-mlx" "$tmp/$fam-mlx"
    fi
    # experts per expert, for lmhost quantize to stack into switch_mlp while quantizing
    if convert "$fam-mlx-q4" "$src" "$tmp/$fam-mlxe" --per-expert; then
        quantized "$fam-mlx-q4" "$tmp/$fam-mlxe" "$tmp/$fam-mlx"
    fi
    if [ "$fam" = falcon_h1 ]; then
        if convert "$fam-hf-mup" --falcon-mup "$src" "$tmp/$fam-hf-mup"; then
            check "$fam-hf-mup" "$tmp/$fam-hf-mup"
            if convert "$fam-mlx-mup" "$tmp/$fam-hf-mup" "$tmp/$fam-mlx-mup"; then
                check "$fam-mlx-mup" "$tmp/$fam-mlx-mup"
                quantized "$fam-mlx-mup-q4" "$tmp/$fam-mlx-mup" "$tmp/$fam-mlx-mup"
            fi
        fi
    fi
    [ -n "${KEEP:-}" ] || rm -rf "${tmp:?}/$fam"*
done

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all MLX hybrid checks passed"
