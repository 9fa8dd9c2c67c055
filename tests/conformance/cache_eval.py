#!/usr/bin/env python3
"""`lmhost cache-eval`, a stable contract: one line of JSON on stdout with its keys in order
(format, dim, k_bits_per_dim, v_bits_per_dim, v_mse, k_ip_bias, k_ip_var) for f32, f16, q8,
q4 (as FORMAT and PLUGIN:FORMAT), tq3 and tq4 (against the TurboQuant spec's oracles), within what each format does to unit vectors: f32
exactly no error; f16 below 1e-6; q8 below q4; bits per dim from the formats' sizes (q8 and
q4 keep an f32 scale and bias a group of 64, or 32 for heads of 96). The same seed gives the
same line, another seed another; `--opt value` and `--opt=value` are the same. Missing or bad
options, unknown formats, settings a format does not take, heads it cannot store and a
plugin without read_rows (OLD_PLUGIN_DIR holds one built for ABI 1.7) exit nonzero with a
message on stderr and nothing on stdout. With --cpu-check, the same lines as the CPU
backend gives are wanted (the formats' codes are the same on every backend).

usage: cache_eval.py LMHOST OLD_PLUGIN_DIR [--cpu-check] [lmhost options...]
exit 0 pass, 1 fail
"""
import json
import math
import subprocess
import sys

KEYS = ["format", "dim", "k_bits_per_dim", "v_bits_per_dim", "v_mse", "k_ip_bias", "k_ip_var"]
fails = 0


def fail(msg):
    global fails
    fails += 1
    print("FAIL: " + msg)


