#!/usr/bin/env python3
"""Writes a model directory with random bf16 weights in a given Llama-style shape, for
benchmarks (no download, no numpy: bytes come from os.urandom).

usage: make_random_model.py OUT [--preset qwen3-0.6b|qwen3-1.7b|llama-2-7b|mixtral-2g|
                                          granite-4.0-h-tiny|gpt-oss-20b|qwen3-30b-a3b]
                             [--layers N] [--vocab N] [--set KEY=N ...] [--mlx BITS[:GROUP]]

--set overrides any integer of the preset's config (e.g. hidden_size=256 intermediate_size=256
for a model whose decode time is the dispatch chain's fixed cost, not its weight reads); one
--set takes every KEY=N that follows it.

Weights are uniform in magnitude over [2^-7, 2^-5) with random signs (like a trained
matrix's spread); norm weights are in [1, 2). --mlx writes every matrix (the embedding
and head too) as mlx-lm's quantized checkpoints hold them: random BITS-bit codes with bf16
scales and biases that centre each group's codes (weights of mean zero, up to about 2^-5;
default group 64), with no quantize step between (a 7B shape in seconds rather than
minutes). The tokenizer is not written: `lmhost bench`
feeds token ids directly.

gpt-oss-20b writes the experts as the published gpt-oss checkpoints hold them, microscaled
4-bit (MXFP4): mlp.experts.X_blocks uint8 [E, out, in/32, 16] of random e2m1 codes and
X_scales uint8 [E, out, in/32] of e8m0 scales 2^-7 or 2^-6 (weights of the same spread),
config.json's quantization_config saying mxfp4; everything else bf16 (biases and sinks
too).

qwen3-30b-a3b (qwen3_moe) is Qwen3-30B-A3B's shape: Qwen3 attention (q/k norms), every layer
a renormalised top-8 of 128 experts of 768 behind a router model.layers.N.mlp.gate.weight
[E, H]. In bf16 the experts are per-expert tensors as the Hugging Face checkpoint holds them,
model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight (61 GB at full size); with --mlx they
are stacked as mlx-lm's conversion writes them, model.layers.N.mlp.switch_mlp.{gate,up,
down}_proj.{weight,scales,biases} [E, out, in * BITS / 32] (lmhost takes quantized experts only
stacked), and the router is 8-bit in groups of 64 as mlx-lm's qwen3_moe quant_predicate has it,
config.json's "quantization" naming each model.layers.N.mlp.gate with its own bits/group_size.
At full size --mlx 4 is one 16.0 GiB (17.2 GB) model.safetensors, about a minute to write on
two cores. A small variant for tests:
  make_random_model.py OUT --preset qwen3-30b-a3b --layers 2 --mlx 4 --set hidden_size=256
      moe_intermediate_size=512 num_experts=64 num_experts_per_tok=4 vocab_size=2000

The file is written streaming: bytes are drawn in chunks of 32 MiB on worker threads (one a
core, up to 4; os.urandom lets go of the GIL) a few chunks ahead of the writes, so memory
stays near 200 MB whatever the model's size.
"""
import collections
import concurrent.futures
import json
import os
import struct
import sys

