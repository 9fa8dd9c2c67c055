#!/usr/bin/env python3
"""Rewrite a Hugging Face checkpoint of a recurrent/hybrid family in the layout mlx-lm's
converter (mlx_lm.convert: load, Model.sanitize, save) writes for it, with the same math.

usage: mlx_layout.py SRC_DIR DST_DIR [--per-expert]
       mlx_layout.py --falcon-mup SRC_DIR DST_DIR

Python 3 standard library only (no numpy): safetensors are read and written here. The
source must be a float checkpoint (f32, f16 or bf16), as mlx-lm's sanitize sees one before
it quantizes. What each family's sanitize does, and so what this does:

  mamba, mamba2   conv1d.weight [C, 1, K] -> [C, K, 1]. Nothing else.
  jamba           the conv1d move; lm_head.weight dropped when tie_word_embeddings;
                  feed_forward.experts.<e>.{gate,up,down}_proj.* stacked into
                  feed_forward.switch_mlp.{gate,up,down}_proj.* [E, ...].
  falcon_h1       the conv1d move, and the muP multipliers folded into the weights:
                  embed_tokens * embedding_multiplier, lm_head * lm_head_multiplier,
                  q_proj and k_proj * attention_in_multiplier (v_proj not; key_multiplier
                  goes to a "key_proj.weight" no checkpoint has, so it is not folded at all),
                  o_proj * attention_out_multiplier, mamba out_proj * ssm_out_multiplier,
                  gate_proj * mlp_multipliers[0], down_proj * mlp_multipliers[1], in_proj's
                  rows * ssm_in_multiplier * ssm_multipliers spread over [z | x | B | C | dt].
                  Biases are not folded. The config keeps the multipliers.
  granitemoehybrid the conv1d move; with experts (num_local_experts > 0)
                  block_sparse_moe.input_linear [E, 2I, H] split into switch_mlp.gate_proj
                  (first I rows) and switch_mlp.up_proj, output_linear renamed
                  switch_mlp.down_proj (shared_mlp kept); without experts shared_mlp's
                  input_linear split into mlp.gate_proj / mlp.up_proj and output_linear
                  renamed mlp.down_proj.
  nemotron_h      mtp.* dropped; the conv1d move; backbone.layers.<l>.mixer.experts.<e>.
                  {up,down}_proj stacked into mixer.switch_mlp.{fc1,fc2}.
  qwen3_next      mtp.* dropped; lm_head dropped when tied; mlp.experts.<e>.{gate,up,down}_proj
                  stacked into mlp.switch_mlp.*; the conv1d move; the (1 + w) RMSNorms
                  (input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm; not
                  the DeltaNet's own norm) stored as 1 + w.
  qwen3_5[_moe]   the multimodal wrapper's: vision tower dropped, model.language_model.* ->
                  language_model.model.*, any other key prefixed language_model.; then
                  qwen3_5_moe splits transformers' fused experts.gate_up_proj into
                  switch_mlp.gate/up_proj (and experts.down_proj -> switch_mlp.down_proj);
                  then as qwen3_next without the expert stacking. A flat text-only
                  checkpoint (model_type qwen3_5_text, which mlx-lm has no module for) is
                  written as the hub's multimodal form: model_type qwen3_5, its settings
                  under text_config.
The config is written as mlx-lm's save_config does (vision_config and _name_or_path
dropped, keys sorted); weights go to model.safetensors (metadata format "mlx") with a
model.safetensors.index.json. Other files (reference.json, logits.npy, tokenizer) are
copied.

--per-expert: write each stacked expert tensor P.switch_mlp.R.weight [E, ...] as the E
tensors P.experts.<e>.R.weight instead, the form `lmhost quantize` stacks back into
P.switch_mlp.R while quantizing (it quantizes 2-D tensors only); its output is then the
layout mlx-lm's quantized conversion writes, experts included.

--falcon-mup (falcon_h1 only): not a conversion but a test input. It writes a Hugging Face
layout checkpoint whose muP multipliers (all 1 in the fixture) are each multiplied by a
power of two, and the weights each applies to divided by it: the same math exactly, so the
source's reference still holds, while converting that checkpoint has real multipliers to
fold (and key_multiplier and v_proj's share of attention_in_multiplier, which mlx-lm
leaves out, to be applied at run time).
"""
import array
import json
import os
import shutil
import struct
import sys

