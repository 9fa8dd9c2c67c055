#!/usr/bin/env python3
"""A microscaled 4-bit (MXFP4) copy of a tiny gpt-oss fixture, and its reference.

usage: gen_mxfp4_fixture.py quantize SRC DST
       gen_mxfp4_fixture.py reference SRC DST OUT
       gen_mxfp4_fixture.py dequantize SRC DST OUT

quantize (plain Python, no numpy) reads the float fixture SRC (tests/data/models/gpt_oss:
experts as transformers holds them, gate_up_proj [E, H, 2I] and down_proj [E, I, H], input
dimension first) and writes DST/config.json and DST/model.safetensors with every
`mlp.experts.X` as the published gpt-oss checkpoints store it: X_blocks uint8
[E, out, in/32, 16] (two e2m1 codes a byte, the even value in the low nibble) and X_scales
uint8 [E, out, in/32] (e8m0: 2^(s - 127)), config.json's "quantization_config" saying
"quant_method": "mxfp4". Everything else is copied as it is. Each block's scale is the
least power of two that brings its largest magnitude to 6 or below, each value the
nearest e2m1 (ties to the even code).

reference (torch + transformers, the device machine) builds SRC's float model with the
experts replaced by DST's dequantized values (exact in f32; decoded here and by
transformers' own convert_moe_packed_tensors where it has one, which must agree), runs
SRC's prompt and writes OUT/reference.json and OUT/logits.npy in gen_fixtures.py's format.

dequantize (plain Python) writes OUT: SRC's float model with DST's experts dequantized in
SRC's layout, so that lmhost's float path can be compared with its MXFP4 path without torch.
"""
import json
import math
import os
import struct
import sys
from array import array

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
N_GEN = 12


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def code_of(v):
    """The e2m1 code nearest v (already divided by its block's scale, |v| <= 6)."""
    a = abs(v)
    best = min(range(8), key=lambda i: (abs(E2M1[i] - a), i % 2))
    return best | (8 if v < 0 and best else 0)


def quantize_rows(rows):
    """rows: lists of `in` floats (in % 32 == 0) -> (blocks bytes, scales bytes)."""
    blocks, scales = bytearray(), bytearray()
    for row in rows:
        for b0 in range(0, len(row), 32):
            blk = row[b0:b0 + 32]
            amax = max(abs(x) for x in blk)
            e = -127 if amax == 0 else math.ceil(math.log2(amax / 6.0))
            while amax > 0 and amax / 2.0 ** e > 6.0:  # (log2's rounding)
                e += 1
            s = max(0, min(254, e + 127))
            scale = 2.0 ** (s - 127)
            codes = [code_of(x / scale) for x in blk]
            blocks += bytes(codes[2 * j] | codes[2 * j + 1] << 4 for j in range(16))
            scales.append(s)
    return blocks, scales


