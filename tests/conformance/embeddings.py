#!/usr/bin/env python3
"""`lmhost embed` (a stable contract) against transformers' pooled final hidden states.

usage: embeddings.py LMHOST REF.json MODEL_DIR [--same-bits] [--hidden DIR]... [--family DIR]...
                     [-- LMHOST_OPTIONS...]

REF.json (tools/make_embedding_reference.py) holds texts' ids and the L2-normalized mean and
last-token pools of AutoModel's last_hidden_state for MODEL_DIR. Checked: every case and
pooling alone (cosine >= 0.9999), all cases in one call against each alone (the same bits
with --same-bits, else cosine >= 0.999999), cls pooling against the first token alone, a
model split over two backends (--gpu-layers 1), the model directory's own sentence-transformers
pooling (made at test time with symlinks), malformed pooling files and command lines refused
with a clear message (with LMHOST_OPTIONS, a backend's run, fewer of the host-side checks). --hidden DIR: a fixture with transformers' hidden_states.npy (its last
entry after the final norm) pooled here; --family DIR: another family (recurrent, hybrid),
whose batched vectors must equal its lone ones."""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

COS_REF = 0.9999


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


args = sys.argv[1:]
opts = []
if "--" in args:
    opts = args[args.index("--") + 1:]
    args = args[:args.index("--")]
same_bits = "--same-bits" in args
args = [a for a in args if a != "--same-bits"]
hidden_dirs, family_dirs, pos = [], [], []
i = 0
while i < len(args):
    if args[i] in ("--hidden", "--family"):
        (hidden_dirs if args[i] == "--hidden" else family_dirs).append(args[i + 1])
        i += 2
    else:
        pos.append(args[i])
        i += 1
lmhost, ref_path, model = pos
ref = json.load(open(ref_path))["cases"]


def run(model_dir, seqs, pooling=None, extra=(), expect=0):
    cmd = [lmhost, "embed", "--model", model_dir]
    for s in seqs:
        cmd += ["--ids", ",".join(map(str, s))]
    if pooling:
        cmd += ["--pooling", pooling]
    cmd += list(extra) + opts
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        fail("%s: exit %d (wanted %d)\n%s%s" % (" ".join(cmd), p.returncode, expect, p.stdout,
                                                 p.stderr))
    if expect:
        return p.stderr
    lines = p.stdout.splitlines()
    if len(lines) != len(seqs):
        fail("%d lines for %d sequences:\n%s" % (len(lines), len(seqs), p.stdout))
    out = []
    for k, line in enumerate(lines):
        head, _, vals = line.partition(":")
        v = vals.split()
        if head != "embedding %d dim %d" % (k, len(v)):
            fail("bad line %r" % line[:80])
        out.append(v)  # the printed strings: bits compare as text
    return out


def floats(v):
    return [float(x) for x in v]


def cos(a, b):
    a, b = floats(a) if isinstance(a[0], str) else a, floats(b) if isinstance(b[0], str) else b
    if len(a) != len(b):
        fail("widths %d and %d" % (len(a), len(b)))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / (na * nb)


def unit(v, what):
    n = math.sqrt(sum(x * x for x in floats(v)))
    if abs(n - 1) > 1e-5:
        fail("%s: norm %g" % (what, n))


def same(a, b, what):
    if same_bits:
        if a != b:
            fail("%s: not the same bits" % what)
    elif cos(a, b) < 0.999999:
        fail("%s: cosine %.9f" % (what, cos(a, b)))


ids = [c["ids"] for c in ref]
alone = {}
worst = 1.0
for pooling in ("mean", "last"):
    for k, c in enumerate(ref):
        v = run(model, [c["ids"]], pooling)[0]
        unit(v, "case %d %s" % (k, pooling))
        cs = cos(v, c[pooling])
        worst = min(worst, cs)
        if cs < COS_REF:
            fail("case %d (%d tokens) %s pooling: cosine %.9f to transformers'" %
                 (k, len(c["ids"]), pooling, cs))
        alone[pooling, k] = v
    batched = run(model, ids, pooling)
    for k in range(len(ref)):
        same(batched[k], alone[pooling, k], "case %d %s pooling in a batch of %d" %
             (k, pooling, len(ref)))
print("%d cases x mean/last: worst cosine to transformers %.12f; a batch of %d as alone (%s)" %
      (len(ref), worst, len(ref), "same bits" if same_bits else "cosine >= 0.999999"))

# cls: the first token's state, which in a causal model is that token's alone
cls = run(model, ids, "cls")
firsts = run(model, [s[:1] for s in ids], "last")
for k in range(len(ref)):
    same(cls[k], firsts[k], "case %d cls pooling against its first token alone" % k)
