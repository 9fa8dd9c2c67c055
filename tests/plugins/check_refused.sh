#!/usr/bin/env bash
# lmhost plugins --plugin-dir DIR with seven broken plugins: each is refused with a message
# naming its file and the reason, and the good plugins are still listed.
# usage: check_refused.sh LMHOST DIR
set -u
out=$("$1" plugins --plugin-dir "$2" 2>/dev/null)
rc=$?
fails=0
want() {
    if ! grep -qE -- "$1" <<<"$out"; then
        echo "FAIL: no line matching: $1"
        fails=$((fails + 1))
    fi
}
[ $rc -eq 0 ] || { echo "FAIL: exit $rc"; fails=$((fails + 1)); }
want "refused .*lmhost-test-bad-major\.so: plugin ABI 2\.0, host ABI 1\.[0-9]+ \(major versions differ\)"
want "refused .*lmhost-test-newer-minor\.so: built for plugin ABI 1\.[0-9]+, newer than this host's 1\.[0-9]+"
want "refused .*lmhost-test-no-entry\.so: missing entry symbol lmhost_plugin_entry"
want "refused .*lmhost-test-fail-init\.so: init failed: needs hardware this machine lacks"
want "refused .*lmhost-test-bad-table\.so: backend table lacks required functions"
want "refused .*lmhost-test-bad-toolcall\.so: toolcall table lacks required functions"
want "refused .*lmhost-test-old-toolcall\.so: tool-call plugins came with plugin ABI 1\.13"
want "^backend cpu "
want "^cache plain "
want "model types: .*qwen3"
want "^toolcall hermes "
want "formats: mistral, mistral-v11"
echo "$out"
exit $((fails > 0))
