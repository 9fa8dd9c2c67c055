#!/bin/sh
# Installs what lmhost builds and tests with, from Debian packages (Debian 12).
# Runs apt-get as root, or through sudo when not root.
set -eu
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
# haproxy: the haproxy-replicas test (tests/deploy)
PKGS="build-essential meson ninja-build pkg-config clang libclang-rt-14-dev
      libltdl-dev libjson-c-dev libpcre2-dev libutf8proc-dev
      libevent-dev libssl-dev openssl curl python3 wamerican
      libvulkan-dev mesa-vulkan-drivers vulkan-validationlayers glslang-tools
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user ca-certificates
      haproxy"
missing=
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
# Node.js and npm (tokenizer fixtures, the openai client tests): take the machine's own
# when present (it may come from another repository than Debian's), else Debian's.
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