PRESETS = {
    # Qwen3-0.6B: hidden 1024, 28 layers, 16 heads / 8 KV heads of 128, MLP 3072.
    "qwen3-0.6b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=1024,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936,
                       max_position_embeddings=40960, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu"),
    # Qwen3-1.7B: hidden 2048, 28 layers, 16 heads / 8 KV heads of 128, MLP 6144; 3.2 GiB.
    "qwen3-1.7b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=2048,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144, vocab_size=151936,
                       max_position_embeddings=40960, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu"),
    # Llama-2-7B: hidden 4096, 32 layers, 32 heads of 128 (no GQA), MLP 11008; 12.6 GiB.
    "llama-2-7b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       head_dim=128, intermediate_size=11008, vocab_size=32000,
                       max_position_embeddings=16384, rms_norm_eps=1e-5, rope_theta=10000.0,
                       tie_word_embeddings=False, hidden_act="silu"),
    # A Mixtral-shaped MoE of about 2.3 GB: 8 experts, top-2, for decode bytes/token.
    "mixtral-2g": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=2048,
                       num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       intermediate_size=5632, vocab_size=32000, num_local_experts=8,
                       num_experts_per_tok=2, max_position_embeddings=32768, rms_norm_eps=1e-5,
                       rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu"),
    # Granite-4.0-H-Tiny's shape (IBM, granitemoehybrid): hidden 1536, 40 layers of which 4
    # attention (layer i % 10 == 5, no positional encoding), the rest Mamba-2 (48 heads of
    # 64, state 128, one group); every layer a top-6 of 64 experts of 512 beside a shared
    # MLP of 1024; vocabulary 100352. About 6.9 B parameters, 13 GiB in bf16.
    "granite-4.0-h-tiny": dict(model_type="granitemoehybrid",
                               architectures=["GraniteMoeHybridForCausalLM"], hidden_size=1536,
                               num_hidden_layers=40, num_attention_heads=12, num_key_value_heads=4,
                               intermediate_size=512, num_local_experts=64, num_experts_per_tok=6,
                               shared_intermediate_size=1024, mamba_n_heads=48, mamba_d_head=64,
                               mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
                               mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False,
                               vocab_size=100352, max_position_embeddings=131072,
                               rms_norm_eps=1e-5, position_embedding_type="nope",
                               embedding_multiplier=12.0, logits_scaling=6.0,
                               residual_multiplier=0.22, attention_multiplier=0.0078125,
                               tie_word_embeddings=True, hidden_act="silu"),
    # gpt-oss-20b (OpenAI, gpt_oss): hidden 2880, 24 layers alternating sliding (128) and full
    # attention, 64 query heads / 8 KV heads of 64 with sinks and q/k/v/o biases, 32 experts
    # of 2880 (top 4, biased router, fused interleaved gate/up, clamped SwiGLU), YaRN x32,
    # vocabulary 201088; experts MXFP4. About 12.8 GiB.
    "gpt-oss-20b": dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"],
                        hidden_size=2880, num_hidden_layers=24, num_attention_heads=64,
                        num_key_value_heads=8, head_dim=64, intermediate_size=2880,
                        num_local_experts=32, num_experts_per_tok=4, experts_per_token=4,
                        vocab_size=201088, max_position_embeddings=131072,
                        initial_context_length=4096, rms_norm_eps=1e-5, rope_theta=150000.0,
                        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "truncate": False,
                                      "original_max_position_embeddings": 4096},
                        sliding_window=128, swiglu_limit=7.0, attention_bias=True,
                        tie_word_embeddings=False, hidden_act="silu",
                        quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
                            "model.layers.*.self_attn", "model.layers.*.mlp.router",
                            "model.embed_tokens", "lm_head"]}),
    # Qwen3-30B-A3B (qwen3_moe): hidden 2048, 48 layers, 32 heads / 4 KV heads of 128 with
    # q/k norms, every layer a renormalised top-8 of 128 experts of 768; vocabulary 151936.
    # About 30.5 B parameters: 57 GiB in bf16, 16.0 GiB with --mlx 4.
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
                          hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                          rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu"),
}


