#!/bin/sh
# One streamed chat completion with curl against a running `lmhost serve`.
# usage: examples/chat.sh "your question" [http://127.0.0.1:5413]
set -eu
url=${2:-http://127.0.0.1:5413}
body=$(printf '{"messages":[{"role":"user","content":"%s"}],"stream":true,"max_tokens":64}' "$1")
curl -sN "$url/v1/chat/completions" -H "Content-Type: application/json" \
    ${LMHOST_API_KEY:+-H "Authorization: Bearer $LMHOST_API_KEY"} -d "$body"
