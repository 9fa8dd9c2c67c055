#!/usr/bin/env bash
# `lmhost bench` compares prefill with the multiply-add rate its backend measures
# (lmh_backend_api.compute_peak). Checked from the printed figures, within their rounding:
# the bound is the peak over the products' FLOP a token, the ratio the products' rate over
# the peak, and the products ran no faster than the peak. --no-peak leaves both lines out.
# usage: bench_peak.sh LMHOST MODEL [bench options...]
set -u
lmhost=$1 model=$2
shift 2
out=$("$lmhost" bench --model "$model" --prompt 32 --gen 2 --no-bandwidth "$@" 2>&1) ||
    { echo "$out"; exit 1; }
echo "$out" | grep -E "^(chain|prefill|compute)"
awk '
/^prefill matrix products: / { F = $4; T = $8 }
/^compute peak \(backend [a-z]+\): / { P = $5; what = $0; sub(/^[^(]*\([^(]*\(/, "", what) }
/^prefill bound by compute \(matrix products\): / { B = $7; R = $12; sub(/%$/, "", R) }
function near(a, b, rel) { return a > 0 && b > 0 && (a - b <= rel * b) && (b - a <= rel * b) }
END {
    if (!(F > 0 && T > 0)) { print "FAIL: no prefill matrix products line"; exit 1 }
    if (!(P > 0) || what == ")") { print "FAIL: no compute peak line, or one without what it measured"; exit 1 }
    if (!near(B, P * 1e12 / F, 0.002)) { printf "FAIL: bound %g tokens/s, want %g / %g\n", B, P * 1e12, F; exit 1 }
    if (!near(R, 100 * T / P, 0.01)) { printf "FAIL: ratio %g%%, want 100 x %g / %g\n", R, T, P; exit 1 }
    if (R + 0 > 100) { printf "FAIL: the products (%g TFLOP/s) beat the peak (%g)\n", T, P; exit 1 }
}' <<<"$out" || exit 1
out=$("$lmhost" bench --model "$model" --prompt 8 --gen 2 --no-bandwidth --no-peak "$@" 2>&1) ||
    { echo "$out"; exit 1; }
if grep -q "compute" <<<"$out"; then
    echo "$out"
    echo "FAIL: --no-peak still measured the peak"
    exit 1
fi
echo "ok: prefill against the backend's measured compute peak"
