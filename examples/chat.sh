#!/bin/sh
# One streamed chat completion with curl against a running `lmhost serve`, printing the
# reply's text as it arrives (RAW=1 prints the server-sent events as they come).
# usage: examples/chat.sh "your question" [http://127.0.0.1:5413]
set -eu
url=${2:-http://127.0.0.1:5413}
msg=$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')
body=$(printf '{"messages":[{"role":"user","content":"%s"}],"stream":true,"max_tokens":96}' "$msg")
events() {
    curl -sSfN "$url/v1/chat/completions" -H "Content-Type: application/json" \
        ${LMHOST_API_KEY:+-H "Authorization: Bearer $LMHOST_API_KEY"} -d "$body"
}
if [ "${RAW:-0}" = 1 ]; then
    events
    exit
fi
# each event's "content" string, its JSON escapes for newlines, quotes and backslashes undone
events | sed -un 's/^data: .*"content":"\(\([^"\\]\|\\.\)*\)".*/\1/p' |
    while IFS= read -r piece; do
        printf '%b' "$(printf '%s' "$piece" | sed 's/\\"/"/g; s/\\\//\//g')"
    done
echo
