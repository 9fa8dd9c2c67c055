#!/usr/bin/env python3
"""Fixtures the shared generator does not make, built with its own functions so they follow
the same rules (random spread weights, float32 references on CPU):

  qwen2_moe          qwen2_moe with a shared expert and its sigmoid gate
  gemma3_nested      a multimodal gemma3 checkpoint (model_type gemma3, text_config, a
                     tiny vision tower); the reference runs text only
  <dense>-mlxB[gG]   MLX variants of the dense archs for MLX_VARIANTS (bits:group list)

usage: gen_extra_fixtures.py GEN_FIXTURES_PY OUT SEED [qwen2_moe] [gemma3_nested] [mlx]
Needs torch + transformers (run it where they are installed).
"""
import importlib.util
import os
import sys

gen_path, out, seed = sys.argv[1], sys.argv[2], sys.argv[3]
what = set(sys.argv[4:]) or {"qwen2_moe", "gemma3_nested", "mlx"}
sys.argv = [gen_path, out, seed]  # the shared generator reads OUT and SEED from argv
spec = importlib.util.spec_from_file_location("gen_fixtures", gen_path)
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

os.makedirs(out, exist_ok=True)
torch.set_num_threads(8)

if "qwen2_moe" in what:
    g.make("qwen2_moe", "qwen2_moe", g.common(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                                              shared_expert_intermediate_size=96, norm_topk_prob=False,
                                              decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1000000.0), out)

if "gemma3_nested" in what:
    arch = "gemma3_nested"
    text = g.common(num_hidden_layers=4, sliding_window=8, query_pre_attn_scalar=32, rope_theta=1000000.0,
                    rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
                    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=32, patch_size=16, num_channels=3)
    cfg = AutoConfig.for_model("gemma3", text_config=text, vision_config=vision, mm_tokens_per_image=4,
                               tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    try:
        cfg.text_config._attn_implementation = "eager"
    except Exception:
        pass
    gen = torch.Generator().manual_seed(int(seed) * 1000 + sum(map(ord, arch)))
    torch.manual_seed(int(seed))
    from transformers import Gemma3ForConditionalGeneration
    model = Gemma3ForConditionalGeneration(cfg).to(torch.float32).eval()
    g.randomize(model, gen)
    prompt = torch.randint(1, 500, (g.N_PROMPT,), generator=gen).tolist()
    d = os.path.join(out, arch)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    logits, greedy = g.run_ref(model, prompt)
    g.write_ref(d, prompt, logits, greedy, "gemma3 multimodal checkpoint (text_config); text-only reference in float32",
                "gemma3")
    print(f"[{arch}] ok", flush=True)

if "mlx" in what:
    for arch in sorted(g.DENSE_VARIANTS):
        mt, kw = g.ARCHS[arch]
        g.make(arch, mt, dict(kw), out)
