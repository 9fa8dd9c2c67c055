#!/bin/bash
# Downloads from a hub: lmhost against tests/hub/hub_server.py, a local HTTPS stand-in for the
# Hugging Face hub (its certificate made here and trusted through SSL_CERT_FILE; never the
# internet), serving examples/tiny-chat as org/tiny-chat. Checks: a token is required and
# never sent on to the CDN host; `pull` fetches the files lmhost reads (not README.md) into
# the cache layout huggingface_hub writes, each blob checked; the pulled model generates
# what the directory does, and `generate --model NAME` fetches a model it lacks; a
# connection cut mid-file is resumed with a Range request in the same run; a run killed
# mid-file leaves a .incomplete that the next run resumes; a corrupted file is refused and
# removed; HF_HUB_OFFLINE forbids fetching; unknown models and revisions say so.
# usage: hub_download.sh LMHOST
set -u
lmhost=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
model=$here/../../examples/tiny-chat
tmp=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  [ -f "$tmp/requests.log" ] && tail -n 20 "$tmp/requests.log"
  exit 1
}

mkdir -p "$tmp/root/org"
ln -s "$(realpath "$model")" "$tmp/root/org/tiny-chat"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null || fail "openssl req"

start() { # server options...
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -f "$tmp/port"
  python3 "$here/hub_server.py" --root "$tmp/root" --cert "$tmp/cert.pem" --key "$tmp/key.pem" \
    --port-file "$tmp/port" --log "$tmp/requests.log" "$@" &
  server=$!
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  [ -s "$tmp/port" ] || fail "the hub stand-in did not start"
  export HF_ENDPOINT=https://127.0.0.1:$(cat "$tmp/port")
}
fresh_cache() { rm -rf "$tmp/hf" && export HF_HOME=$tmp/hf; }
export SSL_CERT_FILE=$tmp/cert.pem LMHOST_LOG=1
unset HF_HUB_CACHE HF_HUB_OFFLINE HF_TOKEN HF_TOKEN_PATH
repo=$tmp/hf/hub/models--org--tiny-chat
want=$("$lmhost" generate --model "$model" --tokens 6812,14,1220 --max-tokens 8 2>/dev/null) ||
  fail "generate from the directory"

# 1. a token is required: without one the pull fails and says so
start --token s3cret
fresh_cache
msg=$("$lmhost" pull org/tiny-chat 2>&1) && fail "pull without a token succeeded"
echo "$msg" | grep -q "HF_TOKEN" || fail "no hint at HF_TOKEN: $msg"

# 2. pull with the token (from huggingface-cli login's file), a connection cut mid-file:
# resumed in the same run with a Range request; the CDN host never sees the token
start --token s3cret --cut-after 3000000
printf 's3cret\n' > "$tmp/token"
: > "$tmp/requests.log"
export HF_TOKEN_PATH=$tmp/token
dir=$("$lmhost" pull org/tiny-chat 2> "$tmp/pull.err") ||
  { cat "$tmp/pull.err"; fail "pull"; }
cat "$tmp/pull.err"
grep -q "GET /cdn/.* range=bytes=3000000- " "$tmp/requests.log" ||
  fail "the cut download was not resumed at byte 3000000"
