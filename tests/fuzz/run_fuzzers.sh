#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and runs each
# for SECONDS with its seed corpus, printing "fuzz-<name>: ok" per target. A crash, leak,
# sanitizer report or timeout fails the run, with the reproducer left in
# build-fuzz/artifacts/<name>/ and the end of libFuzzer's log printed.
# usage: tests/fuzz/run_fuzzers.sh [SECONDS] [NAME...]   (default 30 s, every target)
set -uo pipefail

# name | sources | pkg-config packages | extra compiler flags
# Seeds come from tests/fuzz/corpus/<name>/, a dictionary from tests/fuzz/<name>.dict. The
# template target also gets the chat templates of the tokenizers that tools/fetch_tokenizers.sh
# put in $LMHOST_TOKENIZERS (default ~/.cache/lmhost/tokenizers), when they are there: copied
# into a temporary directory for the run, never into the repository.
# The tool-call plugins, linked into the targets that parse or force tool calls (each entry
# point renamed by -DTCC_STATIC so that they link side by side).
TOOLCALL_PLUGINS="plugins/toolcall-common/tc_json.c plugins/toolcall-common/tc_stream.c plugins/toolcall-deepseek/deepseek.c plugins/toolcall-harmony/harmony.c plugins/toolcall-hermes/hermes.c plugins/toolcall-llama3/llama3.c plugins/toolcall-mistral/mistral.c"
TOOLCALL_FLAGS="-DTCC_STATIC -Iplugins/toolcall-common"
TARGETS=(
    "safetensors|tests/fuzz/fuzz_safetensors.c core/host/safetensors.c core/util/util.c core/text/jsonfix/json_fix.c|json-c|-Icore/text/jsonfix"
    "config|tests/fuzz/fuzz_config.c core/host/model_dir.c core/host/safetensors.c core/util/util.c core/text/jsonfix/json_fix.c|json-c|-Icore/text/jsonfix"
    "request|tests/fuzz/fuzz_request.c core/server/api.c core/server/toolcall.c $TOOLCALL_PLUGINS core/text/grammar/gram_build.c core/text/grammar/gram_compile.c core/text/grammar/gram_vocab.c core/text/grammar/gram_match.c core/text/tokenizer/tok_util.c core/text/tokenizer/tok_unidata.c core/text/tokenizer/tok_load.c core/text/tokenizer/tok_encode.c core/text/tokenizer/tok_decode.c core/host/sampler.c core/util/log.c core/text/jsonfix/json_fix.c|json-c libpcre2-8 libutf8proc|-Icore/server -Icore/text/jsonfix -Icore/text/tokenizer -Icore/text/grammar $TOOLCALL_FLAGS"
    "tokenizer|tests/fuzz/fuzz_tokenizer.c core/text/tokenizer/tok_util.c core/text/tokenizer/tok_unidata.c core/text/tokenizer/tok_load.c core/text/tokenizer/tok_encode.c core/text/tokenizer/tok_decode.c core/text/jsonfix/json_fix.c|json-c libpcre2-8 libutf8proc|-Icore/text/tokenizer -Icore/text/jsonfix"
    "spirv|tests/fuzz/fuzz_spirv.c backends/vulkan/vk_spirv.c||-Ibackends/vulkan"
    "npy|tests/fuzz/fuzz_npy.c core/util/npy.c core/util/log.c||"
    "cachespec|tests/fuzz/fuzz_cache_spec.c core/host/cache_spec.c||-Iplugins/cache-common -Iplugins/cache-turboquant -lm"
    "template|tests/fuzz/fuzz_template.c core/text/template/chat_template.c core/text/template/tpl_builtins.c core/text/template/tpl_eval.c core/text/template/tpl_format.c core/text/template/tpl_json.c core/text/template/tpl_parse.c core/text/template/tpl_unicode.c core/text/template/tpl_value.c|json-c libutf8proc|-Icore/text/template -lm"
    "grammar|tests/fuzz/fuzz_grammar.c core/text/grammar/gram_build.c core/text/grammar/gram_compile.c core/text/grammar/gram_vocab.c core/text/grammar/gram_match.c core/text/tokenizer/tok_util.c core/text/tokenizer/tok_unidata.c core/text/tokenizer/tok_load.c core/text/tokenizer/tok_encode.c core/text/tokenizer/tok_decode.c core/text/jsonfix/json_fix.c|json-c libpcre2-8 libutf8proc|-Icore/text/grammar -Icore/text/tokenizer -Icore/text/jsonfix"
    "toolcall|tests/fuzz/fuzz_toolcall.c core/server/toolcall.c $TOOLCALL_PLUGINS|json-c|$TOOLCALL_FLAGS"
    "hub|tests/fuzz/fuzz_hub.c core/host/hub_http.c core/host/hub_download.c core/host/hf_cache.c core/util/util.c core/util/log.c core/util/progress.c core/text/jsonfix/json_fix.c|json-c openssl|-Icore/text/jsonfix"
    "http|tests/fuzz/fuzz_http.c core/server/api.c core/server/toolcall.c $TOOLCALL_PLUGINS core/server/metrics.c core/server/conn_guard.c core/server/client_limits.c core/host/cache_spec.c core/host/sampler.c core/text/grammar/gram_build.c core/text/grammar/gram_compile.c core/text/grammar/gram_vocab.c core/text/grammar/gram_match.c core/text/tokenizer/tok_util.c core/text/tokenizer/tok_unidata.c core/text/tokenizer/tok_load.c core/text/tokenizer/tok_encode.c core/text/tokenizer/tok_decode.c core/util/log.c core/text/jsonfix/json_fix.c|json-c libpcre2-8 libutf8proc libevent libevent_pthreads libevent_openssl openssl|-Icore/server -Icore/text/jsonfix -Icore/text/tokenizer -Icore/text/grammar -lm -lpthread $TOOLCALL_FLAGS"
)

