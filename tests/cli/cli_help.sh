#!/bin/bash
# The commands' help and the shape of the command line: every command `lmhost --help` lists
# answers `--help` and `-h` (exit 0) with a usage line and every option its parser takes
# (the hidden --list-options prints them from the same table), each with a default or
# [required]; `--opt=value` and `--opt value` run the same; --version's format; unknown
# commands and options exit 2; quantize/dequantize draw no progress off a terminal and a bar
# on one.
# usage: cli_help.sh LMHOST SOURCE_ROOT
set -u
lmhost=$(realpath "$1")
root=$(realpath "$2")
model=$root/tests/data/e2e # config.json + model.safetensors: two random Qwen3 layers
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

# ---- lmhost --help, help, --version, unknown commands ----
top=$("$lmhost" --help) || fail "lmhost --help exited $?"
[ "$("$lmhost" -h)" = "$top" ] || fail "-h differs from --help"
[ "$("$lmhost" help)" = "$top" ] || fail "help differs from --help"
cmds=$(echo "$top" | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }')
for c in serve generate logits embed bench cache-eval tokenize detokenize template quantize \
  dequantize plugins check-plugin; do
  echo "$cmds" | grep -qx -- "$c" || fail "lmhost --help does not list $c"
done
major=$(awk '/#define LMH_ABI_MAJOR/ { print $3 }' "$root/abi/lmhost/abi.h")
# (the minor's value may sit on the line after the #define, behind a backslash)
minor=$(sed -n '/#define LMH_ABI_MINOR/,/[0-9]/p' "$root/abi/lmhost/abi.h" | tr -d '\\' |
  sed 's/#define LMH_ABI_MINOR//' | grep -o '[0-9][0-9]*' | head -1)
v=$("$lmhost" --version) || fail "--version exited $?"
echo "$v" | grep -Eqx "lmhost [0-9]+\.[0-9]+\.[0-9]+[^ ]* \(plugin ABI $major\.$minor\)" ||
  fail "--version printed '$v' (want 'lmhost X.Y.Z (plugin ABI $major.$minor)')"
[ "$("$lmhost" version)" = "$v" ] || fail "version differs from --version"
err=$("$lmhost" no-such-command 2>&1)
[ $? -eq 2 ] || fail "an unknown command exited $? (want 2)"
echo "$err" | grep -q "unknown command 'no-such-command'" || fail "unknown command: '$err'"
echo "$err" | grep -q "lmhost --help" || fail "unknown command does not point at lmhost --help"
"$lmhost" >/dev/null 2>&1
[ $? -eq 2 ] || fail "no command: exit $? (want 2)"

# ---- every command's --help names every option, with a default ----
for c in $cmds; do
  help=$("$lmhost" "$c" --help) || fail "$c --help exited $?"
  [ "$("$lmhost" "$c" -h)" = "$help" ] || fail "$c: -h differs from --help"
  [ "$("$lmhost" help "$c")" = "$help" ] || fail "$c: 'lmhost help $c' differs from --help"
  echo "$help" | head -1 | grep -q "^usage: lmhost $c" || fail "$c --help: no usage line"
  opts=$("$lmhost" "$c" --list-options) || fail "$c --list-options exited $?"
  echo "$opts" | grep -qx -- --help || fail "$c --list-options lacks --help"
  for o in $opts; do
    echo "$help" | grep -Eq -- "^  (-h, )?$o( |\$)" || fail "$c --help does not list $o"
  done
  # each option's entry (its line and those indented under it) says a default or [required]
  missing=$(echo "$help" | awk '
    function done_opt() { if (name != "" && name != "-h," && entry !~ /\[(default: |required)/) print name }
    /^  -/ { done_opt(); name = $1; entry = $0; next }
    /^     / && name != "" { entry = entry " " $0; next }
    { done_opt(); name = "" }
    END { done_opt() }')
  [ -z "$missing" ] || fail "$c --help gives no default for: $missing"
  # help wins wherever an option may stand, even beside a model that does not exist...
  "$lmhost" "$c" --model /nonexistent --help >/dev/null 2>&1 ||
    fail "$c --model X --help did not print the help"
  # ...but an option's value is a value
  "$lmhost" "$c" --no-such-option >/dev/null 2>&1
  [ $? -eq 2 ] || fail "$c --no-such-option: exit $? (want 2)"
  echo "$c: $(echo $opts | wc -w) options"
done
"$lmhost" generate --model "$model" --tokens --help --max-tokens 1 >/dev/null 2>&1
[ $? -ne 0 ] || fail "generate --tokens --help took --help as a flag, not --tokens' value"

# ---- --opt=value runs as --opt value ----
a=$("$lmhost" cache-eval --cache q8 --dim 64 --vectors 200 --seed 3) || fail "cache-eval exited $?"
b=$("$lmhost" cache-eval --cache=q8 --dim=64 --vectors=200 --seed=3) || fail "cache-eval= exited $?"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "cache-eval: '--opt=v' printed '$b', '--opt v' '$a'"
a=$("$lmhost" generate --model "$model" --tokens 1,2,3 --max-tokens 6 --temperature 0.8 \
  --seed 7 --threads 2 2>/dev/null) || fail "generate exited $?"
b=$("$lmhost" generate --model="$model" --tokens=1,2,3 --max-tokens=6 --temperature=0.8 \
  --seed=7 --threads=2 2>/dev/null) || fail "generate= exited $?"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "generate: '--opt=v' printed '$b', '--opt v' '$a'"
"$lmhost" logits --model "$model" --tokens 5,6,7 --out "$tmp/a.npy" --chunk 2 2>/dev/null ||
  fail "logits exited $?"
"$lmhost" logits --model="$model" --tokens=5,6,7 --out="$tmp/b.npy" --chunk=2 2>/dev/null ||
  fail "logits= exited $?"
cmp -s "$tmp/a.npy" "$tmp/b.npy" || fail "logits: --out=F and --out F differ"
"$lmhost" generate --model "$model" --tokens=1 --tokens 2 --max-tokens 1 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--tokens=1 --tokens 2 was not refused as given twice"

# ---- progress: nothing off a terminal, a bar on one ----
"$lmhost" quantize --model "$model" --out "$tmp/q" --bits 4 2>"$tmp/err" || fail "quantize exited $?"
grep -q "quantizing" "$tmp/err" && fail "quantize drew a bar off a terminal: $(cat "$tmp/err")"
grep -q "wrote" "$tmp/err" || fail "quantize did not say what it wrote"
"$lmhost" dequantize --model "$tmp/q" --out "$tmp/d" 2>"$tmp/err" || fail "dequantize exited $?"
grep -q "dequantizing" "$tmp/err" && fail "dequantize drew a bar off a terminal"
if command -v script >/dev/null 2>&1; then
  # util-linux script: the command runs on a pseudo-terminal, its output lands in the file
  script -qec "'$lmhost' quantize --model '$model' --out '$tmp/q2' --bits 8" "$tmp/tty" \
    >/dev/null 2>&1 || fail "quantize on a terminal exited $?"
  grep -aq "quantizing e2e: .* in .*/s" "$tmp/tty" ||
    fail "quantize on a terminal drew no final line: $(cat -v "$tmp/tty")"
  LMHOST_LOG=0 script -qec "'$lmhost' quantize --model '$model' --out '$tmp/q3'" "$tmp/tty0" \
    >/dev/null 2>&1 || fail "quantize with LMHOST_LOG=0 exited $?"
  grep -aq "quantizing" "$tmp/tty0" && fail "LMHOST_LOG=0 still drew a bar"
fi
echo "PASS"
