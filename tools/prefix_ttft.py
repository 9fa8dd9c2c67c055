#!/usr/bin/env python3
"""Time to first token through a running `lmhost serve`, cold and with a cached prefix.

usage: prefix_ttft.py URL [--prompt N] [--shared M] [--seed S]

Sends /v1/completions requests of token ids with max_tokens 1 (the reply's time is then the
prefill's and the first token's): a prompt of N random ids (cold: nothing shares it), the same
again (all but its last token cached), then one that shares its first M ids and differs after
(M cached). Prints each one's seconds and the cached_tokens the server reports. Standard
library only.
"""
import json
import random
import sys
import time
import urllib.request


def complete(url, ids):
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"content-type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.load(r)
    dt = time.monotonic() - t0
    cached = out.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens")
    return dt, cached


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    url, n, m, seed = args[0].rstrip("/"), 4000, 3900, 1
    i = 1
    while i < len(args):
        if "=" in args[i]:
            k, v = args[i].split("=", 1)
            i += 1
        else:
            k, v = args[i], args[i + 1] if i + 1 < len(args) else None
            i += 2
        if v is None:
            sys.exit(f"{k}: needs a value")
        if k == "--prompt":
            n = int(v)
        elif k == "--shared":
            m = int(v)
        elif k == "--seed":
            seed = int(v)
        else:
            sys.exit(f"unknown option {k}")
    if not 0 < m < n:
        sys.exit("--shared must be below --prompt")
    rng = random.Random(seed)
    ids = [rng.randrange(1000, 100000) for _ in range(n)]
    other = ids[:m] + [rng.randrange(1000, 100000) for _ in range(n - m)]
    for what, p in (("cold", ids), ("same prompt", ids), (f"{m} shared", other)):
        dt, cached = complete(url, p)
        print(f"{what:>12}: {len(p)} tokens, {dt:8.3f} s to the first token, cached_tokens {cached}")


if __name__ == "__main__":
    main()