seconds=${1:-30}
shift || true
cd "$(dirname "$0")/../.." || exit 1
out=build-fuzz
CC=${FUZZ_CC:-clang}
# shellcheck disable=SC2054 # the commas belong to -fsanitize=
CFLAGS_FUZZ=(-g -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -fsanitize=fuzzer,address,undefined
    -fno-sanitize-recover=all -fno-omit-frame-pointer -Icore/util -Icore/host -Icore/text -Icore/text/grammar -Icore/text/tokenizer -Icore/cli -Icore/server -Iabi)
mkdir -p "$out"

SELECT=("$@") # target names given after SECONDS; none means all
wanted() {
    [ ${#SELECT[@]} -eq 0 ] && return 0
    local n
    for n in "${SELECT[@]}"; do [ "$n" = "$1" ] && return 0; done
    return 1
}

# tokenizer_seeds DIR: writes each fetched tokenizer's chat template (a string, or each of a
# list of named ones) to DIR/NAME.jinja; prints how many.
tokenizer_seeds() {
    local root=${LMHOST_TOKENIZERS:-$HOME/.cache/lmhost/tokenizers}
    python3 - "$1" "$root"/*/tokenizer_config.json <<'PY' 2>/dev/null || echo 0
import json, os, sys
n = 0
for path in sys.argv[2:]:
    try:
        with open(path, encoding="utf-8") as f:
            ct = json.load(f).get("chat_template")
    except (OSError, ValueError):
        continue
    name = os.path.basename(os.path.dirname(path))
    items = [(name, ct)] if isinstance(ct, str) else [
        (name + "-" + str(t.get("name")), t.get("template")) for t in ct or []
        if isinstance(t, dict)]
    for stem, src in items:
        if isinstance(src, str):
            with open(os.path.join(sys.argv[1], stem + ".jinja"), "w", encoding="utf-8") as f:
                f.write(src)
            n += 1
print(n)
PY
}

tmp_seeds=$(mktemp -d)
trap 'rm -rf "$tmp_seeds"' EXIT

status=0
for row in "${TARGETS[@]}"; do
    IFS='|' read -r name srcs pkgs extra <<<"$row"
    wanted "$name" || continue
    bin=$out/fuzz_$name
    # shellcheck disable=SC2086,SC2046 # the table's lists are meant to split
    if ! $CC "${CFLAGS_FUZZ[@]}" $extra $srcs $([ -z "$pkgs" ] || pkg-config --cflags --libs $pkgs) -o "$bin" \
        >"$out/build-$name.log" 2>&1; then
        cat "$out/build-$name.log"
        echo "fuzz-$name: FAILED to build"
        status=1
        continue
    fi
    corpus=$out/corpus/$name
    artifacts=$out/artifacts/$name
    mkdir -p "$corpus" "$artifacts"
    args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192
        -print_final_stats=1 -artifact_prefix="$artifacts/")
    [ -f "tests/fuzz/$name.dict" ] && args+=(-dict="tests/fuzz/$name.dict")
    seeds=()
    [ -d "tests/fuzz/corpus/$name" ] && seeds=("tests/fuzz/corpus/$name")
    if [ "$name" = template ]; then
        mkdir -p "$tmp_seeds/$name"
        n=$(tokenizer_seeds "$tmp_seeds/$name")
        [ "$n" -gt 0 ] 2>/dev/null && seeds+=("$tmp_seeds/$name")
        echo "extra seeds for fuzz-$name: ${n:-0} chat templates of fetched tokenizers" >&2
    fi
    log=$out/fuzz-$name.log
    # The first corpus directory collects what libFuzzer finds; the seeds stay untouched.
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin" "${args[@]}" "$corpus" "${seeds[@]}" \
        >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    if [ $rc -ne 0 ]; then
        grep -E 'ERROR|SUMMARY|Test unit written|==[0-9]+==' "$log" | head -20
        tail -40 "$log"
        echo "fuzz-$name: FAILED (exit $rc; reproducer in $artifacts/, log $log)"
        status=1
    else
        echo "fuzz-$name: ok (${seconds}s, ${execs:-?} runs, corpus $(find "$corpus" -type f | wc -l) files)"
    fi
done
exit $status