# the model over two backends: the same pools
for pooling in ("mean", "last"):
    split = run(model, ids, pooling, ["--gpu-layers", "1"])
    for k in range(len(ref)):
        if cos(split[k], alone[pooling, k]) < 0.999999:
            fail("case %d %s pooling with --gpu-layers 1: cosine %.9f" %
                 (k, pooling, cos(split[k], alone[pooling, k])))
print("cls as the first token alone; --gpu-layers 1 as whole")

# The directory's own pooling: sentence-transformers' files beside links to the model's.
POOL_KEYS = ["pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
             "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
             "pooling_mode_lasttoken"]
MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling"},
           {"idx": 2, "name": "2", "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize"}]


def pool_cfg(on, **more):
    c = {"word_embedding_dimension": len(alone["mean", 0])}
    c.update({k: k == on for k in POOL_KEYS})
    c["include_prompt"] = True
    c.update(more)
    return json.dumps(c, indent=4)


def model_copy(tmp, name, files):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    for f in os.listdir(model):
        os.symlink(os.path.abspath(os.path.join(model, f)), os.path.join(d, f))
    for rel, text in files.items():
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if text is None:
            os.makedirs(p)  # a folder where a file is expected
        else:
            open(p, "wb").write(text if isinstance(text, bytes) else text.encode())
    return d


with tempfile.TemporaryDirectory() as tmp:
    st = model_copy(tmp, "st-last", {"modules.json": json.dumps(MODULES),
                                    "1_Pooling/config.json": pool_cfg("pooling_mode_lasttoken")})
    own = run(st, ids)
    for k in range(len(ref)):
        same(own[k], alone["last", k], "case %d with the directory's lasttoken pooling" % k)
    over = run(st, ids[:1], "mean")[0]
    same(over, alone["mean", 0], "--pooling mean over the directory's lasttoken")
    bare = model_copy(tmp, "bare-cls", {"1_Pooling/config.json": pool_cfg("pooling_mode_cls_token")})
    same(run(bare, ids[1:2])[0], cls[1], "1_Pooling (cls) without modules.json")
    moved = [dict(m, path="pool") if m["path"] == "1_Pooling" else m for m in MODULES]
    other = model_copy(tmp, "st-moved", {"modules.json": json.dumps(moved),
                                        "pool/config.json": pool_cfg("pooling_mode_mean_tokens")})
    same(run(other, ids[2:3])[0], alone["mean", 2], "a Pooling module in another folder")
    plain = model_copy(tmp, "no-pooling", {"modules.json": json.dumps(MODULES[:1])})
    same(run(plain, ids[3:4])[0], alone["mean", 3], "modules.json without Pooling: mean")
    print("the directory's pooling: lasttoken, cls, another folder, none (mean); --pooling wins")

    # malformed: each refused, naming the file and the fault; --pooling still embeds
    pc = "1_Pooling/config.json"
    bad = [
        ({pc: "{"}, "not valid JSON"),
        ({pc: ""}, "not valid JSON"),
        ({pc: "[]"}, "not a JSON object"),
        ({pc: pool_cfg("pooling_mode_lasttoken") + " x"}, "not valid JSON"),
        ({pc: pool_cfg("pooling_mode_lasttoken").encode() + b"\0"}, "not valid JSON"),
        ({pc: b'{"pooling_mode_lasttoken": true, "a": "\xff"}'}, "not valid JSON"),
        ({pc: pool_cfg(None)}, "no pooling mode is on"),
        ({pc: pool_cfg("pooling_mode_lasttoken", pooling_mode_mean_tokens=True)}, "both on"),
        ({pc: pool_cfg("pooling_mode_max_tokens")}, "pooling_mode_max_tokens is not supported"),
        ({pc: pool_cfg("pooling_mode_weightedmean_tokens")}, "is not supported"),
        ({pc: pool_cfg(None, pooling_mode_lasttoken="true")}, "must be true or false"),
        ({pc: pool_cfg(None, pooling_mode_mean_tokens=1)}, "must be true or false"),
        ({pc: pool_cfg("pooling_mode_lasttoken", word_embedding_dimension=1024)},
         "word_embedding_dimension is 1024"),
        ({pc: pool_cfg("pooling_mode_lasttoken", word_embedding_dimension="64")},
         "positive integer"),
        ({pc: pool_cfg("pooling_mode_lasttoken", word_embedding_dimension=-1)},
         "positive integer"),
        ({pc: '{"pooling_mode_lasttoken": true, "pooling_mode_lasttoken": false}'},
         "duplicate key"),
        ({pc: None}, "1_Pooling/config.json"),
        ({"modules.json": "{}"}, "not a JSON array"),
        ({"modules.json": "[1]"}, "is not an object"),
        ({"modules.json": "[{}]"}, "is not an object"),
        ({"modules.json": "null"}, "modules.json"),
        ({"modules.json": json.dumps(MODULES[:1] + [MODULES[1], MODULES[1]]),
          pc: pool_cfg("pooling_mode_lasttoken")}, "two Pooling modules"),
        ({"modules.json": json.dumps(MODULES + [{"idx": 3, "path": "3_Dense",
                                                 "type": "sentence_transformers.models.Dense"}]),
          pc: pool_cfg("pooling_mode_lasttoken")}, "sentence_transformers.models.Dense) is not"),
        ({"modules.json": json.dumps([dict(MODULES[1], path="../1_Pooling")])}, "needs a \"path\""),
        ({"modules.json": json.dumps([dict(MODULES[1], path="/tmp")])}, "needs a \"path\""),
        ({"modules.json": json.dumps([dict(MODULES[1], path=7)])}, "needs a \"path\""),
        ({"modules.json": json.dumps([MODULES[1]])}, "which has no config.json"),
    ]
    if opts:  # reading the files is the host's, whatever the backend: a few suffice there
        bad = bad[:3]
    for n, (files, want) in enumerate(bad):
        d = model_copy(tmp, "bad%d" % n, files)
        msg = run(d, ids[:1], expect=1)
        if "lmhost embed:" not in msg or want not in msg or "--pooling" not in msg:
            fail("malformed pooling files %r: wanted an error with %r, got:\n%s" %
                 (sorted(files), want, msg))
        same(run(d, ids[:1], "last")[0], alone["last", 0], "--pooling over malformed files")
    print("%d malformed pooling files refused (the model embeds with --pooling)" % len(bad))