grep -q LEAK "$tmp/requests.log" && fail "the token was sent on to the CDN host"
commit=$(cat "$repo/refs/main") || fail "no refs/main"
[ "$dir" = "$repo/snapshots/$commit" ] || fail "pull printed $dir"
for f in config.json generation_config.json model.safetensors tokenizer.json \
  tokenizer_config.json; do
  [ -L "$dir/$f" ] || fail "$f is not a link in the snapshot"
  case $(readlink "$dir/$f") in ../../blobs/*) ;; *) fail "$f links to $(readlink "$dir/$f")" ;; esac
  cmp -s "$dir/$f" "$model/$f" || fail "$f differs from the original"
done
h=$(sha256sum "$model/model.safetensors" | cut -c1-64)
[ -f "$repo/blobs/$h" ] || fail "the weights' blob is not named by its SHA-256"
[ -e "$dir/README.md" ] && fail "README.md was fetched (lmhost does not read it)"
ls "$repo/blobs" | grep -q incomplete && fail "a .incomplete file was left"
got=$("$lmhost" generate --model org/tiny-chat --tokens 6812,14,1220 --max-tokens 8 2>&1)
[ "$got" = "$want" ] || fail "the pulled model gave $got, the directory $want"
"$lmhost" pull org/tiny-chat --quiet --all > /dev/null 2>&1 || fail "pull --all"
[ -e "$dir/README.md" ] || fail "pull --all did not fetch README.md"
[ "$(grep -c "GET /cdn" "$tmp/requests.log")" -eq 2 ] ||
  fail "a second pull fetched the weights again"
unset HF_TOKEN_PATH

# 3. a run killed mid-file leaves a .incomplete; the next run resumes it
start --stall-after 5000000
fresh_cache
timeout 4 "$lmhost" pull org/tiny-chat --quiet > /dev/null 2>&1 && fail "the stalled pull finished"
part=$(ls "$repo"/blobs/*.incomplete 2>/dev/null | head -n 1)
[ -n "$part" ] || fail "no .incomplete after an interrupted pull"
[ "$(stat -c %s "$part")" -eq 5000000 ] || fail "the .incomplete holds $(stat -c %s "$part") bytes"
start
: > "$tmp/requests.log"
"$lmhost" pull org/tiny-chat --quiet > /dev/null 2> "$tmp/pull.err" ||
  { cat "$tmp/pull.err"; fail "the resumed pull"; }
grep -q "GET /cdn/.* range=bytes=5000000- " "$tmp/requests.log" ||
  fail "the second run did not resume at byte 5000000"
cmp -s "$repo/snapshots/$commit/model.safetensors" "$model/model.safetensors" ||
  fail "the resumed file differs"

# 4. a corrupted file is refused and removed, and nothing links to it
start --corrupt
fresh_cache
msg=$("$lmhost" pull org/tiny-chat --quiet 2>&1) && fail "a corrupted download was accepted"
echo "$msg" | grep -q "refused: its SHA-256 is" || fail "corruption not named: $msg"
[ -z "$(ls "$repo"/blobs/ 2>/dev/null | grep -v -e '^[0-9a-f]\{40\}$')" ] ||
  fail "the corrupted weights were kept: $(ls "$repo/blobs")"
[ -e "$repo/refs/main" ] && fail "refs/main written for an incomplete model"

# 5. generate by name fetches what the cache lacks; offline it may not
start
fresh_cache
HF_HUB_OFFLINE=1 "$lmhost" generate --model org/tiny-chat --tokens 1 --max-tokens 1 \
  > /dev/null 2> "$tmp/err" && fail "HF_HUB_OFFLINE fetched"
grep -q "HF_HUB_OFFLINE" "$tmp/err" || fail "offline error: $(cat "$tmp/err")"
got=$("$lmhost" generate --model org/tiny-chat --tokens 6812,14,1220 --max-tokens 8 2>/dev/null)
[ "$got" = "$want" ] || fail "generate by name (fetched) gave $got"

# 6. unknown models and revisions, an untrusted certificate
msg=$("$lmhost" pull org/nope --quiet 2>&1) && fail "org/nope pulled"
echo "$msg" | grep -q "not on the hub at revision 'main' (404)" || fail "unknown model: $msg"
msg=$("$lmhost" pull org/tiny-chat@v9 --quiet 2>&1) && fail "@v9 pulled"
echo "$msg" | grep -q "revision 'v9'" || fail "unknown revision: $msg"
msg=$(SSL_CERT_FILE=/dev/null "$lmhost" pull org/tiny-chat --quiet 2>&1) &&
  fail "an untrusted certificate was accepted"
echo "$msg" | grep -q "not trusted" || fail "untrusted certificate: $msg"
echo "ok: hub downloads"
