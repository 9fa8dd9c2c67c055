#!/usr/bin/env python3
"""Trains tiny-chat, lmhost's small default chat model (issue 34).

Reads the corpus that tools/make_talker_corpus.sh writes (.train/), trains a
byte-level BPE tokenizer with Hugging Face `tokenizers`, then a Llama-style
decoder in plain PyTorch, and writes a standard Hugging Face Llama directory
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a
ChatML template, generation_config.json) that lmhost and transformers load.

    python3 tools/train_talker.py --corpus .train --out OUT --minutes 9

--minutes bounds the whole run (tokenizer, training, evaluation, saving);
the learning rate follows a cosine over whichever ends first, that time or
--max-epochs passes over the training tokens. Prints the parameter count,
periodic `step ...` lines, `val_ppl <float> val_tokens <int>` and three
sample chat completions. Works with torch 1.13 (CPU) and 2.x; without the
`tokenizers` package (Debian 12 has none) --fallback-tokenizer trains a
small pure-Python byte-level BPE of the same format, for smoke tests only.
"""

import argparse
import json
import lzma
import math
import os
import re
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [EOT, IM_START, IM_END]  # ids 0, 1, 2
DOC_SEP = "\n" + EOT + "\n"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}")

SHAPES = {
    # name: hidden, layers, heads, kv heads, intermediate
    "29m": (512, 8, 8, 4, 1536),   # 29.4M params; 4-bit g64 ~16.6 MB
    "16m": (384, 8, 6, 2, 1024),   # 15.6M params; 8-bit g64 ~16.6 MB
    "tiny": (64, 2, 2, 1, 192),    # smoke tests
}

SAMPLE_PROMPTS = [
    "Hello! Who are you?",
    "What does the word curious mean?",
    "Tell me a quote.",
]


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- corpus

def read_docs(path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    return [d.strip("\n") for d in text.split(DOC_SEP) if d.strip()]


# ---------------------------------------------------------------- tokenizer

def train_hf_tokenizer(docs, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                 use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    for i, sp in enumerate(SPECIALS):
        assert tok.token_to_id(sp) == i, sp
    return tok.to_str(), lambda batch: [e.ids for e in
                                        tok.encode_batch(batch)]


def byte_unicode():
    """GPT-2's printable stand-ins for the 256 byte values."""
    bs = list(range(33, 127)) + list(range(161, 173)) + \
        list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# GPT-2's pre-tokenizer pattern with \p{L} / \p{N} spelled for `re`.
PRETOK = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+|"
                    r" ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")
SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) +
                        ")")


def train_fallback_tokenizer(docs, vocab, sample_bytes):
    """A small byte-level BPE in pure Python (incremental pair counts);
    writes the tokenizer.json that `tokenizers` would."""
    bu = byte_unicode()
    counts = {}
    seen = 0
    for d in docs:
        for part in SPECIAL_RE.split(d):
            if part in SPECIALS:
                continue
            for w in PRETOK.findall(part):
                u = "".join(bu[b] for b in w.encode("utf-8"))
                counts[u] = counts.get(u, 0) + 1
        seen += len(d)
        if seen > sample_bytes:
            break
    words = [list(w) for w in sorted(counts)]
    freq = [counts[w] for w in sorted(counts)]
    pairs, where = {}, {}
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] = pairs.get((a, b), 0) + freq[i]
            where.setdefault((a, b), set()).add(i)
    alphabet = sorted(bu.values())
    vocab_list = SPECIALS + alphabet
    merges = []
    while len(vocab_list) < vocab and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        new = best[0] + best[1]
        vocab_list.append(new)
        for i in list(where.pop(best, ())):
            w = words[i]
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] -= freq[i]
                if pairs[(a, b)] <= 0:
                    del pairs[(a, b)]
                s = where.get((a, b))
                if s is not None:
                    s.discard(i)
            out, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and (w[k], w[k + 1]) == best:
                    out.append(new)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            words[i] = out
            for a, b in zip(out, out[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + freq[i]
                where.setdefault((a, b), set()).add(i)
        pairs.pop(best, None)
    ids = {t: i for i, t in enumerate(vocab_list)}
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
            for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                    "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": ids, "merges": [[a, b] for a, b in merges]},
    }
    return json.dumps(tj, ensure_ascii=False)