FLOATS = ("F32", "F16", "BF16")


def die(msg):
    sys.stderr.write("mlx_layout.py: %s\n" % msg)
    sys.exit(1)


class T:
    """A tensor: dtype name, shape list, raw little-endian bytes."""
    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, list(shape), data


# ---- safetensors ------------------------------------------------------------------------

def read_safetensors(path, out):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        die("%s: not a safetensors file" % path)
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if k in out:
            die("%s: tensor %s appears twice" % (path, k))
        out[k] = T(v["dtype"], v["shape"], raw[base + a:base + b])


def read_checkpoint(d):
    weights = {}
    index = os.path.join(d, "model.safetensors.index.json")
    single = os.path.join(d, "model.safetensors")
    if os.path.isfile(single):
        read_safetensors(single, weights)
    elif os.path.isfile(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
        for fn in files:
            read_safetensors(os.path.join(d, fn), weights)
    else:
        die("%s: no model.safetensors or model.safetensors.index.json" % d)
    return weights


def write_checkpoint(d, weights, fmt):
    names = sorted(weights)
    hdr, off = {}, 0
    for k in names:
        t = weights[k]
        hdr[k] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + len(t.data)]}
        off += len(t.data)
    hdr["__metadata__"] = {"format": fmt}
    hb = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for k in names:
            f.write(weights[k].data)
    index = {"metadata": {"total_size": off},
             "weight_map": {k: "model.safetensors" for k in names}}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=4)


# ---- float arithmetic on raw tensors ------------------------------------------------------

