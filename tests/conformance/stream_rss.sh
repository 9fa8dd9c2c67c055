#!/usr/bin/env bash
# A model whose experts are many times the budget stays within the budget when its experts
# are streamed: a random Qwen3-MoE-shaped model (4 layers of 64 experts of 512 x 1024, MLX
# 4-bit: 216 MiB of experts, 11 MiB of everything else) generates 48 sampled tokens after a
# 32-token prompt with --expert-cache-mb 16, and the process's peak resident memory (as the
# kernel counts it for the child: mapped file pages touched included) must stay within
#   budget + the other weights + 32 MiB (the process itself, its plugins, scratch and the
#   read staging, which holds at most one layer's share of the budget).
# The same run with the experts loaded must go past that bound, or the test proves nothing.
# usage: stream_rss.sh LMHOST MAKE_RANDOM_MODEL_PY
set -u
lmhost=$1 maker=$2
# a sanitizer's shadow memory and quarantine are not the host's to bound
[ -n "${ASAN_OPTIONS:-}" ] && { echo "SKIP: under ASan"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$maker" "$tmp/m" --preset qwen3-30b-a3b --layers 4 --set hidden_size=512 \
    moe_intermediate_size=1024 num_experts=64 num_experts_per_tok=4 vocab_size=2000 --mlx 4 \
    >/dev/null || { echo "FAIL: making the model"; exit 1; }
exec python3 - "$lmhost" "$tmp/m" <<'EOF'
import os, re, resource, subprocess, sys
lmhost, model = sys.argv[1], sys.argv[2]
budget_mb, overhead_mb = 16, 32
prompt = ",".join(str((i * 7919 + 13) % 2000) for i in range(32))

def peak(extra):
    """Peak resident MiB of one generate run, measured by a fresh wrapper process (whose
    RUSAGE_CHILDREN then holds that run alone) and its log."""
    cmd = [lmhost, "generate", "--model", model, "--tokens", prompt, "--max-tokens", "48",
           "--temperature", "1", "--seed", "7", "--ignore-eos"] + extra
    wrap = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
            "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode,"
            " file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", wrap] + cmd, capture_output=True, text=True,
                       env=dict(os.environ, LMHOST_LOG="2"))
    m = re.search(r"maxrss (\d+) (-?\d+)", r.stderr)
    if not m or m.group(2) != "0":
        print(r.stderr)
        sys.exit("FAIL: " + " ".join(cmd))
    return int(m.group(1)) / 1024.0, r.stderr

size = os.path.getsize(os.path.join(model, "model.safetensors")) / 2**20
stream, log = peak(["--stream-experts", f"--expert-cache-mb={budget_mb}"])
m = re.search(r"streaming \d+ expert weights \(([0-9.]+) MiB\)", log)
if not m:
    sys.exit("FAIL: no streaming reported: " + log)
experts = float(m.group(1))
dense = size - experts
bound = budget_mb + dense + overhead_mb
loaded, _ = peak([])
print(f"experts {experts:.1f} MiB ({experts / budget_mb:.1f} x the {budget_mb} MiB budget), "
      f"other weights {dense:.1f} MiB; peak resident: streamed {stream:.1f} MiB, "
      f"loaded {loaded:.1f} MiB; bound {bound:.1f} MiB")
if stream > bound:
    sys.exit("FAIL: the streamed run went past budget + other weights + overhead")
if loaded <= bound:
    sys.exit("FAIL: the loaded run stayed within the bound too: the test cannot tell them apart")
print("PASS")
EOF
