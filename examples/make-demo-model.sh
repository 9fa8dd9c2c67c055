#!/bin/sh
# Assembles a small servable model directory: the e2e test model (two Qwen3 layers with
# random weights: it talks gibberish, quickly) beside the real Qwen3 tokenizer and chat
# template (fetched with npm). Point `lmhost serve --model` at a real checkpoint directory
# (config.json, *.safetensors, tokenizer.json, tokenizer_config.json) for real answers.
# usage: examples/make-demo-model.sh OUT_DIR
set -eu
out=${1:?usage: make-demo-model.sh OUT_DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${LMHOST_TOKENIZERS:-$HOME/.cache/lmhost/tokenizers}
"$here/tools/fetch_tokenizers.sh" "$cache" >/dev/null
mkdir -p "$out"
for f in config.json model.safetensors; do ln -sf "$here/tests/data/e2e/$f" "$out/$f"; done
for f in tokenizer.json tokenizer_config.json; do ln -sf "$cache/qwen3/$f" "$out/$f"; done
echo "$out"
