#!/usr/bin/env python3
"""Every setting of a fixture's config.json, broken one at a time, through `lmhost logits`:
the architecture plugin must either run or refuse with a message and exit status 1, never
crash, hang or print nothing. Numbers become 0, -1, a huge value, a fraction, a string and
null; lists lose or gain an entry or become a number; strings become an unknown name and a
number; booleans flip and become strings. Under the sanitizer build (tests/run.sh) a memory
error anywhere in a plugin's config handling shows as a crash here.

usage: config_sweep.py LMHOST MODEL_DIR...     exit 0 pass, 1 fail
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def variants(value):
    if isinstance(value, bool):
        return [not value, "yes", None]
    if isinstance(value, (int, float)):
        return [0, -1, 1 << 40, 0.5, "12", None]
    if isinstance(value, str):
        return ["no_such_thing", 7, ""]
    if isinstance(value, list):
        out = [value[:-1], 3, []]
        if value:
            out.append(value + [value[-1]])
            out.append([{"x": 1}] + value[1:])
        return out
    if isinstance(value, dict):
        return [7, {}]
    return [1]


def paths(obj, prefix=()):
    """Every key path of nested dicts (lists are mutated whole)."""
    for k, v in obj.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from paths(v, prefix + (k,))


def main():
    lmhost, dirs = sys.argv[1], sys.argv[2:]
    tmp = tempfile.mkdtemp(prefix="lmhost-sweep-")
    fails = runs = ran = 0
    try:
        for src in dirs:
            name = os.path.basename(src.rstrip("/"))
            base = json.load(open(os.path.join(src, "config.json")))
            work = os.path.join(tmp, name)
            os.makedirs(work)
            os.symlink(os.path.abspath(os.path.join(src, "model.safetensors")),
                       os.path.join(work, "model.safetensors"))
            for path in paths(base):
                if path == ("model_type",):
                    continue  # another family's plugin would answer: its own sweep covers it
                node = base
                for k in path[:-1]:
                    node = node[k]
                for v in variants(node[path[-1]]):
                    cfg = json.loads(json.dumps(base))
                    n = cfg
                    for k in path[:-1]:
                        n = n[k]
                    n[path[-1]] = v
                    json.dump(cfg, open(os.path.join(work, "config.json"), "w"))
                    runs += 1
                    what = f"{name}: {'.'.join(path)} = {json.dumps(v)}"
                    try:
                        p = subprocess.run([lmhost, "logits", "--model", work, "--tokens", "1,2,3",
                                            "--out", os.path.join(tmp, "out.npy")],
                                           capture_output=True, text=True, timeout=60)
                    except subprocess.TimeoutExpired:
                        print(f"FAIL {what}: no answer in 60 s")
                        fails += 1
                        continue
                    if p.returncode == 0:
                        ran += 1
                        continue
                    if p.returncode != 1 or "lmhost:" not in p.stderr:
                        print(f"FAIL {what}: exit {p.returncode}, stderr {p.stderr.strip()[-300:]!r}")
                        fails += 1
            shutil.rmtree(work)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{runs} broken configs: {ran} ran anyway, {runs - ran - fails} refused cleanly, "
          f"{fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
