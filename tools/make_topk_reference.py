#!/usr/bin/env python3
"""Logits of the MoE fixtures with fewer experts a token, made by transformers: the reference
for `lmhost logits --moe-top-k K` (tests/conformance/moe_top_k.sh).

usage: make_topk_reference.py MODELS_DIR OUT_DIR [FIXTURE ...]

Each fixture (a directory of MODELS_DIR with config.json, model.safetensors and
reference.json) is loaded with its config's experts-per-token set to 1 (num_experts_per_tok,
top_k_experts or experts_per_token, wherever the config has it, text_config included), in
float32 on the CPU, and run over the first 16 tokens of its reference prompt; the logits go
to OUT_DIR/FIXTURE-k1.npy (float32 [16, vocab]). Each family's router keeps its own rule
(softmax then top-k renormalised, or not) with the new k, which is what the host's
moe_top_k must match. As a check, the same model at its own k must reproduce the fixture's
logits.npy (printed). Needs torch, transformers and numpy (the device has them).
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

N_TOKENS = 16
FIXTURES = ["qwen3_moe", "mixtral", "jamba", "qwen2_moe", "gemma4_moe", "granitemoehybrid",
            "qwen3_next", "qwen3_5_moe", "gpt_oss"]
KEYS = ("num_experts_per_tok", "top_k_experts", "experts_per_token")


def set_k(cfg, k):
    """Sets every experts-per-token key the config (or its text_config) has; how many."""
    n = 0
    for c in (cfg, getattr(cfg, "text_config", None)):
        for key in KEYS:
            if c is not None and getattr(c, key, None) is not None:
                setattr(c, key, k)
                n += 1
    return n


def logits_of(d, prompt, k):
    cfg = AutoConfig.from_pretrained(d)
    if k is not None and not set_k(cfg, k):
        raise SystemExit(f"{d}: no experts-per-token key in its config")
    model = AutoModelForCausalLM.from_pretrained(d, config=cfg, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float().numpy()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    models, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name in sys.argv[3:] or FIXTURES:
        d = os.path.join(models, name)
        prompt = json.load(open(os.path.join(d, "reference.json")))["prompt"][:N_TOKENS]
        own = logits_of(d, prompt, None)
        ref = np.load(os.path.join(d, "logits.npy"))[:N_TOKENS]
        print(f"{name}: at its own k, max |transformers now - fixture| = "
              f"{np.abs(own - ref).max():.3g} (max |logit| {np.abs(ref).max():.3g})")
        one = logits_of(d, prompt, 1)
        print(f"{name}: k = 1 moves the logits by {np.abs(one - own).max():.3g}")
        np.save(os.path.join(out, f"{name}-k1.npy"), one.astype(np.float32))


if __name__ == "__main__":
    main()
