#!/usr/bin/env python3
"""Fixtures the shared generator does not make, built with its own functions so they follow
the same rules (random spread weights, float32 references on CPU):

  qwen2_moe          qwen2_moe with a shared expert and its sigmoid gate
  gemma3_nested      a multimodal gemma3 checkpoint (model_type gemma3, text_config, a
                     tiny vision tower); the reference runs text only
  <dense>-mlxB[gG]   MLX variants of the dense archs for MLX_VARIANTS (bits:group list)
  qwen3_moe-mlx4     (target qwen3_moe_mlx) the shared generator's make_moe_mlx: experts stacked
                     as mlp.switch_mlp.*, 4-bit groups of 64, the router mlp.gate 8-bit through a
                     per-module override
  gemma4_moe-mlx4    (target gemma4_moe_mlx) gemma4_moe as mlx-lm writes a quantized Gemma 4: the
                     fused experts.gate_up_proj [E, 2I, H] split at I into
                     experts.switch_glu.gate_proj / up_proj [E, I, H] and experts.down_proj as
                     experts.switch_glu.down_proj [E, H, I], all 4-bit groups of 64; the router
                     router.proj 8-bit groups of 64 through a per-module override; every other
                     Linear/Embedding 4-bit (those whose input size is not a multiple of 64 stay
                     bf16), norms and scales bf16. Same seed and weights as gemma4_moe.

usage: gen_extra_fixtures.py GEN_FIXTURES_PY OUT SEED [qwen2_moe] [gemma3_nested] [mlx]
                             [qwen3_moe_mlx] [gemma4_moe_mlx]
(no target: the first three)
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

if "qwen3_moe_mlx" in what:
    mt, kw = g.ARCHS["qwen3_moe"]
    g.make_moe_mlx("qwen3_moe", mt, dict(kw), out)


class _KeepLinear(torch.nn.Module):
    """A Linear already quantized by hand: the generic MLX pass must not quantize it again."""

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight, getattr(self, "bias", None))


def make_gemma4_moe_mlx(root):
    arch = "gemma4_moe"
    mt, kw = g.ARCHS[arch]
    kw = dict(kw)
    # the same steps as the shared generator's make(), so the weights equal gemma4_moe's
    gen = torch.Generator().manual_seed(g.SEED * 1000 + sum(map(ord, arch)))
    cfg = AutoConfig.for_model(mt, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(g.SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    g.randomize(model, gen)
    prompt = torch.randint(1, model.config.vocab_size, (g.N_PROMPT,), generator=gen).tolist()
    pre, handled, overrides = {}, set(), {}
    with torch.no_grad():
        for n, p in list(model.named_parameters()):
            if n.endswith(".experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
                base = n[:-len("gate_up_proj")] + "switch_glu."
                half = p.shape[1] // 2
                for name, w in (("gate_proj", p[:, :half, :]), ("up_proj", p[:, half:, :])):
                    pk, sc, bi, dq = g.mlx_quant(w, 4, 64)
                    pre[base + name + ".weight"], pre[base + name + ".scales"] = pk, sc
                    pre[base + name + ".biases"] = bi
                    w.copy_(dq)
                handled.add(n)
            elif n.endswith(".experts.down_proj"):  # [E, H, I]
                base = n[:-len("down_proj")] + "switch_glu.down_proj"
                pk, sc, bi, dq = g.mlx_quant(p.data, 4, 64)
                pre[base + ".weight"], pre[base + ".scales"], pre[base + ".biases"] = pk, sc, bi
                p.copy_(dq)
                handled.add(n)
        for mname, mod in list(model.named_modules()):
            if mname.endswith(".router.proj"):  # 8-bit, as mlx-lm's gemma4 quant_predicate asks
                pk, sc, bi, dq = g.mlx_quant(mod.weight.data, 8, 64)
                pre[mname + ".weight"], pre[mname + ".scales"], pre[mname + ".biases"] = pk, sc, bi
                mod.weight.copy_(dq)
                handled.add(mname + ".weight")
                overrides[mname] = {"group_size": 64, "bits": 8}
                mod.__class__ = _KeepLinear
        # buffers the checkpoint carries (layer_scalar), as mlx-lm keeps them: bf16
        saved = model.state_dict()
        for k, v in model.named_buffers():
            if k in saved and k not in pre and v.is_floating_point():
                pre[k] = v.to(torch.bfloat16).contiguous()
                v.copy_(v.to(torch.bfloat16).float())
    if not any(k.endswith("switch_glu.gate_proj.weight") for k in pre) or not overrides:
        raise SystemExit("gemma4_moe_mlx: no fused experts or router found in this transformers version")
    g.mlx_variant(model, prompt, kw, os.path.join(root, arch + "-mlx4"), 4, 64, mt,
                  pre_tensors=pre, handled=handled, overrides=overrides)


if "gemma4_moe_mlx" in what:
    make_gemma4_moe_mlx(out)
