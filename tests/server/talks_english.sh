#!/bin/bash
# The README's serve command on the shipped default model (examples/tiny-chat): a chat completion answers in English.
# English here: at least 5 words, and at least 80% of them words of the American English
# dictionary (wamerican), judged over three greedy answers to different messages.
# usage: talks_english.sh LMHOST MODEL_DIR
set -u
lmhost=$1
model=$2
dict=/usr/share/dict/words
[ -r "$dict" ] || { echo "FAIL: $dict missing (Debian package wamerican)"; exit 1; }
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$lmhost" serve --model "$model" --port "$port" > "$tmp/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 150); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done
total=0 known=0
for msg in "Hello! Who are you?" "What does the word harbor mean?" "Tell me something interesting."; do
  body=$(printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":64,"temperature":0}' "$msg")
  ans=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "$body" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])') ||
    { cat "$tmp/serve.log"; echo "FAIL: no answer to '$msg'"; exit 1; }
  echo "> $msg"
  echo "$ans"
  words=$(echo "$ans" | tr -c "A-Za-z'\n" ' ' | tr ' ' '\n' | sed "s/^'*//; s/'*$//" | grep -v '^$')
  n=$(echo "$words" | grep -c .)
  k=$(echo "$words" | grep -cixFf "$dict")
  echo "  ($k of $n words in the dictionary)"
  total=$((total + n)) known=$((known + k))
done
[ "$total" -ge 5 ] || { echo "FAIL: only $total words"; exit 1; }
[ $((known * 100)) -ge $((total * 80)) ] || { echo "FAIL: $known of $total words are English"; exit 1; }
echo "ok: $known of $total words English"