def run(args):
    p = subprocess.run([LMHOST, "cache-eval"] + args, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def evaluate(spec, dim=128, n=2000, seed=1, extra=None, eq=False):
    """The JSON object cache-eval prints (an ordered list of pairs), or None after a failure."""
    opts = {"--cache": spec, "--dim": str(dim), "--vectors": str(n), "--seed": str(seed)}
    args = []
    for k, v in opts.items():
        args += [k + "=" + v] if eq else [k, v]
    rc, out, err = run(args + (EXTRA if extra is None else extra))
    lines = out.splitlines()
    if rc != 0 or len(lines) != 1:
        fail("%s: exit %d, %d lines on stdout (want 0, 1): %s" % (spec, rc, len(lines), err))
        return None
    try:
        pairs = json.loads(lines[0], object_pairs_hook=lambda p: p)
    except ValueError as e:
        fail("%s: not JSON (%s): %s" % (spec, e, lines[0]))
        return None
    if [k for k, _ in pairs] != KEYS:
        fail("%s: keys %s, want %s" % (spec, [k for k, _ in pairs], KEYS))
        return None
    d = dict(pairs)
    if d["format"] != spec or d["dim"] != dim:
        fail("%s: format %r, dim %r" % (spec, d["format"], d["dim"]))
    for k in KEYS[2:]:
        if not isinstance(d[k], (int, float)) or not math.isfinite(d[k]):
            fail("%s: %s is %r" % (spec, k, d[k]))
            return None
    return d, lines[0]


def want(ok, msg):
    if not ok:
        fail(msg)


def quant_bits(bits, dim):
    group = 64 if dim % 64 == 0 else 32 if dim % 32 == 0 else 16
    return 8 * 4 * (dim * bits // 32 + 2 * (dim // group)) / dim


def refused(args, what, code=None):
    rc, out, err = run(args)
    if rc == 0 or (code is not None and rc != code) or out or not err.strip():
        fail("%s: exit %d (want %s), stdout %r, stderr %r" % (what, rc, code or "nonzero", out, err))


def main():
    global LMHOST, EXTRA
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    LMHOST, old_dir = sys.argv[1], sys.argv[2]
    EXTRA = sys.argv[3:]
    cpu_check = "--cpu-check" in EXTRA
    if cpu_check:
        EXTRA.remove("--cpu-check")

    got = {}
    for spec in ["f32", "f16", "q8", "q4"]:
        r = evaluate(spec)
        if r is None:
            continue
        got[spec] = r[0]
        print(r[1])
        if cpu_check:
            cpu = evaluate(spec, extra=[])
            want(cpu is not None and cpu[1] == r[1],
                 "%s: %s, the CPU gives %s" % (spec, r[1], cpu and cpu[1]))
    if len(got) == 4:
        f32, f16, q8, q4 = got["f32"], got["f16"], got["q8"], got["q4"]
        want(f32["v_mse"] == 0, "f32: v_mse %r, want 0" % f32["v_mse"])
        want(abs(f32["k_ip_bias"]) < 1e-8 and f32["k_ip_var"] < 1e-14,
             "f32: k_ip_bias %r, k_ip_var %r: want f32 rounding alone" %
             (f32["k_ip_bias"], f32["k_ip_var"]))
        want(0 < f16["v_mse"] < 1e-6, "f16: v_mse %r, want (0, 1e-6)" % f16["v_mse"])
        want(abs(f16["k_ip_bias"]) < 1e-5 and f16["k_ip_var"] < 1e-8,
             "f16: k_ip_bias %r, k_ip_var %r" % (f16["k_ip_bias"], f16["k_ip_var"]))
        # unit vectors of 128: values about 0.09, groups' ranges about 0.45; a uniform
        # rounding error of step^2 / 12 a value gives about 2.6e-5 (q8) and 8e-3 (q4)
        want(5e-6 < q8["v_mse"] < 1e-4, "q8: v_mse %r, want about 2.8e-5" % q8["v_mse"])
        want(q8["v_mse"] * 50 < q4["v_mse"] < 0.05, "q4: v_mse %r against q8's %r" %
             (q4["v_mse"], q8["v_mse"]))
        want(abs(q8["k_ip_bias"]) < 1e-4 and q8["k_ip_var"] < 1e-6,
             "q8: k_ip_bias %r, k_ip_var %r" % (q8["k_ip_bias"], q8["k_ip_var"]))
        want(q8["k_ip_var"] < q4["k_ip_var"] < 1e-3,
             "q4: k_ip_var %r against q8's %r" % (q4["k_ip_var"], q8["k_ip_var"]))
        for spec, bits in [("f32", 32), ("f16", 16), ("q8", quant_bits(8, 128)),
                           ("q4", quant_bits(4, 128))]:
            d = got[spec]
            want(d["k_bits_per_dim"] == bits and d["v_bits_per_dim"] == bits,
                 "%s: bits per dim %r, %r, want %r" %
                 (spec, d["k_bits_per_dim"], d["v_bits_per_dim"], bits))
        want(quant_bits(8, 128) == 9 and quant_bits(4, 128) == 5, "the test's q8/q4 sizes")

    # TurboQuant against specs/turboquant.md §11 (10,000 vectors: MSE within 1 %, a bias
    # within 4 standard errors, a variance within 7 %); bits from the records (68 and 50
    # bytes a block of 128, 36 and 26 of 64); heads it cannot store keep f16 rows
    n = 10000
    tq = {}
    for spec in ["tq3", "tq4", "tq3,qjl=off"]:
        r = evaluate(spec, n=n)
        if r is None:
            continue
        tq[spec] = r[0]
        print(r[1])
        if cpu_check:  # a value a hair from a boundary may take the next code on a GPU
            cpu = evaluate(spec, n=n, extra=[])
            want(cpu is not None and all(abs(cpu[0][k] - r[0][k]) <= 1e-3 * abs(cpu[0][k]) + 1e-7
                                         for k in KEYS[2:]),
                 "%s: %s, the CPU gives %s" % (spec, r[1], cpu and cpu[1]))

    def near(spec, key, value, rel):
        d = tq.get(spec)
        want(d is not None and abs(d[key] - value) <= rel * abs(value),
             "%s: %s %r, want %r within %g%%" % (spec, key, d and d[key], value, 100 * rel))

    def unbiased(spec, value):
        d = tq.get(spec)
        se = math.sqrt(d["k_ip_var"] / n) if d else 0
        want(d is not None and abs(d["k_ip_bias"] - value) < 4 * se,
             "%s: k_ip_bias %r, want %r within 4 x %g" % (spec, d and d["k_ip_bias"], value, se))

    near("tq3", "v_mse", 0.03385, 0.01)
    unbiased("tq3", 0.0)
    near("tq3", "k_ip_var", 1.50e-4, 0.07)
    near("tq3,qjl=off", "v_mse", 0.03385, 0.01)
    unbiased("tq3,qjl=off", -0.01702)
    near("tq3,qjl=off", "k_ip_var", 3.36e-4, 0.07)
    near("tq4", "v_mse", 0.00918, 0.01)
    want("tq4" in tq and "tq3" in tq and tq["tq4"]["k_ip_var"] < tq["tq3"]["k_ip_var"],
         "tq4 keys' variance not below tq3's")
    for spec, dim, kb, vb in [("tq3", 128, 4.25, 3.125), ("tq4", 128, 4.25, 4.125),
                              ("tq3", 64, 4.5, 3.25), ("tq3", 256, 4.25, 3.125),
                              ("tq4", 96, 16, 16)]:
        r = evaluate(spec, dim=dim, n=200)
        want(r is not None and (r[0]["k_bits_per_dim"], r[0]["v_bits_per_dim"]) == (kb, vb),
             "%s at %d: bits %r, want %r" % (spec, dim, r and r[1], (kb, vb)))
    refused(["--cache", "tq3,qjl=maybe", "--dim", "128", "--vectors", "10", "--seed", "1"] + EXTRA,
            "tq3 with a bad setting")

    # a plugin named with the format; --opt=value; the same seed, another seed
    for spec, plain in [("plain:f16", "f16"), ("quant:q4", "q4")]:
        r = evaluate(spec)
        if r and plain in got:
            a, b = dict(r[0]), dict(got[plain])
            a.pop("format")
            b.pop("format")
            want(a == b, "%s: %s, %s gave %s" % (spec, r[1], plain, got[plain]))
    r1, r2 = evaluate("q8", eq=True), evaluate("q8")
    want(r1 is not None and r2 is not None and r1[1] == r2[1],
         "--opt=value: %s, --opt value: %s" % (r1 and r1[1], r2 and r2[1]))
    r3 = evaluate("q8", seed=2)
    want(r3 is not None and r2 is not None and r3[0]["v_mse"] != r2[0]["v_mse"],
         "seeds 1 and 2 gave the same v_mse")
    # another head size: q8 groups of 32 for 96; f16 of 100 (the plain cache takes any)
    r = evaluate("q8", dim=96, n=500)
    want(r is not None and r[0]["k_bits_per_dim"] == quant_bits(8, 96) == 10,
         "q8 at 96: bits %r" % (r and r[0]["k_bits_per_dim"]))
    r = evaluate("f16", dim=100, n=500)
    want(r is not None and r[0]["v_bits_per_dim"] == 16, "f16 at 100")

    base = ["--dim", "128", "--vectors", "100", "--seed", "1"] + EXTRA
    refused(["--cache", "q9"] + base, "unknown format q9")
    refused(["--cache", "plain:q8"] + base, "a format of another plugin")
    refused(["--cache", "q8", "--dim", "0", "--vectors", "10", "--seed", "1"] + EXTRA, "--dim 0",
            2)
    refused(["--cache", "q8", "--dim", "128", "--vectors", "0", "--seed", "1"] + EXTRA,
            "--vectors 0", 2)
    refused(["--cache=q8", "--dim=-3", "--vectors=10", "--seed=1"] + EXTRA, "--dim=-3", 2)
    refused(["--cache", "q8", "--dim", "x", "--vectors", "10", "--seed", "1"] + EXTRA, "--dim x",
            2)
    refused(base, "no --cache", 2)
    refused(["--cache", "q8", "--vectors", "10", "--seed", "1"] + EXTRA, "no --dim", 2)
    refused(["--cache", "q8", "--dim", "128", "--seed", "1"] + EXTRA, "no --vectors", 2)
    refused(["--cache", "q8", "--dim", "128", "--vectors", "10"] + EXTRA, "no --seed", 2)
    refused(["--cache", "q8", "--bogus", "1"] + base, "an unknown option", 2)
    refused(["--cache", "q8", "--cache", "q4"] + base, "--cache twice", 2)
    refused(["--cache", "q8,hot=0"] + base, "settings q8 does not take")
    refused(["--cache", "q8", "--dim", "24", "--vectors", "10", "--seed", "1"] + EXTRA,
            "q8 with heads of 24")
    refused(["--cache", "f32", "--backend", "no_such_backend"] + base, "an unknown backend")
    rc, out, err = run(["--cache", "old17", "--plugin-dir", old_dir] + base)
    want(rc != 0 and not out and "read_rows" in err and "1.8" in err,
         "a plugin of ABI 1.7: exit %d, stdout %r, stderr %r" % (rc, out, err))

    print("%s" % ("ok" if not fails else "%d failed" % fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