def quantize(src, dst):
    header, data = read_st(os.path.join(src, "model.safetensors"))
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if ".mlp.experts." in name and not name.endswith("_bias"):
            assert t["dtype"] == "F32" and len(t["shape"]) == 3, name
            E, nin, nout = t["shape"]  # transformers: [E, in, out]
            w = array("f")
            w.frombytes(raw)
            rows = [[w[(e * nin + i) * nout + o] for i in range(nin)]
                    for e in range(E) for o in range(nout)]
            blocks, scales = quantize_rows(rows)
            out[name + "_blocks"] = ("U8", [E, nout, nin // 32, 16], bytes(blocks))
            out[name + "_scales"] = ("U8", [E, nout, nin // 32], bytes(scales))
        else:
            out[name] = (t["dtype"], t["shape"], raw)
    os.makedirs(dst, exist_ok=True)
    hdr, off = {}, 0
    for name in sorted(out):
        dt, shape, raw = out[name]
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in sorted(out):
            f.write(out[name][2])
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"wrote {dst}: {off} bytes of tensors")


def dequantize(src, dst, outdir):
    """OUTDIR: SRC's float model with DST's experts dequantized (transformers' layout), a
    float-path twin of the MXFP4 fixture for checks that need no torch."""
    sh, sdata = read_st(os.path.join(src, "model.safetensors"))
    mh, mdata = read_st(os.path.join(dst, "model.safetensors"))
    os.makedirs(outdir, exist_ok=True)
    out = bytearray()
    hdr = {}
    for name in sorted(k for k in sh if k != "__metadata__"):
        t = sh[name]
        raw = sdata[t["data_offsets"][0]:t["data_offsets"][1]]
        if name + "_blocks" in mh:
            b, sc = mh[name + "_blocks"], mh[name + "_scales"]
            blocks = mdata[b["data_offsets"][0]:b["data_offsets"][1]]
            scales = mdata[sc["data_offsets"][0]:sc["data_offsets"][1]]
            E, nout, nb, _ = b["shape"]
            nin = nb * 32
            lut = E2M1 + [-x for x in E2M1]
            w = array("f", bytes(4 * E * nin * nout))
            for e in range(E):
                for o in range(nout):
                    r = e * nout + o
                    for i in range(nin):
                        byte = blocks[r * nin // 2 + i // 2]
                        c = byte >> 4 if i % 2 else byte & 15
                        w[(e * nin + i) * nout + o] = math.ldexp(lut[c], scales[r * nb + i // 32] - 127)
            raw = w.tobytes()
        hdr[name] = {"dtype": t["dtype"], "shape": t["shape"],
                     "data_offsets": [len(out), len(out) + len(raw)]}
        out += raw
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(outdir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + out)
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(outdir, "config.json"), "w") as g:
        g.write(f.read())


def reference(src, dst, outdir):
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(8)
    cfg = AutoConfig.from_pretrained(src)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_pretrained(src, config=cfg, dtype=torch.float32).eval()
    mx = load_file(os.path.join(dst, "model.safetensors"))
    lut = torch.tensor(E2M1 + [-x for x in E2M1], dtype=torch.float32)
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    except Exception as e:  # noqa: BLE001
        print("transformers has no convert_moe_packed_tensors:", e)
        convert_moe_packed_tensors = None
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(k[:-len("_blocks")] for k in mx if k.endswith("_blocks")):
            blocks, scales = mx[name + "_blocks"], mx[name + "_scales"]
            E, nout, nb, _ = blocks.shape
            codes = torch.stack([blocks & 15, blocks >> 4], -1).reshape(E, nout, nb * 32).long()
            s = (scales.long() - 127).repeat_interleave(32, -1)
            deq = torch.ldexp(lut[codes], s)  # [E, out, in]
            if convert_moe_packed_tensors is not None:
                theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).float()
                ok = (theirs.shape == deq.shape and torch.equal(theirs, deq)) or (
                    theirs.shape == deq.transpose(1, 2).shape and torch.equal(theirs, deq.transpose(1, 2)))
                print(f"{name}: transformers' decode {'agrees' if ok else 'DIFFERS'}", flush=True)
                if not ok:
                    sys.exit(1)
            p = params[name]
            was = p.detach().clone()
            p.copy_(deq.transpose(1, 2) if p.shape == deq.transpose(1, 2).shape else deq)
            print(f"{name}: max |w - mxfp4(w)| = {(p - was).abs().max().item():.4g} "
                  f"(max |w| {was.abs().max().item():.4g})", flush=True)
    ref = json.load(open(os.path.join(src, "reference.json")))
    prompt = ref["prompt"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float().numpy()
        ids = torch.tensor([prompt])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_GEN,
                             do_sample=False, min_new_tokens=N_GEN, pad_token_id=0,
                             eos_token_id=None)[0, len(prompt):].tolist()
    os.makedirs(outdir, exist_ok=True)
    np.save(os.path.join(outdir, "logits.npy"), logits.astype(np.float32))
    srt = np.sort(logits, -1)
    json.dump({"model_type": ref.get("model_type", "gpt_oss"), "prompt": prompt, "greedy": gen,
               "top1": logits.argmax(-1).tolist(), "top1_margin": (srt[:, -1] - srt[:, -2]).tolist(),
               "note": "experts MXFP4 (blocks + e8m0 scales as the published gpt-oss checkpoints); "
                       "reference in float32 from the dequantized weights",
               "transformers": transformers.__version__},
              open(os.path.join(outdir, "reference.json"), "w"), indent=1)
    print("greedy", gen, flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "quantize":
        quantize(a[1], a[2])
    elif len(a) == 4 and a[0] == "dequantize":
        dequantize(a[1], a[2], a[3])
    elif len(a) == 4 and a[0] == "reference":
        reference(a[1], a[2], a[3])
    else:
        sys.exit(__doc__)
