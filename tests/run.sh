#!/usr/bin/env bash
# Builds lmhost and runs every test: the meson suite (unit, tokenizer, template and model
# conformance on each SIMD path), the same suite under ASan+UBSan, the plugin development
# kit from an install (tests/pdk), the fuzz targets for a bounded time, and the NEON
# kernels under qemu. Ends with "N passed, N failed".
# Environment: FUZZ_SECONDS (default 12), LMHOST_TOKENIZERS (tokenizer cache; fetched
# with npm when missing), SKIP_ASAN=1 / SKIP_PDK=1 / SKIP_FUZZ=1 / SKIP_NEON=1 to leave a part out.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
passed=0
failed=0
# what failed, printed again at the end: CI shows a run's tail, and a suite prints its
# errors hundreds of lines above it
failures=/tmp/lmhost-failures.log
: >"$failures"

export LMHOST_TOKENIZERS=${LMHOST_TOKENIZERS:-$HOME/.cache/lmhost/tokenizers}
if ! tools/fetch_tokenizers.sh "$LMHOST_TOKENIZERS"; then
    echo "warning: could not fetch tokenizers; tokenizer/template tests will fail" >&2
fi

# The openai client for the server tests, pinned by tests/server/package-lock.json.
(cd tests/server && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "warning: npm ci failed; server tests will fail" >&2

# meson test's summary: "Ok: N", "Fail: N", "Unexpected Pass: N", "Timeout: N" ...
count_meson() {
    local log=$1 ok fail
    ok=$(grep -E '^Ok:' "$log" | awk '{s+=$2} END {print s+0}')
    fail=$(grep -E '^(Fail|Unexpected Pass|Timeout):' "$log" | awk '{s+=$NF} END {print s+0}')
    passed=$((passed + ok))
    failed=$((failed + fail))
}

run_suite() { # name builddir "meson test args" [meson setup args...]
    local name=$1 dir=$2 targs=$3
    shift 3
    echo "=== $name ==="
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >"/tmp/lmhost-setup-$name.log" 2>&1 || {
            cat "/tmp/lmhost-setup-$name.log"
            echo "$name: meson setup failed"
            failed=$((failed + 1))
            return
        }
    fi
    if ! ninja -C "$dir" >"/tmp/lmhost-build-$name.log" 2>&1; then
        tail -50 "/tmp/lmhost-build-$name.log"
        echo "$name: build failed"
        failed=$((failed + 1))
        return
    fi
    # shellcheck disable=SC2086 # targs is a list of arguments
    meson test -C "$dir" --print-errorlogs --num-processes "$(nproc)" $targs 2>&1 |
        tee "/tmp/lmhost-test-$name.log" | grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):'
    count_meson "/tmp/lmhost-test-$name.log"
    # each failed test's last lines, from meson's log of this run
    [ -f "$dir/meson-logs/testlog.json" ] || return
    python3 - "$dir/meson-logs/testlog.json" "$name" >>"$failures" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    if t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL"):
        out = (t.get("stdout") or "").rstrip().splitlines()[-25:]
        print(f"--- {sys.argv[2]}: {t['name']}: {t['result']} after {t['duration']:.1f} s")
        print("\n".join("    " + l for l in out))
PY
}

run_suite release build ""
if [ "${SKIP_ASAN:-0}" != 1 ]; then
    # Sanitizers see every parser and plugin; the leak checker too. Left out: the Vulkan
    # suites (Mesa's LLVM-based lavapipe leaks at exit, in its own code) and the docs'
    # commands (some run on lavapipe; the other suites cover that CLI); the release run
    # above covers them. The HTTPS test runs here too: ASan's slowdown is what made the
    # stream-end race with libevent's TLS bufferevent show (see core/server/server.c).
    export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        run_suite asan build-asan "--no-suite vulkan --no-suite conformance+vulkan --no-suite server --no-suite experts --no-suite docs --no-suite soak" \
        -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized
    SOAK_SECONDS=10 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        run_suite asan-server build-asan \
        "server-http server-https server-auth server-errors server-concurrency server-concurrency-hybrid server-shutdown server-swap server-swap-quant server-swap-kvquant server-kv-cache server-kv-cache-errors server-precision server-prefix-cache server-speculative server-structured server-embeddings server-experts server-readiness stream-experts-qwen3_moe-mlx4 stream-experts-gpt_oss-mxfp4 stream-experts-mixtral moe-top-k-qwen3_moe hub-download soak-https"
fi

one() { # name command...: a test outside meson
    local name=$1
    shift
    if "$@" >"/tmp/lmhost-$name.log" 2>&1; then
        echo "$name: ok"
        passed=$((passed + 1))
    else
        tail -30 "/tmp/lmhost-$name.log"
        echo "$name: FAILED"
        { echo "--- $name"; tail -25 "/tmp/lmhost-$name.log" | sed 's/^/    /'; } >>"$failures"
        failed=$((failed + 1))
    fi
}

if [ "${SKIP_PDK:-0}" != 1 ]; then
    echo "=== pdk (install, out-of-tree example plugins) ==="
    one pdk tests/pdk/run.sh build/tests/conformance/check_model
fi
if [ "${SKIP_FUZZ:-0}" != 1 ]; then
    echo "=== fuzz (${FUZZ_SECONDS:-12} s per target) ==="
    tests/fuzz/run_fuzzers.sh "${FUZZ_SECONDS:-12}" 2>&1 | tee /tmp/lmhost-fuzz.log | grep -E "^fuzz-"
    passed=$((passed + $(grep -cE "^fuzz-[a-z_]+: ok" /tmp/lmhost-fuzz.log)))
    failed=$((failed + $(grep -cE "^fuzz-[a-z_]+: FAILED" /tmp/lmhost-fuzz.log)))
    grep -E "^fuzz-[a-z_]+: FAILED" /tmp/lmhost-fuzz.log >>"$failures"
fi
if [ "${SKIP_NEON:-0}" != 1 ]; then
    echo "=== neon (qemu) ==="
    one neon-qemu tests/cpu/run_neon_qemu.sh
fi

if [ -s "$failures" ]; then
    echo "=== failures (again) ==="
    cat "$failures"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
