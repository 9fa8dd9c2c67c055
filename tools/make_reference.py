#!/usr/bin/env python3
"""Reference fixtures for `lmhost check-plugin`, computed by Hugging Face transformers.

    python3 tools/make_reference.py DIR                 # a checkpoint already in DIR
    python3 tools/make_reference.py DIR --init CONFIG   # a tiny random model from CONFIG first

DIR ends up holding what check-plugin reads beside the checkpoint:
  reference.json      prompt (token ids), greedy (the next --gen tokens, decoded one at a
                      time with the KV cache), top1 and top1_margin per prompt position
  logits.npy          float32 [prompt, vocab]: every prompt position's logits, one pass
  hidden_states.npy   float32 [layers + 1, prompt, hidden]: transformers' hidden_states
                      (entry 0 the embeddings, entry l + 1 layer l's output; the last entry
                      usually has the final norm applied)

--init CONFIG writes a model of that config.json with random weights first (every
parameter drawn from a normal distribution scaled by its fan-in, norms included, so that no
formula hides behind an initial value of 1 or 0), in float32 safetensors. Keep such a model
tiny (hidden 64, 2-4 layers, vocab 512): it tests the arithmetic, not the quality.
Needs torch and transformers (pip install torch transformers); runs on the CPU in float32.
"""
import argparse
import json
import math
import os

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            fan_in = p.shape[-1] if p.ndim >= 2 else 1
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="the checkpoint directory (written with --init)")
    ap.add_argument("--init", metavar="CONFIG", help="config.json of a random model to write first")
    ap.add_argument("--seed", type=int, default=0, help="weights (with --init) and prompt")
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--gen", type=int, default=12, help="greedy tokens")
    ap.add_argument("--prompt", help="comma-separated token ids instead of a random prompt")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    if a.init:
        with open(a.init) as f:
            cfg = AutoConfig.for_model(**json.load(f))
        cfg.torch_dtype = torch.float32
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        randomize(model, a.seed)
        model.save_pretrained(a.dir, safe_serialization=True)
    model = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    vocab = model.config.get_text_config().vocab_size
    if a.prompt:
        prompt = [int(t) for t in a.prompt.split(",")]
    else:
        gen = torch.Generator().manual_seed(a.seed)
        prompt = torch.randint(1, vocab, (a.prompt_len,), generator=gen).tolist()

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        logits = out.logits[0].float().numpy()
        hidden = torch.stack([h[0] for h in out.hidden_states]).float().numpy()
        # an explicit mask, and no pad/eos: generate() must neither mask nor stop on a token
        cont = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.gen,
                              min_new_tokens=a.gen, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    greedy = cont[0, len(prompt):].tolist()
    top = np.sort(logits, -1)
    np.save(os.path.join(a.dir, "logits.npy"), logits.astype(np.float32))
    np.save(os.path.join(a.dir, "hidden_states.npy"), hidden.astype(np.float32))
    with open(os.path.join(a.dir, "reference.json"), "w") as f:
        json.dump({"model_type": model.config.model_type, "prompt": prompt, "greedy": greedy,
                   "top1": logits.argmax(-1).tolist(), "top1_margin": (top[:, -1] - top[:, -2]).tolist(),
                   "note": "float32 on CPU; tools/make_reference.py",
                   "transformers": transformers.__version__}, f, indent=1)
    print(f"{a.dir}: prompt {len(prompt)}, greedy {greedy}, hidden_states {list(hidden.shape)}")


if __name__ == "__main__":
    main()
