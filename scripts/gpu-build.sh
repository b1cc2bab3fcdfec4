#!/usr/bin/env bash
# Builds here, for scripts/gpu-check.sh on a GPU machine that has no Go, the
# three programs it runs, into .gpu/ (ignored by git, carried by the device
# tool):
#   .gpu/gpucheck      internal/testkit/gpucheck (cgo: NVML)
#   .gpu/llama-server  the stand-in llama-server (cgo: the CUDA driver API,
#                      opened at run time; no CUDA toolkit needed here)
#   .gpu/ollama        the cached Ollama v0.34.4 build, stripped
# and checks that they fit the device tool's 64 MiB (working tree included).
#
# Usage: scripts/gpu-build.sh   (then see scripts/gpu-check.sh)
# The Ollama binary comes from $VRAMGUARD_OLLAMA_BIN, else the cache that
# scripts/install-ollama.sh fills ($VRAMGUARD_OLLAMA_CACHE or
# ~/.cache/vramguard/ollama)/0.34.4/ollama; build it with
# `scripts/install-ollama.sh 0.34.4`. The binaries are x86-64 Linux, linked
# against this machine's glibc (Debian 12: 2.36; they need GLIBC_2.34).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
dir=.gpu
version=0.34.4
cache=${VRAMGUARD_OLLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vramguard/ollama}
ollama=${VRAMGUARD_OLLAMA_BIN:-$cache/$version/ollama}
limit=$((64 << 20))

log() { printf 'gpu-build: %s\n' "$*" >&2; }

if [ "$(uname -m)" != x86_64 ]; then
	log "this machine is $(uname -m); the GPU machine is x86-64: build there or on x86-64"
	exit 1
fi
if [ ! -x "$ollama" ]; then
	log "no Ollama $version binary at $ollama: run scripts/install-ollama.sh $version (or set VRAMGUARD_OLLAMA_BIN)"
	exit 1
fi

mkdir -p "$dir"
export CGO_ENABLED=1 GOWORK=off
flags=(-trimpath -ldflags='-s -w')
go build "${flags[@]}" -o "$dir/gpucheck" ./internal/testkit/gpucheck
go build "${flags[@]}" -o "$dir/llama-server" ./internal/testkit/standin/llama-server
if command -v strip >/dev/null 2>&1; then
	strip -o "$dir/ollama" "$ollama"
else
	cp "$ollama" "$dir/ollama"
fi
chmod 755 "$dir"/gpucheck "$dir"/llama-server "$dir"/ollama
{
	echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
	echo "built $(date -u +%FT%TZ) with $(go version) on $(ldd --version 2>&1 | head -1)"
	echo "ollama $version from $ollama"
} >"$dir/BUILD"

# What travels: tracked files, untracked files git does not ignore, and .gpu.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
carried=$(du -cb "$dir" | tail -1 | cut -f1)
total=$((tree + carried))
ls -l "$dir" >&2
log "carried $((carried >> 20)) MiB (.gpu) + working tree $((tree >> 20)) MiB = $((total >> 20)) MiB of 64 MiB"
if [ "$total" -ge "$limit" ]; then
	log "too big for the device tool"
	exit 1
fi
log "ready: device tool run with carry [\".gpu\"], command \"bash scripts/gpu-check.sh\", timeout_s 330"
