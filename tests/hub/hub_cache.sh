#!/bin/bash
# Models by name from a Hugging Face cache laid out as huggingface_hub writes it (blobs named
# by hash, snapshots/COMMIT/* as relative links into them, refs/main), with no network:
# `list` shows it, generate by name gives the directory's tokens, @revision and a commit
# resolve, serve calls the model by its name and answers, and bad names and missing models
# fail with a clear message.
# usage: hub_cache.sh LMHOST (the model is the demo one: examples/make-demo-model.sh)
set -u
lmhost=$(realpath "$1")
tmp=$(mktemp -d)
src=$("$(dirname "$0")/../../examples/make-demo-model.sh" "$tmp/src") || exit 1
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

export HF_HOME=$tmp/hf HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9
unset HF_HUB_CACHE
repo=$HF_HOME/hub/models--Qwen--Qwen3-0.6B
commit=0123456789abcdef0123456789abcdef01234567
old=fedcba9876543210fedcba9876543210fedcba98
mkdir -p "$repo/blobs" "$repo/refs" "$repo/snapshots/$commit" "$repo/snapshots/$old"
for f in "$src"/*; do
  h=$(sha256sum "$f" | cut -c1-64)
  cp "$f" "$repo/blobs/$h"
  ln -s "../../blobs/$h" "$repo/snapshots/$commit/$(basename "$f")"
  ln -sf "../../blobs/$h" "$repo/snapshots/$old/$(basename "$f")"
done
printf '%s' "$commit" > "$repo/refs/main"
printf '%s\n' "$old" > "$repo/refs/v1"
mkdir -p "$HF_HOME/hub/models--org--half/snapshots/$commit" "$HF_HOME/hub/models--org--half/refs"
printf '%s' "$commit" > "$HF_HOME/hub/models--org--half/refs/main"

out=$("$lmhost" list) || fail "list exited $?"
echo "$out"
echo "$out" | grep -q "^Qwen/Qwen3-0.6B  *${commit:0:12} .* ready .*snapshots/$commit$" ||
  fail "list does not show Qwen/Qwen3-0.6B ready at $commit"
echo "$out" | grep -q "^org/half .* incomplete" || fail "list does not show org/half incomplete"

want=$("$lmhost" generate --model "$src" --tokens 1,2,3 --max-tokens 8 2>/dev/null) ||
  fail "generate from the directory"
for m in Qwen/Qwen3-0.6B Qwen/Qwen3-0.6B@main Qwen/Qwen3-0.6B@v1 "Qwen/Qwen3-0.6B@$commit"; do
  got=$("$lmhost" generate --model "$m" --tokens 1,2,3 --max-tokens 8 2>&1) ||
    fail "generate --model $m: $got"
  [ "$got" = "$want" ] || fail "--model $m gave $got, the directory $want"
done
got=$("$lmhost" generate --model=Qwen/Qwen3-0.6B --tokens 1,2,3 --max-tokens 8 2>&1)
[ "$got" = "$want" ] || fail "--model=NAME gave $got"

expect_error() { # name, what the message must say
  local msg
  msg=$("$lmhost" generate --model "$1" --tokens 1 --max-tokens 1 2>&1) && fail "$1 accepted"
  echo "$msg" | grep -q -- "$2" || fail "$1: '$msg' does not say '$2'"
}
expect_error Qwen/Nope "not in the Hugging Face cache"
expect_error Qwen/Qwen3-0.6B@v9 "revision 'v9' is not in the cache"
expect_error org/half "has no config.json"
expect_error "../x" "is not a model directory\|No such file\|cannot"
# an existing directory wins over a name that looks like one
mkdir -p "$tmp/cwd/Qwen" && ln -s "$src" "$tmp/cwd/Qwen/Qwen3-0.6B"
got=$(cd "$tmp/cwd" && unset HF_HOME && HF_HUB_CACHE=/nonexistent "$lmhost" generate \
  --model Qwen/Qwen3-0.6B --tokens 1,2,3 --max-tokens 8 2>&1)
[ "$got" = "$want" ] || fail "a local directory Qwen/Qwen3-0.6B was not preferred: $got"

# serve by name, offline: the model's id is its name
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$lmhost" serve --model Qwen/Qwen3-0.6B --port "$port" > "$tmp/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done
models=$(curl -sf "http://127.0.0.1:$port/v1/models") || { cat "$tmp/serve.log"; fail "no /v1/models"; }
echo "$models" | grep -q '"id": *"Qwen/Qwen3-0.6B"' || fail "/v1/models: $models"
ans=$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "Qwen/Qwen3-0.6B", "prompt": "Hello", "max_tokens": 4, "temperature": 0}') ||
  fail "completion failed"
echo "$ans" | grep -q '"completion_tokens": *4' || fail "completion: $ans"
echo "ok: hub cache"
