#!/bin/sh
# Cross-compiles the CPU kernel tests for aarch64 and runs them under qemu user-mode
# emulation, so the NEON table is checked on x86-64 hosts (CI installs
# gcc-aarch64-linux-gnu and qemu-user). test_kernels checks every table the target has
# (neon and portable) against the reference and against each other; test_qkernels does the
# same for the quantized (MLX affine) tables, test_q8 for fast mode's int8 kernels (with and
# without the dot-product extension), test_recurrent for the recurrent ops' loops.
# Exit status: 0 when all pass, 1 on a failure, 77 (meson's "skipped") without tools.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src="$root/backends/cpu"
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-}
if [ -z "$QEMU" ]; then
    for q in qemu-aarch64 qemu-aarch64-static; do
        if command -v "$q" >/dev/null 2>&1; then QEMU=$q; break; fi
    done
fi
if ! command -v "$CC" >/dev/null 2>&1 || [ -z "$QEMU" ]; then
    echo "run_neon_qemu.sh: needs $CC and qemu-aarch64 (gcc-aarch64-linux-gnu, qemu-user)" >&2
    exit 77
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM

flags="-std=c11 -D_GNU_SOURCE -Wall -Wextra -O2 -static -I$src"
kernels="$src/kernels_portable.c $src/kernels_select.c $src/kernels_neon.c"
# shellcheck disable=SC2086 # word splitting of the flag and file lists is wanted
$CC $flags -o "$out/test_kernels" "$here/test_kernels.c" $kernels -lm -lpthread
# shellcheck disable=SC2086
$CC $flags -o "$out/test_qkernels" "$here/test_qkernels.c" $kernels \
    "$src/qkernels_portable.c" "$src/qkernels_neon.c" -lm -lpthread
# fast mode's int8 kernels: neon-i8 (widening multiplies) on plain ARMv8-A, and neon-dot-i8
# (sdot) next to it when built for ARMv8.2-A with the dot-product extension
for arch in armv8-a armv8.2-a+dotprod; do
    # shellcheck disable=SC2086
    $CC $flags -march=$arch -o "$out/test_q8-$arch" "$here/test_q8.c" $kernels \
        "$src/qkernels_portable.c" "$src/qkernels_neon.c" "$src/threadpool.c" -lm -lpthread
done
# shellcheck disable=SC2086
$CC $flags -o "$out/test_threadpool" "$here/test_threadpool.c" "$src/threadpool.c" -lpthread
# shellcheck disable=SC2086
$CC $flags -I"$root/abi" -o "$out/test_recurrent" "$here/test_recurrent.c" "$src/recurrent.c" \
    $kernels -lm -lpthread
# the backend's attention op, the backend linked in (no dlopen in a static binary)
# shellcheck disable=SC2086
$CC $flags -DLMHOST_ATTN_STATIC -I"$root/abi" -I"$root/backends/common" \
    -o "$out/test_attention" "$here/test_attention.c" "$src/cpu_backend.c" "$src/threadpool.c" \
    "$src/recurrent.c" "$src/qkernels_portable.c" "$src/qkernels_neon.c" $kernels -lm -lpthread
# the TurboQuant cache's codec and decode attention (its NEON helpers and portable loops)
tq="$root/plugins/cache-turboquant"
$CC $flags -I"$root/abi" -I"$tq" -o "$out/test_tq_codec" "$root/tests/cache/test_tq_codec.c" -lm
$CC $flags -I"$root/abi" -I"$tq" -o "$out/test_tq_attend" "$root/tests/cache/test_tq_attend.c" -lm

status=0
log="$out/test_kernels.log"
if "$QEMU" "$out/test_kernels" >"$log" 2>&1; then :; else status=1; fi
cat "$log"
# The run must really have had the NEON table next to the portable one.
if ! grep -q '^tables: portable neon' "$log"; then
    echo "run_neon_qemu.sh: the neon table was not tested" >&2
    status=1
fi
qlog="$out/test_qkernels.log"
if "$QEMU" "$out/test_qkernels" >"$qlog" 2>&1; then :; else status=1; fi
cat "$qlog"
if ! grep -q '^neon: checked' "$qlog"; then
    echo "run_neon_qemu.sh: the neon quantized table was not tested" >&2
    status=1
fi
for arch in armv8-a armv8.2-a+dotprod; do
    q8log="$out/test_q8-$arch.log"
    if "$QEMU" -cpu max "$out/test_q8-$arch" >"$q8log" 2>&1; then :; else status=1; fi
    cat "$q8log"
    want='^neon-i8: checked'
    [ "$arch" = armv8-a ] || want='^neon-dot-i8: checked'
    if ! grep -q "$want" "$q8log"; then
        echo "run_neon_qemu.sh: the fast-mode kernel for $arch was not tested" >&2
        status=1
    fi
done
if "$QEMU" "$out/test_threadpool"; then :; else status=1; fi
# the recurrent ops' loops on the neon table (and the portable one) against their model
if "$QEMU" "$out/test_recurrent"; then :; else status=1; fi
alog="$out/test_attention.log"
if "$QEMU" "$out/test_attention" >"$alog" 2>&1; then :; else status=1; fi
grep -E '^(ok .*\[neon\]|FAIL|[0-9]+ paths)' "$alog"
if ! grep -q '\[neon\]' "$alog"; then
    echo "run_neon_qemu.sh: the neon attention was not tested" >&2
    status=1
fi
if "$QEMU" "$out/test_tq_codec" >"$out/tq_codec.log" 2>&1; then :; else status=1; fi
tail -1 "$out/tq_codec.log"
tlog="$out/test_tq_attend.log"
if "$QEMU" "$out/test_tq_attend" >"$tlog" 2>&1; then :; else status=1; fi
if LMHOST_DEBUG=simd=portable "$QEMU" "$out/test_tq_attend" >>"$tlog" 2>&1; then :; else status=1; fi
grep -E '^(path|FAIL)|^ok$|FAILED' "$tlog"
if ! grep -q '^path: neon' "$tlog"; then
    echo "run_neon_qemu.sh: the TurboQuant NEON path was not tested" >&2
    status=1
fi

if [ "$status" -eq 0 ]; then echo "NEON under qemu: pass"; else echo "NEON under qemu: FAIL"; fi
exit "$status"