def gpt_oss_tensors(c):
    """(name, shape, kind) with kind "norm", "weight", "blocks" or "e8m0"."""
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I = c["num_local_experts"], c["intermediate_size"]
    yield "model.embed_tokens.weight", [V, H], "weight"
    for i in range(L):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [H], "norm"
        yield p + "post_attention_layernorm.weight", [H], "norm"
        for x, o, n in (("q", nh * hd, H), ("k", nkv * hd, H), ("v", nkv * hd, H), ("o", H, nh * hd)):
            yield p + f"self_attn.{x}_proj.weight", [o, n], "weight"
            yield p + f"self_attn.{x}_proj.bias", [o], "weight"
        yield p + "self_attn.sinks", [nh], "weight"
        yield p + "mlp.router.weight", [E, H], "weight"
        yield p + "mlp.router.bias", [E], "weight"
        for x, o, n in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            yield p + f"mlp.experts.{x}_blocks", [E, o, n // 32, 16], "blocks"
            yield p + f"mlp.experts.{x}_scales", [E, o, n // 32], "e8m0"
            yield p + f"mlp.experts.{x}_bias", [E, o], "weight"
    yield "model.norm.weight", [H], "norm"
    yield "lm_head.weight", [V, H], "weight"


def granite_tensors(c):
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = H // nh
    mh, P, N, G = c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"], c["mamba_n_groups"]
    I, K = mh * P, c["mamba_d_conv"]
    CD = I + 2 * G * N
    E, EI, S = c["num_local_experts"], c["intermediate_size"], c["shared_intermediate_size"]
    yield "model.embed_tokens.weight", [V, H], False
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [H], True
        yield p + "post_attention_layernorm.weight", [H], True
        if kind == "attention":
            yield p + "self_attn.q_proj.weight", [nh * hd, H], False
            yield p + "self_attn.k_proj.weight", [nkv * hd, H], False
            yield p + "self_attn.v_proj.weight", [nkv * hd, H], False
            yield p + "self_attn.o_proj.weight", [H, nh * hd], False
        else:
            m = p + "mamba."
            yield m + "in_proj.weight", [I + CD + mh, H], False
            yield m + "conv1d.weight", [CD, 1, K], False
            yield m + "conv1d.bias", [CD], False
            yield m + "dt_bias", [mh], False
            yield m + "A_log", [mh], False
            yield m + "D", [mh], False
            yield m + "norm.weight", [I], True
            yield m + "out_proj.weight", [H, I], False
        yield p + "block_sparse_moe.router.layer.weight", [E, H], False
        yield p + "block_sparse_moe.input_linear.weight", [E, 2 * EI, H], False
        yield p + "block_sparse_moe.output_linear.weight", [E, H, EI], False
        yield p + "shared_mlp.input_linear.weight", [2 * S, H], False
        yield p + "shared_mlp.output_linear.weight", [H, S], False
    yield "model.norm.weight", [H], True


def moe_layer(c, i):
    """Whether qwen3_moe layer i has experts (as Hugging Face and mlx-lm decide)."""
    step = c.get("decoder_sparse_step", 1)
    return (c["num_experts"] > 0 and i not in c.get("mlp_only_layers", [])
            and (i + 1) % step == 0)


def tensors(c, stacked=False):
    """(name, shape, norm); stacked: qwen3_moe experts as mlx-lm's switch_mlp [E, out, in]."""
    if c["model_type"] == "granitemoehybrid":
        yield from granite_tensors(c)
        return
    H, L = c["hidden_size"], c["num_hidden_layers"]
    hd, nh, nkv, I = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    yield "model.embed_tokens.weight", [c["vocab_size"], H], False
    for i in range(L):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [H], True
        yield p + "post_attention_layernorm.weight", [H], True
        yield p + "self_attn.q_proj.weight", [nh * hd, H], False
        yield p + "self_attn.k_proj.weight", [nkv * hd, H], False
        yield p + "self_attn.v_proj.weight", [nkv * hd, H], False
        yield p + "self_attn.o_proj.weight", [H, nh * hd], False
        if c["model_type"] in ("qwen3", "qwen3_moe"):
            yield p + "self_attn.q_norm.weight", [hd], True
            yield p + "self_attn.k_norm.weight", [hd], True
        if c["model_type"] == "qwen3_moe" and moe_layer(c, i):
            E, MI = c["num_experts"], c["moe_intermediate_size"]
            yield p + "mlp.gate.weight", [E, H], False
            if stacked:
                for x, o, n in (("gate_proj", MI, H), ("up_proj", MI, H), ("down_proj", H, MI)):
                    yield p + f"mlp.switch_mlp.{x}.weight", [E, o, n], False
            else:
                for e in range(E):
                    q = f"{p}mlp.experts.{e}."
                    yield q + "gate_proj.weight", [MI, H], False
                    yield q + "up_proj.weight", [MI, H], False
                    yield q + "down_proj.weight", [H, MI], False
        elif c["model_type"] == "mixtral":
            E = c["num_local_experts"]
            yield p + "block_sparse_moe.gate.weight", [E, H], False
            for e in range(E):
                q = f"{p}block_sparse_moe.experts.{e}."
                yield q + "w1.weight", [I, H], False
                yield q + "w3.weight", [I, H], False
                yield q + "w2.weight", [H, I], False
        else:
            yield p + "mlp.gate_proj.weight", [I, H], False
            yield p + "mlp.up_proj.weight", [I, H], False
            yield p + "mlp.down_proj.weight", [H, I], False
    yield "model.norm.weight", [H], True
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", [c["vocab_size"], H], False


# bf16 little-endian: byte 1 = sign + exponent bits 7..1, byte 0 = exponent bit 0 + mantissa.
HI_WEIGHT = bytes((0x3C if b & 1 else 0xBC) for b in range(256))  # exponent 120/121, random sign
LO_ANY = bytes(range(256))
HI_NORM = bytes([0x3F] * 256)
LO_NORM = bytes((0x80 | (b & 0x7F)) for b in range(256))  # exponent 127: [1, 2)


HI_SCALE = bytes([0x3B] * 256)  # positive, exponent 118/119: [2^-9, 2^-7), a code step
E8M0_SCALE = bytes((120 + (b & 1)) for b in range(256))  # 2^-7 or 2^-6: e2m1 up to 6 x that


def mlx_scale_bias(kind, m):
    """m bytes of an MLX quantized matrix's bf16 scales ("qscaleBITS") or biases ("qbiasBITS"):
    every group's scale s = 2^-(4 + BITS) and bias -s (2^BITS - 1) / 2, so that its weights
    s q + b (q uniform random codes) have mean zero and reach about +-2^-5, like the float
    presets' weights. Random biases would give every matrix a common mean, the hidden states
    one direction, and a router the same experts for every token."""
    bits = int(kind.lstrip("qscalebias"))
    if kind.startswith("qscale"):
        e = 127 - 4 - bits
        pair = bytes(((e & 1) << 7, e >> 1))
    else:  # -(2 - 2^(1 - BITS)) 2^-6: exponent 121, mantissa 1 - 2^(1 - BITS)
        pair = bytes((0x80 | round((1 - 2.0 ** (1 - bits)) * 128), 0x80 | (121 >> 1)))
    return pair * (m // 2)


def random_bf16(n, kind):
    """kind: "weight", "norm", "scale" (positive, a code step) or "bias" (a weight)."""
    norm = kind == "norm"
    raw = os.urandom(2 * n)
    out = bytearray(2 * n)
    out[0::2] = raw[0::2].translate(LO_NORM if norm else LO_ANY)
    out[1::2] = raw[1::2].translate(HI_NORM if norm else HI_SCALE if kind == "scale" else HI_WEIGHT)
    return out


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    out, preset, layers, vocab, sets, mlx = args[0], "qwen3-0.6b", None, None, {}, None
    i = 1
    while i < len(args):
        if args[i] == "--preset":
            preset = args[i + 1]; i += 2
        elif args[i] == "--layers":
            layers = int(args[i + 1]); i += 2
        elif args[i] == "--vocab":
            vocab = int(args[i + 1]); i += 2
        elif args[i] == "--mlx":
            b, _, g = args[i + 1].partition(":")
            mlx = (int(b), int(g or 64)); i += 2
            if mlx[0] not in (2, 3, 4, 5, 6, 8) or mlx[1] not in (32, 64, 128):
                sys.exit("--mlx: BITS 2, 3, 4, 5, 6 or 8; GROUP 32, 64 or 128")
        elif args[i] == "--set" and i + 1 < len(args) and "=" in args[i + 1]:
            i += 1
            while i < len(args) and not args[i].startswith("-") and "=" in args[i]:
                k, v = args[i].split("=", 1)
                sets[k] = int(v); i += 1
        else:
            sys.exit(f"unknown option {args[i]}")
    c = dict(PRESETS[preset])
    if layers:
        c["num_hidden_layers"] = layers
    if vocab:
        c["vocab_size"] = vocab
    for k, v in sets.items():
        if k not in c or not isinstance(c[k], int) or isinstance(c[k], bool):
            sys.exit(f"--set: {k} is not an integer of the {preset} config")
        c[k] = v
    if c["model_type"] == "granitemoehybrid":
        c["layer_types"] = ["attention" if i % 10 == 5 else "mamba"
                            for i in range(c["num_hidden_layers"])]
    if c["model_type"] == "gpt_oss":
        c["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                            for i in range(c["num_hidden_layers"])]
        if mlx:
            sys.exit("--mlx: the gpt-oss preset's experts are MXFP4 already")
    if mlx:
        c["quantization"] = {"group_size": mlx[1], "bits": mlx[0]}

    def quant(name, shape):
        """(bits, group) for a matrix mlx-lm quantizes (a Linear, Embedding or SwitchLinear
        whose input width the group divides), else None; qwen3_moe's router is 8-bit in
        groups of 64 (mlx-lm's quant_predicate), named in config.json's quantization."""
        if (not mlx or not name.endswith(".weight") or shape[-1] % mlx[1]
                or not (len(shape) == 2 or len(shape) == 3 and ".switch_mlp." in name)):
            return None  # (other presets' 3-D tensors keep their bf16 Hugging Face form)
        if c["model_type"] == "qwen3_moe" and name.endswith(".mlp.gate.weight"):
            if shape[-1] % 64:
                return None
            c["quantization"][name[: -len(".weight")]] = {"group_size": 64, "bits": 8}
            return 8, 64
        return mlx

    header, off, plan = {}, 0, []

    def add(name, dtype, shape, nbytes, kind):
        nonlocal off
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        plan.append((nbytes, kind))
        off += nbytes

    for name, shape, kind in gpt_oss_tensors(c) if c["model_type"] == "gpt_oss" else ():
        n = 1
        for d in shape:
            n *= d
        if kind in ("blocks", "e8m0"):
            add(name, "U8", shape, n, kind)
        else:
            add(name, "BF16", shape, 2 * n, kind)
    for name, shape, norm in tensors(c, stacked=bool(mlx)) if c["model_type"] != "gpt_oss" else ():
        n = 1
        for d in shape:
            n *= d
        q = quant(name, shape)
        if q:
            bits, group = q
            lead, cols = shape[:-1], shape[-1]  # [E,] out, in
            add(name, "U32", lead + [cols * bits // 32], n * bits // 8, "codes")
            base = name[: -len(".weight")]
            add(base + ".scales", "BF16", lead + [cols // group], 2 * n // group, f"qscale{bits}")
            add(base + ".biases", "BF16", lead + [cols // group], 2 * n // group, f"qbias{bits}")
        else:
            add(name, "BF16", shape, 2 * n, "norm" if norm else "weight")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)

    def chunk(m, kind):
        if kind in ("codes", "blocks"):
            return os.urandom(m)
        if kind == "e8m0":
            return os.urandom(m).translate(E8M0_SCALE)
        if kind.startswith(("qscale", "qbias")):
            return mlx_scale_bias(kind, m)
        return random_bf16(m // 2, kind)

    # Chunks are made on worker threads (os.urandom drops the GIL) a few ahead of the
    # writes, which stay in order; at most `ahead` chunks of 32 MiB are held at once.
    workers = max(1, min(4, os.cpu_count() or 1))
    ahead = 2 * workers + 1
    with open(os.path.join(out, "model.safetensors"), "wb") as f, \
            concurrent.futures.ThreadPoolExecutor(workers) as pool:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        pending = collections.deque()
        for nbytes, kind in plan:
            for at in range(0, nbytes, 1 << 25):
                pending.append(pool.submit(chunk, min(1 << 25, nbytes - at), kind))
                if len(pending) >= ahead:
                    f.write(pending.popleft().result())
        while pending:
            f.write(pending.popleft().result())
    what = (f"MLX {mlx[0]}-bit g{mlx[1]}" + (" (8-bit g64 router)" if any(
                k.endswith(".mlp.gate") for k in c["quantization"]) else "") if mlx else
            "bf16 and MXFP4 expert" if c["model_type"] == "gpt_oss" else "bf16")
    print(f"wrote {out}: {off / 2**30:.2f} GiB of {what} weights")


if __name__ == "__main__":
    main()
