#!/usr/bin/env python3
"""A draft model for speculative decoding made of a model's own first layers (an "early
exit" draft): the same embedding, first N decoder layers, final norm and head, so the same
tokenizer and vocabulary. Works on any safetensors checkpoint whose layers are named
`*.layers.I.*` (float or MLX-quantized, one file or sharded); only the standard library.

    tools/make_layer_draft.py SRC_DIR DST_DIR --layers N

How often such a draft agrees with its model depends on the model: a trained one needs its
draft trained too (as in LayerSkip); `lmhost bench --draft-model DST_DIR` measures it.
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, required=True)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    text = cfg.get("text_config", cfg)  # multimodal configs keep the decoder's apart
    n_src = text["num_hidden_layers"]
    if not 1 <= a.layers < n_src:
        sys.exit(f"--layers must be in [1, {n_src - 1}] for this {n_src}-layer model")
    text["num_hidden_layers"] = a.layers
    for k in ("layer_types", "layers_block_type"):  # per-layer lists keep their first N
        if isinstance(text.get(k), list):
            text[k] = text[k][: a.layers]
    os.makedirs(a.dst, exist_ok=True)
    json.dump(cfg, open(os.path.join(a.dst, "config.json"), "w"), indent=1)
    for f in os.listdir(a.src):  # tokenizer and generation settings as they are
        if f.endswith((".json", ".jinja", ".model", ".txt")) and f != "config.json" and \
                not f.endswith(".safetensors.index.json"):
            shutil.copy(os.path.join(a.src, f), os.path.join(a.dst, f))
    files = sorted(f for f in os.listdir(a.src) if f.endswith(".safetensors"))
    keep, order = {}, []  # name -> (file, begin, end, dtype, shape)
    for f in files:
        hdr, base = read_header(os.path.join(a.src, f))
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            m = LAYER.search(name)
            if m and int(m.group(2)) >= a.layers:
                continue
            b, e = t["data_offsets"]
            keep[name] = (f, base + b, base + e, t["dtype"], t["shape"])
            order.append(name)
    header, off = {}, 0
    for name in order:
        f, b, e, dt, shape = keep[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + e - b]}
        off += e - b
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(a.dst, "model.safetensors"), "wb") as out:
        out.write(struct.pack("<Q", len(hb)) + hb)
        handles = {f: open(os.path.join(a.src, f), "rb") for f in files}
        for name in order:
            f, b, e, _, _ = keep[name]
            h = handles[f]
            h.seek(b)
            left = e - b
            while left:
                chunk = h.read(min(left, 1 << 24))
                out.write(chunk)
                left -= len(chunk)
    print(f"wrote {a.dst}: {a.layers} of {n_src} layers, {off / 2**30:.2f} GiB of weights")


if __name__ == "__main__":
    main()