def fallback_codec(tokenizer_json):
    """encode/decode for a byte-level BPE tokenizer.json, in pure Python."""
    tj = json.loads(tokenizer_json)
    ids = tj["model"]["vocab"]
    for t in tj["added_tokens"]:
        ids[t["content"]] = t["id"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in tj["model"]["merges"]]
    rank = {m: r for r, m in enumerate(merges)}
    bu = byte_unicode()
    inv = {i: t for t, i in ids.items()}
    ub = {c: b for b, c in bu.items()}
    cache = {}

    def encode_word(u):
        w = cache.get(u)
        if w is not None:
            return w
        w = list(u)
        while len(w) > 1:
            r, k = min((rank.get((a, b), 1 << 30), k)
                       for k, (a, b) in enumerate(zip(w, w[1:])))
            if r == 1 << 30:
                break
            w[k:k + 2] = [w[k] + w[k + 1]]
        w = [ids[t] for t in w]
        cache[u] = w
        return w

    def encode(batch):
        out = []
        for d in batch:
            seq = []
            for part in SPECIAL_RE.split(d):
                if part in SPECIALS:
                    seq.append(ids[part])
                    continue
                for w in PRETOK.findall(part):
                    seq += encode_word("".join(bu[b]
                                               for b in w.encode("utf-8")))
            out.append(seq)
        return out

    def decode(seq):
        s = "".join(inv.get(i, "") if i >= len(SPECIALS) else SPECIALS[i]
                    for i in seq)
        raw = bytearray()
        for c in s:
            if c in ub:
                raw.append(ub[c])
            else:
                raw += c.encode("utf-8")
        return raw.decode("utf-8", "replace")

    return encode, decode


def tokenize_split(encode, docs, eot_id, chunk=2048):
    ids = []
    for i in range(0, len(docs), chunk):
        for seq in encode(docs[i:i + chunk]):
            ids.extend(seq)
            ids.append(eot_id)
    return np.asarray(ids, dtype=np.uint16)


