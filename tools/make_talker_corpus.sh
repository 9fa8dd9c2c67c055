#!/bin/sh
# Builds the tiny-chat training corpus (issue 34) from Debian packages:
# downloads them with apt-get download (no root needed), extracts them with
# dpkg-deb -x and runs tools/talker_corpus.py. Writes corpus-train.txt.xz,
# corpus-val.txt.xz and SOURCES.md (packages, versions, licences) to OUT.
#
#   tools/make_talker_corpus.sh [OUT]        OUT defaults to .train/
#
# TALKER_DEBS=DIR reuses (and fills) a folder of downloaded .deb files.
# The apt lists must be current (apt-get update) for the versions to exist.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.train}
pkgs="r-cran-janeaustenr r-cran-tokenizers gnome-user-docs debian-handbook
debian-faq jargon-text dict-devil fortunes fortunes-min wordnet-base bsdgames
python3.11-doc"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
debs=${TALKER_DEBS:-$work/debs}
mkdir -p "$debs" "$work/x"

for p in $pkgs; do
    if ! ls "$debs/${p}_"*.deb >/dev/null 2>&1; then
        (cd "$debs" && apt-get download "$p")
    fi
    mkdir -p "$work/x/$p"
    dpkg-deb -x "$(ls "$debs/${p}_"*.deb | tail -n 1)" "$work/x/$p"
done

# The helper only needs the standard library; prefer Debian's python3.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" "$root/tools/talker_corpus.py" --root "$work/x" --debs "$debs" \
    --out "$out"
ls -l "$out"
