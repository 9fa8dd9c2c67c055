#!/usr/bin/env bash
# lmhost quantize round trip: quantize a fixture's f32 model to 4 bits, dequantize that to
# float32 (an independent path: no quantized kernel runs), take the dequantized model's
# logits and greedy continuation as the reference, and check the quantized model against
# them with check_model (logits within 1e-3 x max |logit|, argmax, greedy).
# usage: quantize_round_trip.sh LMHOST CHECK_MODEL MODEL_DIR
set -eu
lmhost=$1 check=$2 model=$3
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
"$lmhost" quantize --model "$model" --out "$t/q" --bits 4
"$lmhost" dequantize --model "$t/q" --out "$t/dq"
prompt=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt"])))' \
    "$model/reference.json")
"$lmhost" logits --model "$t/dq" --tokens "$prompt" --out "$t/q/logits.npy" >/dev/null
gen=$("$lmhost" generate --model "$t/dq" --tokens "$prompt" --max-tokens 12)
python3 - "$t/q" "$prompt" "$gen" <<'PY'
import json, struct, sys
d, prompt, gen = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(d + "/logits.npy", "rb").read()
hl = struct.unpack("<H", raw[8:10])[0]
hdr = raw[10:10 + hl].decode()
shape = eval(hdr[hdr.index("'shape':") + 8:].split(")")[0] + ")")
n, v = shape
vals = struct.unpack("<%df" % (n * v), raw[10 + hl:10 + hl + 4 * n * v])
top1, margin = [], []
for r in range(n):
    row = sorted(range(v), key=lambda i: -vals[r * v + i])
    top1.append(row[0])
    margin.append(vals[r * v + row[0]] - vals[r * v + row[1]])
json.dump({"prompt": [int(x) for x in prompt.split(",")], "greedy": json.loads(gen)["tokens"],
           "top1": top1, "top1_margin": margin}, open(d + "/reference.json", "w"))
PY
"$check" "$lmhost" "$t/q" f32 auto