# ---------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # in float32, as transformers' LlamaRMSNorm does
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h, kv = cfg["hidden_size"], cfg["num_attention_heads"], \
            cfg["num_key_value_heads"]
        self.h, self.kv, self.hd = h, kv, d // h
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)
        self.dropout = cfg.get("dropout", 0.0)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kv != self.h:
            # key/value head j serves query heads j*rep .. j*rep+rep-1
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
        p = self.dropout if self.training else 0.0
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                               is_causal=True)
        else:  # torch 1.13
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
            mask = torch.ones(t, t, dtype=torch.bool,
                              device=x.device).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = F.dropout(att, p, self.training) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.get("dropout", 0.0))

    def forward(self, x, cos, sin):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Body(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"],
                                         cfg["hidden_size"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in
                                    range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class LossOf(nn.Module):
    """The training loss as one module, so torch.compile fuses the
    cross-entropy with the output projection."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                               y.reshape(-1))


class LlamaLM(nn.Module):
    """Module names follow transformers' LlamaForCausalLM, so the state dict
    is the Hugging Face checkpoint (lm_head tied to embed_tokens)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        inv = 1.0 / (cfg["rope_theta"] **
                     (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        std = cfg["initializer_range"]
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2 style: residual outputs scaled down with depth
                s = std / math.sqrt(2 * cfg["num_hidden_layers"]) \
                    if name.endswith(("o_proj.weight", "down_proj.weight")) \
                    else std
                nn.init.normal_(p, mean=0.0, std=s)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device, dtype=torch.float32)
        f = torch.outer(pos, self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        x = self.model.embed_tokens(ids)
        cos = emb.cos().to(x.dtype)[None, None]
        sin = emb.sin().to(x.dtype)[None, None]
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight)


# ---------------------------------------------------------------- saving

def save_safetensors(path, tensors, dtype):
    """Writes a safetensors file (no dependency on the package)."""
    names = {torch.bfloat16: "BF16", torch.float16: "F16",
             torch.float32: "F32"}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", dtype).contiguous()
        raw = t.view(torch.int16 if t.element_size() == 2 else torch.int32)
        b = raw.numpy().tobytes()
        header[name] = {"dtype": names[dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def save_model(out, model, cfg, tokenizer_json, seq):
    os.makedirs(out, exist_ok=True)
    save_safetensors(os.path.join(out, "model.safetensors"),
                     model.state_dict(), torch.bfloat16)
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": hd,
        "hidden_act": "silu",
        "max_position_embeddings": seq,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": cfg["initializer_range"],
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": [2, 0],
                   "pad_token_id": 0, "do_sample": True, "temperature": 0.7,
                   "top_p": 0.9, "repetition_penalty": 1.1}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write(tokenizer_json)
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": IM_END, "pad_token": EOT,
        "unk_token": None, "add_bos_token": False, "add_eos_token": False,
        "add_prefix_space": False, "clean_up_tokenization_spaces": False,
        "model_max_length": seq, "errors": "replace",
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False,
                     "rstrip": False, "single_word": False, "special": True}
            for i, s in enumerate(SPECIALS)},
        "additional_special_tokens": [IM_START, IM_END],
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------- eval

@torch.no_grad()
def evaluate(model, val, seq, device, amp, batch=16):
    """Perplexity over the validation tokens in non-overlapping windows."""
    model.eval()
    total, count = 0.0, 0
    wins = [(s, min(s + seq + 1, len(val))) for s in range(0, len(val) - 1,
                                                           seq)]
    for i in range(0, len(wins), batch):
        group = wins[i:i + batch]
        n = max(e - s for s, e in group)
        x = torch.zeros(len(group), n, dtype=torch.long)
        mask = torch.zeros(len(group), n - 1)
        for j, (s, e) in enumerate(group):
            x[j, :e - s] = torch.from_numpy(val[s:e].astype(np.int64))
            mask[j, :e - s - 1] = 1
        x, mask = x.to(device), mask.to(device)
        with amp():
            logits = model(x[:, :-1])
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                              x[:, 1:].reshape(-1), reduction="none")
        total += (nll * mask.reshape(-1)).sum().item()
        count += int(mask.sum().item())
    model.train()
    return math.exp(total / max(count, 1)), count


@torch.no_grad()
def chat_sample(model, encode, decode, prompt, device, amp, max_new=96):
    model.eval()
    text = "%suser\n%s%s\n%sassistant\n" % (
        IM_START, prompt, IM_END, IM_START)
    ids = encode([text])[0]
    out = []
    for _ in range(max_new):
        x = torch.tensor([ids + out], device=device)
        with amp():
            nxt = int(model(x)[0, -1].float().argmax())
        if nxt in (0, 2):
            break
        out.append(nxt)
    model.train()
    return decode(out)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".train",
                    help="folder with corpus-train.txt.xz, corpus-val.txt.xz")
    ap.add_argument("--out", required=True, help="model folder to write")
    ap.add_argument("--cache", help="folder for the tokenizer and token ids "
                    "(reused when present)")
    ap.add_argument("--minutes", type=float, default=9.0,
                    help="wall-clock budget of the whole run")
    ap.add_argument("--reserve-s", type=float, default=50.0,
                    help="kept at the end for evaluation and saving")
    ap.add_argument("--max-epochs", type=float, default=12.0)
    ap.add_argument("--shape", default="29m", choices=sorted(SHAPES))
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64,
                    help="sequences a step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150, help="steps")
    ap.add_argument("--weight-decay", type=float, default=0.2)
    ap.add_argument("--dropout", type=float, default=0.3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--val-tokens", type=int, default=0,
                    help="evaluate on the first N validation tokens only "
                    "(0: all; for CPU smoke tests)")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available()
                    else "cpu")
    ap.add_argument("--compile", choices=("auto", "on", "off"),
                    default="auto")
    ap.add_argument("--fallback-tokenizer", action="store_true",
                    help="pure-Python BPE (no `tokenizers`); smoke tests")
    ap.add_argument("--tokenizer-sample-mb", type=float, default=2.0,
                    help="text the fallback tokenizer learns from")
    ap.add_argument("--max-docs", type=int,
                    help="use only the first N training documents")
    args = ap.parse_args()

    t0 = time.time()
    deadline = t0 + args.minutes * 60
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if not cuda:
        torch.set_num_threads(os.cpu_count() or 1)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def amp():
        if cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    log("torch %s on %s" % (torch.__version__, dev))

    # tokenizer and token ids
    cache = args.cache
    tj_path = os.path.join(cache, "tokenizer.json") if cache else None
    if cache and os.path.exists(os.path.join(cache, "train.u16")):
        with open(tj_path) as f:
            tokenizer_json = f.read()
        train = np.fromfile(os.path.join(cache, "train.u16"), np.uint16)
        val = np.fromfile(os.path.join(cache, "val.u16"), np.uint16)
        log("tokens from cache %s" % cache)
    else:
        train_docs = read_docs(os.path.join(args.corpus,
                                            "corpus-train.txt.xz"))
        if args.max_docs:
            train_docs = train_docs[:args.max_docs]
        val_docs = read_docs(os.path.join(args.corpus, "corpus-val.txt.xz"))
        log("corpus: %d train documents (%d chars), %d validation" % (
            len(train_docs), sum(map(len, train_docs)), len(val_docs)))
        if args.fallback_tokenizer:
            tokenizer_json = train_fallback_tokenizer(
                train_docs, args.vocab, args.tokenizer_sample_mb * 1e6)
            encode = fallback_codec(tokenizer_json)[0]
        else:
            tokenizer_json, encode = train_hf_tokenizer(train_docs,
                                                        args.vocab)
        train = tokenize_split(encode, train_docs, 0)
        val = tokenize_split(encode, val_docs, 0)
        del train_docs, val_docs
        if cache:
            os.makedirs(cache, exist_ok=True)
            with open(tj_path, "w") as f:
                f.write(tokenizer_json)
            train.tofile(os.path.join(cache, "train.u16"))
            val.tofile(os.path.join(cache, "val.u16"))
    vocab_size = len(json.loads(tokenizer_json)["model"]["vocab"])
    vocab_size = max(vocab_size, len(SPECIALS))
    encode, decode = make_codec(tokenizer_json, args.fallback_tokenizer)
    if args.val_tokens:
        val = val[:args.val_tokens]
    log("tokens: train %d, val %d, vocab %d (%.1fs)" % (
        len(train), len(val), vocab_size, time.time() - t0))

    d, nl, nh, nkv, ff = SHAPES[args.shape]
    d, nl = args.hidden or d, args.layers or nl
    nh, nkv, ff = args.heads or nh, args.kv_heads or nkv, args.ffn or ff
    cfg = {"vocab_size": vocab_size, "hidden_size": d,
           "intermediate_size": ff, "num_hidden_layers": nl,
           "num_attention_heads": nh, "num_key_value_heads": nkv,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "initializer_range": 0.02, "dropout": args.dropout}
    model = LlamaLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log("params %d (%.2fM, embeddings included, tied); shape hidden %d "
        "layers %d heads %d kv %d ffn %d vocab %d ctx %d" % (
            n_params, n_params / 1e6, d, nl, nh, nkv, ff, vocab_size,
            args.seq))

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95),
                                eps=1e-8, fused=cuda)
    except TypeError:  # torch 1.13 without fused
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95),
                                eps=1e-8)
    loss_of = LossOf(model)
    if args.compile == "on" or (args.compile == "auto" and cuda):
        if hasattr(torch, "compile"):
            try:
                loss_of = torch.compile(loss_of)
            except Exception as e:  # keep training uncompiled
                log("torch.compile failed: %s" % e)

    data = torch.from_numpy(train.astype(np.int64)).to(dev)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(args.seed)
    seq, bsz = args.seq, args.batch
    tok_step = seq * bsz
    max_steps = max(1, int(args.max_epochs * len(train) / tok_step))
    ar = torch.arange(seq + 1, device=dev)

    def batch():
        s = torch.randint(0, len(train) - seq - 1, (bsz,), generator=gen)
        w = data[s.to(dev)[:, None] + ar]
        return w[:, :-1], w[:, 1:]

    def lr_at(step, progress):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        c = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * c)

    log("training: %d tokens a step, at most %d steps (%.0f epochs), "
        "%.1f minutes in all" % (tok_step, max_steps, args.max_epochs,
                                 args.minutes))
    best = (float("inf"), None, -1)
    step, t_train, progress = 0, None, 0.0
    t_log, tok_log = time.time(), 0
    model.train()
    while True:
        now = time.time()
        if step == 2:
            # compilation is over: the time budget starts to count here
            t_train = now
            t_end = deadline - args.reserve_s
        if t_train is not None:
            progress = max(step / max_steps,
                           (now - t_train) / max(t_end - t_train, 1e-6))
        else:
            progress = step / max_steps
        if progress >= 1.0 or (step > 0 and now > deadline -
                               args.reserve_s):
            break
        lr = lr_at(step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch()
        with amp():
            loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tok_log += tok_step
        if step % args.log_every == 0 or step == 1:
            lv = loss.item()
            t = time.time()
            log("step %d epoch %.2f lr %.2e loss %.4f tok/s %.0f "
                "elapsed %.0fs" % (step, step * tok_step / len(train), lr,
                                   lv, tok_log / (t - t_log), t - t0))
            t_log, tok_log = t, 0
        if step % args.eval_every == 0:
            ppl, _ = evaluate(model, val, seq, dev, amp)
            log("eval step %d val_ppl %.3f" % (step, ppl))
            if ppl < best[0]:
                best = (ppl, {k: v.detach().to("cpu", copy=True)
                              for k, v in model.state_dict().items()}, step)
            t_log = time.time()

    ppl, n_val = evaluate(model, val, seq, dev, amp)
    log("final step %d epoch %.2f val_ppl %.3f" % (
        step, step * tok_step / len(train), ppl))
    if best[1] is not None and best[0] < ppl:
        log("keeping the step %d weights (val_ppl %.3f)" % (best[2],
                                                            best[0]))
        model.load_state_dict(best[1])
        ppl, n_val = evaluate(model, val, seq, dev, amp)
    log("val_ppl %.4f val_tokens %d" % (ppl, n_val))

    save_model(args.out, model, cfg, tokenizer_json, seq)
    log("wrote %s (%.1fs)" % (args.out, time.time() - t0))
    for p in SAMPLE_PROMPTS:
        log("sample user: %s" % p)
        log("sample assistant: %s" % chat_sample(model, encode, decode, p,
                                                 dev, amp).strip())
    hf_check(args.out, model, val, dev)
    log("done in %.1fs" % (time.time() - t0))


def make_codec(tokenizer_json, fallback):
    """encode(list of str) -> list of id lists and decode(ids) -> str."""
    if not fallback:
        try:
            from tokenizers import Tokenizer
            tok = Tokenizer.from_str(tokenizer_json)
            return (lambda b: [e.ids for e in tok.encode_batch(b)],
                    lambda ids: tok.decode(ids, skip_special_tokens=False))
        except ImportError:
            log("no `tokenizers`: decoding samples in pure Python")
    return fallback_codec(tokenizer_json)


def hf_check(out, model, val, dev):
    """Loads the written folder with transformers, where installed, and
    compares its logits with ours."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        log("hf_check skipped (no transformers)")
        return
    try:
        try:
            hf = AutoModelForCausalLM.from_pretrained(out,
                                                      dtype=torch.float32)
        except TypeError:  # transformers 4
            hf = AutoModelForCausalLM.from_pretrained(
                out, torch_dtype=torch.float32)
        hf = hf.to(dev).eval()
        ids = torch.from_numpy(val[:256].astype(np.int64))[None].to(dev)
        ours = LlamaLM(model.cfg).to(dev).eval()
        sd = {k: v.to(torch.bfloat16).float()
              for k, v in model.state_dict().items()}
        ours.load_state_dict(sd)
        with torch.no_grad():
            a = hf(ids).logits.float()
            b = ours(ids).float()
        log("hf_check max_abs_diff %.3e max_abs_logit %.3e" % (
            (a - b).abs().max().item(), b.abs().max().item()))
    except Exception as e:
        log("hf_check failed: %r" % e)


if __name__ == "__main__":
    main()