def to_floats(t):
    """The values as Python floats (exact)."""
    if t.dtype == "F32":
        a = array.array("f")
        a.frombytes(t.data)
        if sys.byteorder != "little":
            a.byteswap()
        return list(a)
    if t.dtype == "F16":
        return list(struct.unpack("<%de" % (len(t.data) // 2), t.data))
    if t.dtype == "BF16":
        hs = struct.unpack("<%dH" % (len(t.data) // 2), t.data)
        return list(struct.unpack("<%df" % len(hs), struct.pack("<%dI" % len(hs),
                                                                 *[h << 16 for h in hs])))
    die("arithmetic on a %s tensor" % t.dtype)


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_floats(vals, dtype):
    """Bytes of vals rounded to dtype (to nearest, ties to even)."""
    if dtype == "F32":
        a = array.array("f", vals)
        if sys.byteorder != "little":
            a.byteswap()
        return a.tobytes()
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    if dtype == "BF16":
        out = []
        for v in vals:
            u = f32_bits(v)  # first to f32 (as MLX holds it), then to bf16
            if (u & 0x7FFFFFFF) > 0x7F800000:
                out.append((u >> 16) | 0x40)
            else:
                out.append(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
        return struct.pack("<%dH" % len(out), *out)
    die("arithmetic on a %s tensor" % dtype)


def in_dtype(x, dtype):
    """A Python float rounded to dtype, as MLX holds a scalar it multiplies a tensor by."""
    return struct.unpack("<f", from_floats([x], "F32"))[0] if dtype == "F32" else \
        to_floats(T(dtype, [1], from_floats([x], dtype)))[0]


def scaled(t, factors):
    """t * factors: one factor, or one per row of a 2-D t (in t's dtype, as MLX does)."""
    v = to_floats(t)
    if not isinstance(factors, list):
        f = in_dtype(factors, t.dtype)
        if f == 1.0:
            return t
        v = [x * f for x in v]
    else:
        cols = len(v) // len(factors)
        v = [x * factors[i // cols] for i, x in enumerate(v)]
    return T(t.dtype, t.shape, from_floats(v, t.dtype))


def plus_one(t):
    return T(t.dtype, t.shape, from_floats([x + 1.0 for x in to_floats(t)], t.dtype))


# ---- tensor moves --------------------------------------------------------------------------

def conv_mlx(t):
    """[C, 1, K] -> [C, K, 1] (moveaxis(2, 1): with a middle axis of 1 the bytes stay)."""
    if len(t.shape) == 3 and t.shape[-1] != 1:
        if t.shape[1] != 1:
            die("conv1d weight of shape %s is not depthwise [C, 1, K]" % t.shape)
        return T(t.dtype, [t.shape[0], t.shape[2], 1], t.data)
    return t


def stack(ts):
    first = ts[0]
    for t in ts:
        if t.shape != first.shape or t.dtype != first.dtype:
            die("experts to stack differ in shape or dtype")
    return T(first.dtype, [len(ts)] + first.shape, b"".join(t.data for t in ts))


def split_rows(t, axis, at):
    """t split along `axis` (0 or 1) at index `at`: (t[..., :at, ...], t[..., at:, ...])."""
    sh = t.shape
    outer = 1
    for d in sh[:axis]:
        outer *= d
    inner = len(t.data) // (outer * sh[axis])  # bytes of one index along axis
    per = sh[axis] * inner
    a, b = [], []
    for o in range(outer):
        blk = t.data[o * per:(o + 1) * per]
        a.append(blk[:at * inner])
        b.append(blk[at * inner:])
    sa, sb = list(sh), list(sh)
    sa[axis], sb[axis] = at, sh[axis] - at
    return T(t.dtype, sa, b"".join(a)), T(t.dtype, sb, b"".join(b))


def unstack(t):
    e = t.shape[0]
    per = len(t.data) // e
    return [T(t.dtype, t.shape[1:], t.data[i * per:(i + 1) * per]) for i in range(e)]


def move_conv(w):
    for k in list(w):
        if "conv1d.weight" in k:
            w[k] = conv_mlx(w[k])


def stack_experts(w, moe, n_layers, projs):
    """<moe % l>.experts.<e>.<src>.<part> -> <moe % l>.switch_mlp.<dst>.<part>, E stacked."""
    for l in range(n_layers):
        base = moe % l
        for src, dst in projs:
            for part in ("weight", "bias", "scales", "biases"):
                ex, e = [], 0
                while "%s.experts.%d.%s.%s" % (base, e, src, part) in w:
                    ex.append(w.pop("%s.experts.%d.%s.%s" % (base, e, src, part)))
                    e += 1
                if ex:
                    w["%s.switch_mlp.%s.%s" % (base, dst, part)] = stack(ex)


# ---- families ---------------------------------------------------------------------------------

def cfg_get(cfg, key, default):
    v = cfg.get(key)
    return default if v is None else v


def fam_mamba(cfg, w):
    move_conv(w)
    return cfg, w


def fam_jamba(cfg, w):
    move_conv(w)
    if cfg_get(cfg, "tie_word_embeddings", True):
        w.pop("lm_head.weight", None)
    stack_experts(w, "model.layers.%d.feed_forward", cfg["num_hidden_layers"],
                  [("gate_proj", "gate_proj"), ("down_proj", "down_proj"), ("up_proj", "up_proj")])
    if any(".feed_forward.experts." in k for k in w):
        die("jamba: experts left unstacked (a fused experts.gate_up_proj checkpoint is not a "
            "form mlx-lm's sanitize reads)")
    return cfg, w


def falcon_mup_sizes(cfg, w):
    """Widths of in_proj's z, x, B, C and dt parts. The mixer's width is mamba_d_ssm, else
    (null or absent) out_proj's input width, else mamba_expand * hidden_size."""
    d_ssm = cfg.get("mamba_d_ssm")
    if not d_ssm:
        out = w.get("model.layers.0.mamba.out_proj.weight")
        d_ssm = out.shape[1] if out is not None else \
            int(cfg_get(cfg, "mamba_expand", 2) * cfg["hidden_size"])
    gn = cfg_get(cfg, "mamba_n_groups", 1) * cfg["mamba_d_state"]
    return [d_ssm, d_ssm, gn, gn, cfg["mamba_n_heads"]]


def fam_falcon_h1(cfg, w):
    c1d = w.get("model.layers.0.mamba.conv1d.weight")
    if c1d is None:
        die("falcon_h1: no model.layers.0.mamba.conv1d.weight")
    if c1d.shape[-1] <= c1d.shape[1]:
        return cfg, w  # already mlx-lm's (its sanitize does nothing then)
    m = lambda k: float(cfg_get(cfg, k, 1.0))
    sm = cfg_get(cfg, "ssm_multipliers", [1.0] * 5)
    mm = cfg_get(cfg, "mlp_multipliers", [1.0, 1.0])
    sizes = falcon_mup_sizes(cfg, w)
    out = {}
    for name, p in w.items():
        if name.endswith("embed_tokens.weight"):
            p = scaled(p, m("embedding_multiplier"))
        elif name.endswith("lm_head.weight"):
            p = scaled(p, m("lm_head_multiplier"))
        elif name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
            p = scaled(p, m("attention_in_multiplier"))
        elif name.endswith("key_proj.weight"):  # mlx-lm's intent for key_multiplier; no such key
            p = scaled(p, m("attention_in_multiplier") * m("key_multiplier"))
        elif name.endswith("o_proj.weight"):
            p = scaled(p, m("attention_out_multiplier"))
        elif name.endswith("out_proj.weight"):
            p = scaled(p, m("ssm_out_multiplier"))
        elif name.endswith("gate_proj.weight"):
            p = scaled(p, float(mm[0]))
        elif name.endswith("down_proj.weight"):
            p = scaled(p, float(mm[1]))
        elif name.endswith("in_proj.weight"):
            # ssm_in * mup, each factor and the product rounded as MLX's f32 arrays are,
            # then cast to the weight's dtype
            ssm_in = in_dtype(m("ssm_in_multiplier"), "F32")
            rows = []
            for s, k in zip(sizes, sm):
                f = in_dtype(ssm_in * in_dtype(float(k), "F32"), "F32")
                rows += [in_dtype(f, p.dtype)] * s
            if len(rows) != p.shape[0]:
                die("falcon_h1: %s has %d rows, the multipliers cover %d" %
                    (name, p.shape[0], len(rows)))
            p = scaled(p, rows)
        elif "conv1d.weight" in name:
            p = conv_mlx(p)
        out[name] = p
    return cfg, out


def fam_granite(cfg, w):
    move_conv(w)
    n = cfg["num_hidden_layers"]
    if cfg.get("num_local_experts") and \
            "model.layers.0.block_sparse_moe.input_linear.weight" in w:
        for l in range(n):
            p = "model.layers.%d.block_sparse_moe" % l
            t = w.pop(p + ".input_linear.weight")
            gate, up = split_rows(t, 1, t.shape[1] // 2)
            w[p + ".switch_mlp.gate_proj.weight"] = gate
            w[p + ".switch_mlp.up_proj.weight"] = up
            w[p + ".switch_mlp.down_proj.weight"] = w.pop(p + ".output_linear.weight")
    elif not cfg.get("num_local_experts") and \
            "model.layers.0.shared_mlp.input_linear.weight" in w:
        for l in range(n):
            p = "model.layers.%d" % l
            t = w.pop(p + ".shared_mlp.input_linear.weight")
            gate, up = split_rows(t, 0, t.shape[0] // 2)
            w[p + ".mlp.gate_proj.weight"] = gate
            w[p + ".mlp.up_proj.weight"] = up
            w[p + ".mlp.down_proj.weight"] = w.pop(p + ".shared_mlp.output_linear.weight")
    return cfg, w


def fam_nemotron_h(cfg, w):
    w = {k: v for k, v in w.items() if not k.startswith("mtp.")}
    move_conv(w)
    n = cfg.get("num_hidden_layers")
    pattern = cfg.get("hybrid_override_pattern") or cfg.get("layers_block_type") or []
    n = max(n or 0, len(pattern))
    stack_experts(w, "backbone.layers.%d.mixer", n, [("down_proj", "fc2"), ("up_proj", "fc1")])
    return cfg, w


QWEN_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
              ".q_norm.weight", ".k_norm.weight")


def qwen_norms(w):
    for k in list(w):
        if k.endswith(QWEN_NORMS) and len(w[k].shape) == 1:
            w[k] = plus_one(w[k])


def fam_qwen3_next(cfg, w):
    if not any(".mlp.experts." in k for k in w):
        die("qwen3_next: no per-expert tensors (mlp.experts.<e>.*): mlx-lm's sanitize leaves "
            "such a checkpoint as it is")
    w = {k: v for k, v in w.items() if "mtp." not in k}
    if cfg_get(cfg, "tie_word_embeddings", False):
        w.pop("lm_head.weight", None)
    stack_experts(w, "model.layers.%d.mlp", cfg["num_hidden_layers"],
                  [("up_proj", "up_proj"), ("down_proj", "down_proj"), ("gate_proj", "gate_proj")])
    move_conv(w)
    qwen_norms(w)
    return cfg, w


def fam_qwen3_5(cfg, w):
    if "text_config" not in cfg:  # flat text-only checkpoint: the hub's nested form
        text = dict(cfg)
        top = {"model_type": "qwen3_5_moe" if "moe" in cfg["model_type"] else "qwen3_5",
               "architectures": ["Qwen3_5MoeForConditionalGeneration" if "moe" in cfg["model_type"]
                                 else "Qwen3_5ForConditionalGeneration"],
               "text_config": text}
        for k in ("tie_word_embeddings", "dtype", "transformers_version"):
            if k in cfg:
                top[k] = cfg[k]
        cfg = top
        w = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
             for k, v in w.items()}
    text = cfg["text_config"]
    out = {}
    for k, v in w.items():
        if k.startswith("vision_tower") or k.startswith("model.visual"):
            continue
        if k.startswith("model.language_model"):
            k = k.replace("model.language_model", "language_model.model", 1)
        elif not k.startswith("language_model."):
            k = "language_model." + k
        out[k] = v
    w = out
    if cfg["model_type"] == "qwen3_5_moe":
        for l in range(text["num_hidden_layers"]):
            p = "language_model.model.layers.%d.mlp" % l
            if p + ".experts.gate_up_proj" in w:
                gu = w.pop(p + ".experts.gate_up_proj")
                gate, up = split_rows(gu, 1, gu.shape[-2] // 2)
                w[p + ".switch_mlp.gate_proj.weight"] = gate
                w[p + ".switch_mlp.up_proj.weight"] = up
                w[p + ".switch_mlp.down_proj.weight"] = w.pop(p + ".experts.down_proj")
    unsanitized = any("conv1d.weight" in k and v.shape[-1] != 1 for k, v in w.items())
    w = {k: v for k, v in w.items() if "mtp." not in k}
    if cfg_get(text, "tie_word_embeddings", cfg_get(cfg, "tie_word_embeddings", False)):
        w.pop("lm_head.weight", None)  # (mlx-lm pops this unprefixed name only)
    move_conv(w)
    if unsanitized:
        qwen_norms(w)
    return cfg, w


FAMILIES = {
    "mamba": fam_mamba, "mamba2": fam_mamba, "falcon_mamba": fam_mamba,
    "jamba": fam_jamba, "falcon_h1": fam_falcon_h1, "granitemoehybrid": fam_granite,
    "nemotron_h": fam_nemotron_h, "qwen3_next": fam_qwen3_next,
    "qwen3_5": fam_qwen3_5, "qwen3_5_text": fam_qwen3_5,
    "qwen3_5_moe": fam_qwen3_5, "qwen3_5_moe_text": fam_qwen3_5,
}


def per_expert(w):
    for k in list(w):
        if ".switch_mlp." in k and k.endswith(".weight") and len(w[k].shape) == 3:
            pre, rest = k.split(".switch_mlp.", 1)
            for e, t in enumerate(unstack(w.pop(k))):
                w["%s.experts.%d.%s" % (pre, e, rest)] = t


# Falcon-H1 with the fixture's multipliers moved out of its weights: each multiplier times a
# power of two, the weights it applies to divided by it (exact in binary floating point), so
# the Hugging Face math is unchanged bit for bit while every multiplier differs from 1.
MUP_SHIFT = {"embedding_multiplier": 4.0, "lm_head_multiplier": 0.25,
             "attention_in_multiplier": 2.0, "key_multiplier": 4.0,
             "attention_out_multiplier": 0.5, "ssm_in_multiplier": 2.0,
             "ssm_out_multiplier": 4.0}
SSM_SHIFT = [0.5, 2.0, 4.0, 0.25, 8.0]  # z, x, B, C, dt columns of in_proj
MLP_SHIFT = [2.0, 0.25]                 # gate, down


def falcon_mup_variant(cfg, w):
    cfg = dict(cfg)
    for k, s in MUP_SHIFT.items():
        cfg[k] = float(cfg_get(cfg, k, 1.0)) * s
    cfg["ssm_multipliers"] = [float(a) * b for a, b in
                              zip(cfg_get(cfg, "ssm_multipliers", [1.0] * 5), SSM_SHIFT)]
    cfg["mlp_multipliers"] = [float(a) * b for a, b in
                              zip(cfg_get(cfg, "mlp_multipliers", [1.0] * 2), MLP_SHIFT)]
    rows = []
    for n, s in zip(falcon_mup_sizes(cfg, w), SSM_SHIFT):
        rows += [1.0 / s] * n
    ssm_in = 1.0 / MUP_SHIFT["ssm_in_multiplier"]
    out = {}
    for name, p in w.items():
        f = None
        if name == "model.embed_tokens.weight":
            f = 1.0 / MUP_SHIFT["embedding_multiplier"]
        elif name == "lm_head.weight":
            f = 1.0 / MUP_SHIFT["lm_head_multiplier"]
        elif name.endswith(("self_attn.q_proj.weight", "self_attn.v_proj.weight")):
            f = 1.0 / MUP_SHIFT["attention_in_multiplier"]
        elif name.endswith("self_attn.k_proj.weight"):
            f = 1.0 / (MUP_SHIFT["attention_in_multiplier"] * MUP_SHIFT["key_multiplier"])
        elif name.endswith("self_attn.k_proj.bias"):
            f = 1.0 / MUP_SHIFT["key_multiplier"]  # k is multiplied after its bias
        elif name.endswith(("self_attn.o_proj.weight", "self_attn.o_proj.bias")):
            f = 1.0 / MUP_SHIFT["attention_out_multiplier"]
        elif name.endswith(("mamba.out_proj.weight", "mamba.out_proj.bias")):
            f = 1.0 / MUP_SHIFT["ssm_out_multiplier"]
        elif name.endswith(("feed_forward.gate_proj.weight", "feed_forward.gate_proj.bias")):
            f = 1.0 / MLP_SHIFT[0]
        elif name.endswith(("feed_forward.down_proj.weight", "feed_forward.down_proj.bias")):
            f = 1.0 / MLP_SHIFT[1]
        elif name.endswith("mamba.in_proj.weight"):
            f = [r * ssm_in for r in rows]
        elif name.endswith("mamba.in_proj.bias"):
            f = rows
        out[name] = p if f is None else scaled(p, f)
    return cfg, out


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    opts = [a for a in argv[1:] if a.startswith("--")]
    if len(args) != 2 or any(o not in ("--per-expert", "--falcon-mup") for o in opts):
        sys.stderr.write("usage: mlx_layout.py SRC_DIR DST_DIR [--per-expert]\n"
                         "       mlx_layout.py --falcon-mup SRC_DIR DST_DIR\n")
        return 2
    src, dst = args
    cfg = json.load(open(os.path.join(src, "config.json")))
    mt = cfg.get("model_type")
    if "--falcon-mup" in opts:
        if mt != "falcon_h1":
            die("--falcon-mup: %s is not falcon_h1" % src)
        mt = "--falcon-mup"
    elif mt not in FAMILIES:
        die("%s: model_type %r is not a family this converter knows" % (src, mt))
    if "quantization" in cfg or "quantization_config" in cfg:
        die("%s is quantized: convert the float checkpoint, then quantize" % src)
    w = read_checkpoint(src)
    for k, t in w.items():
        if t.dtype not in FLOATS:
            die("%s: tensor %s is %s (a float checkpoint is expected)" % (src, k, t.dtype))
    cfg, w = (falcon_mup_variant if mt == "--falcon-mup" else FAMILIES[mt])(cfg, w)
    if "--per-expert" in opts:
        per_expert(w)
    os.makedirs(dst, exist_ok=True)
    for fn in os.listdir(src):
        p = os.path.join(src, fn)
        if fn == "config.json" or ".safetensors" in fn or not os.path.isfile(p):
            continue
        shutil.copyfile(p, os.path.join(dst, fn))
    cfg.pop("_name_or_path", None)
    cfg.pop("vision_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=4)
    write_checkpoint(dst, w, "pt" if mt == "--falcon-mup" else "mlx")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
