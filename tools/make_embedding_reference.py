#!/usr/bin/env python3
"""Embedding references for /v1/embeddings, made with transformers (not by lmhost).

usage: make_embedding_reference.py MODEL_DIR TOKENIZER_DIR OUT.json

For each text: its token ids (the Hugging Face tokenizer, no special tokens added), and the
model's final hidden states (AutoModel's last_hidden_state, after the final norm) pooled two
ways, each L2-normalized: "mean" over the tokens and "last" (the last token's, as
Qwen3-Embedding pools)."""
import json
import sys

import torch
from transformers import AutoModel, AutoTokenizer

model_dir, tok_dir, out = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(tok_dir)
model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
texts = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors; similar texts land close together.",
    "日本語のテキストと emoji 🙂 mixed in one input",
    "def add(a, b):\n    return a + b\n" * 3,
]
cases = []
for t in texts:
    ids = tok(t, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        h = model(torch.tensor([ids])).last_hidden_state[0].double()
    mean = torch.nn.functional.normalize(h.mean(0), dim=0)
    last = torch.nn.functional.normalize(h[-1], dim=0)
    cases.append({"text": t, "ids": ids, "mean": mean.tolist(), "last": last.tolist()})
json.dump({"note": "made by tools/make_embedding_reference.py with transformers "
           + __import__("transformers").__version__, "cases": cases}, open(out, "w"))
print(out, len(cases), "cases,", h.shape[-1], "dims")