# command lines (the host's: on a backend's run, the one that reaches the model)
for argv, want, code in [([], "--ids is required", 2),
                         (["--ids", "1", "--pooling", "max"], "--pooling must be", 2),
                         (["--ids", "1,,2"], "--ids must be", 2),
                         (["--ids", "1,"], "ends with a comma", 2),
                         (["--ids", ""], "at least one token id", 2),
                         (["--ids", "1", "--ids", "99999999"], "out of range", 1),
                         (["--ids"], "needs a value", 2),
                         (["--ids", "1", "--model", model], "given twice", 2)]:
    if opts and code != 1:
        continue
    p = subprocess.run([lmhost, "embed", "--model", model] + opts + argv, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != code or want not in p.stderr or p.stdout:
        fail("lmhost embed %s: exit %d (wanted %d, %r)\n%s" % (" ".join(argv), p.returncode, code,
                                                              want, p.stderr))
print("bad command lines refused")


def read_npy(path):
    """A little-endian f32 C-order .npy as (shape, flat list)."""
    b = open(path, "rb").read()
    if b[:6] != b"\x93NUMPY":
        fail(path + ": not .npy")
    hl = struct.unpack("<H", b[8:10])[0] if b[6] == 1 else struct.unpack("<I", b[8:12])[0]
    start = 10 if b[6] == 1 else 12
    head = b[start:start + hl].decode()
    if "'<f4'" not in head or "True" in head:
        fail(path + ": not little-endian f32 in C order")
    shape = tuple(int(x) for x in head.split("(")[1].split(")")[0].split(",") if x.strip())
    n = 1
    for s in shape:
        n *= s
    return shape, list(struct.unpack("<%df" % n, b[start + hl:start + hl + 4 * n]))


for d in hidden_dirs:
    # transformers' last hidden state is after the final norm: pooled here in double
    prompt = json.load(open(os.path.join(d, "reference.json")))["prompt"]
    (L, T, H), hs = read_npy(os.path.join(d, "hidden_states.npy"))
    last = hs[(L - 1) * T * H:]
    for n in (1, 7, T) if not opts else (T,):
        rows = [last[t * H:(t + 1) * H] for t in range(n)]
        want = {"mean": [sum(r[j] for r in rows) / n for j in range(H)], "last": rows[-1]}
        for pooling in ("mean", "last"):
            got = run(d, [prompt[:n]], pooling)[0]
            if cos(got, want[pooling]) < COS_REF:
                fail("%s: %d tokens, %s pooling: cosine %.9f to transformers' hidden states" %
                     (d, n, pooling, cos(got, want[pooling])))
    print("%s: mean and last pools of transformers' final hidden states" % os.path.basename(d))

for d in family_dirs:
    seqs = [[1, 2, 3, 4, 5, 6, 7], [9], [10, 11, 12]]
    for pooling in ("mean", "last") if not opts else ("last",):
        both = run(d, seqs, pooling)
        for k, s in enumerate(seqs):
            unit(both[k], d)
            same(both[k], run(d, [s], pooling)[0], "%s: sequence %d %s pooling in a batch" %
                 (os.path.basename(d), k, pooling))
    print("%s: a batch as each alone" % os.path.basename(d))
print("ok")
