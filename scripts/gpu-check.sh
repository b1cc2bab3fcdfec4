#!/usr/bin/env bash
# GPU proof: runs, in under five minutes, the check of
# internal/testkit/gpucheck on a machine with an NVIDIA GPU, from binaries
# built elsewhere (the GPU machine starts bare and may have no Go):
#   1. NVML and nvidia-smi on the real driver, compared with each other;
#   2. the real Ollama v0.34.4 scheduler running the stand-in llama-server,
#      which holds a known amount of device memory (cuMemAlloc) per load;
#   3. 30 rounds freeing it with UnloadModel (VerifyVRAM), EnsureFree and an
#      unload plus AwaitFree, each timed against a 10 ms NVML poll of the
#      driver (median, p95, max of the time from the unload to the memory
#      being free), and whether the memory was free when each call returned;
#   4. attribution: the holder named with its PID and model (gpu.NameRunners).
# Without a GPU it runs the same plumbing on the CPU path (server, stand-in,
# one round per mode) and reports "no NVIDIA GPU: skipped".
#
# Here, first: scripts/gpu-build.sh  (fills .gpu/, ignored by git)
# Then, with the device tool (x86-64, root, results under $OUT):
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu"], timeout_s=330)
# The repo's root must be the checkout the session was started in (the tool
# sends that one): run gpu-build.sh there. Results come back in $OUT:
# gpucheck.txt (summary), gpucheck.json (every figure), gpu-check.log (this
# script's output), ollama.log (the server's log tail), env.txt (machine,
# driver, nvidia-smi). Locally: OUT=/tmp/gpuout scripts/gpu-check.sh.
#
# GPU_CHECK_LIMIT (seconds, default 280) bounds the whole script; gpucheck's
# own budget is 70 s less, and it stops its rounds early to stay inside it.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
dir=$repo/.gpu
out=${OUT:-$repo/gpucheck-out}
limit=${GPU_CHECK_LIMIT:-280}
mkdir -p "$out"
exec > >(tee -a "$out/gpu-check.log") 2>&1

t0=$(date +%s%N)
elapsed() { echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
say() { printf 'gpu-check: [%s] %s\n' "$(elapsed)" "$*"; }

say "step 0: binaries and machine"
for f in gpucheck llama-server ollama; do
	if [ ! -x "$dir/$f" ]; then
		say "missing $dir/$f: run scripts/gpu-build.sh here and carry .gpu"
		exit 2
	fi
done
{
	echo "== uname"; uname -a
	echo "== glibc"; ldd --version 2>&1 | head -1
	echo "== build"; cat "$dir/BUILD" 2>/dev/null
	echo "== libcuda"; ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvidia-ml\.so' || echo "none in ldconfig"
	echo "== nvidia-smi"
	if command -v nvidia-smi >/dev/null 2>&1; then
		timeout 20 nvidia-smi 2>&1
		timeout 20 nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,memory.used,memory.free --format=csv 2>&1
	else
		echo "not on PATH"
	fi
} >"$out/env.txt" 2>&1
say "step 0 done: $(grep -A1 '== glibc' "$out/env.txt" | tail -1)"

budget=$((limit - 70))
say "step 1-4: gpucheck (budget ${budget}s, killed at $((limit - 30))s)"
timeout -k 10 $((limit - 30)) "$dir/gpucheck" \
	-ollama "$dir/ollama" -standin "$dir/llama-server" -out "$out" -budget "${budget}s"
rc=$?
case $rc in
0) say "gpucheck passed (see $out/gpucheck.txt)" ;;
124 | 137) say "gpucheck ran past $((limit - 30))s and was killed" ;;
*) say "gpucheck failed with status $rc (see $out/gpucheck.txt and $out/ollama.log)" ;;
esac
say "done"
exit $rc
