#!/bin/sh
# Checks the tokenize / detokenize subcommands end to end through a CLI binary.
# usage: cli_test.sh CLI_BINARY [SUBCOMMAND_PREFIX...]; the tokenizers come from
# $LMHOST_TOKENIZERS (default ~/.cache/lmhost/tokenizers, filled by tools/fetch_tokenizers.sh).
set -u
cli=$1
root=${LMHOST_TOKENIZERS:-$HOME/.cache/lmhost/tokenizers}
if [ ! -s "$root/qwen3/tokenizer.json" ] || [ ! -s "$root/llama2/tokenizer.json" ]; then
  echo "FAIL: tokenizers missing in $root; run tools/fetch_tokenizers.sh ~/.cache/lmhost/tokenizers" >&2
  exit 1
fi
fail=0
expect() { # expect NAME WANT GOT
  if [ "$2" != "$3" ]; then echo "FAIL $1: want [$2] got [$3]" >&2; fail=1; fi
}
expect tokenize-qwen3 '{"ids": [9707, 11, 1879, 0]}' "$("$cli" tokenize --model "$root/qwen3" --text 'Hello, world!')"
expect tokenize-llama2-special '{"ids": [1, 22557, 28725, 1526, 28808]}' \
  "$("$cli" tokenize --model "$root/llama2" --text 'Hello, world!' --special)"
expect tokenize-llama2-plain '{"ids": [22557, 28725, 1526, 28808]}' \
  "$("$cli" tokenize --model="$root/llama2" --text='Hello, world!')"
tmp=$(mktemp)
printf 'line one\nline "two"\n' > "$tmp"
expect tokenize-file '{"ids": [1056, 825, 198, 1056, 330, 19789, 698]}' \
  "$("$cli" tokenize --model "$root/qwen3" --text-file "$tmp")"
rm -f "$tmp"
expect detokenize-qwen3 '{"text": "Hello, world!<|im_end|>\n\"q\"\\"}' \
  "$("$cli" detokenize --model "$root/qwen3" --ids 9707,11,1879,0,151645,198,1,80,11934)"
expect detokenize-llama2 '{"text": "<s> Hello"}' "$("$cli" detokenize --model "$root/llama2" --ids '1, 22557')"
# errors: non-zero exit, message on stderr, nothing on stdout
for args in "tokenize --model $root/qwen3" "tokenize --text x" \
            "tokenize --model $root/qwen3 --text a --text-file /dev/null" \
            "tokenize --model /nonexistent --text a" "tokenize --model $root/qwen3 --bogus" \
            "detokenize --model $root/qwen3 --ids 1,x" "detokenize --model $root/qwen3 --ids 999999999" \
            "detokenize --model $root/qwen3 --ids 1," "detokenize --model $root/qwen3"; do
  out=$("$cli" $args 2>/dev/null); rc=$?
  err=$("$cli" $args 2>&1 >/dev/null)
  if [ $rc -eq 0 ] || [ -n "$out" ] || [ -z "$err" ]; then
    echo "FAIL: '$args' should fail with a message (rc=$rc out=[$out])" >&2; fail=1
  fi
done
[ $fail -eq 0 ] && echo "tokenizer CLI: all checks passed"
exit $fail
