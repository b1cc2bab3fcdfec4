#!/usr/bin/env bash
# Builds and caches the Ollama servers that vramguard's integration tests run
# (internal/testkit/ollamatest), installing the Debian packages newer versions need.
#
# Usage: scripts/install-ollama.sh [VERSION...]
#
# Versions default to $VRAMGUARD_OLLAMA_VERSIONS, else
# "0.6.5,0.17.4,0.24.0,0.34.4".
# Binaries go to $VRAMGUARD_OLLAMA_CACHE/<version>/ollama, default
# ${XDG_CACHE_HOME:-$HOME/.cache}/vramguard/ollama/<version>/ollama: the same
# place the Go harness looks, so `go test` finds them. Safe to run again: a
# cached version is not rebuilt (delete its folder to force a rebuild), and a
# lock file shared with the Go harness keeps parallel builds apart.
#
# A cold build takes minutes (v0.17.4 and v0.24.0 compile llama.cpp and ggml
# with cgo). Versions 0.7 to 0.29 need nlohmann-json3-dev and libstb-dev (Go
# module zips drop llama.cpp's vendor/ folder) and the miniaudio stand-in
# header kept in internal/testkit/ollamatest/cshim (copied to <cache>/<version>/cshim,
# where the Go harness also writes it, so both build with identical flags).
# From 0.30 Ollama has no engine of its own: it runs llama.cpp's llama-server,
# which the tests replace with internal/testkit/standin (the Go harness provides it).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shim="$repo/internal/testkit/ollamatest/cshim"
cache=${VRAMGUARD_OLLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vramguard/ollama}

if [ $# -gt 0 ]; then
	versions=("$@")
else
	IFS=',' read -r -a versions <<<"${VRAMGUARD_OLLAMA_VERSIONS:-0.6.5,0.17.4,0.24.0,0.34.4}"
fi

log() { printf 'install-ollama: %s\n' "$*" >&2; }

# needs_shim VERSION: true for versions 0.7 to 0.29 (vendored llama.cpp).
needs_shim() {
	local major minor
	IFS=. read -r major minor _ <<<"$1"
	[ "$major" -eq 0 ] && [ "$minor" -ge 7 ] && [ "$minor" -lt 30 ]
}

install_packages() {
	local pkgs=(nlohmann-json3-dev libstb-dev) missing=() p
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if ! command -v apt-get >/dev/null; then
		if [ -f /usr/include/nlohmann/json_fwd.hpp ] && [ -f /usr/include/stb/stb_image.h ]; then
			return 0
		fi
		log "need the nlohmann/json and stb headers (Debian: ${missing[*]}); install them and rerun"
		exit 1
	fi
	local sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	log "installing ${missing[*]}"
	"${sudo[@]}" apt-get update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

build() {
	local v=$1 dir="$cache/$1" start tmp
	local bin="$dir/ollama"
	if [ -x "$bin" ]; then
		printf 'ollama %s: %s (cached)\n' "$v" "$bin"
		return 0
	fi
	mkdir -p "$dir"
	# The same lock the Go harness takes (flock(2) on <dir>/.lock).
	exec 9>"$dir/.lock"
	flock 9
	if [ -x "$bin" ]; then
		exec 9>&-
		printf 'ollama %s: %s (built by another process)\n' "$v" "$bin"
		return 0
	fi
	local env=(GOBIN= CGO_ENABLED=1 GOWORK=off GOFLAGS=-buildvcs=false)
	if needs_shim "$v"; then
		install_packages
		# Copy the header where the Go harness writes its embedded copy, so
		# both build with the same flags and share Go's build cache.
		mkdir -p "$dir/cshim/miniaudio"
		cp "$shim/miniaudio/miniaudio.h" "$dir/cshim/miniaudio/miniaudio.h"
		env+=("CGO_CPPFLAGS=${CGO_CPPFLAGS:+$CGO_CPPFLAGS }-I$dir/cshim")
	fi
	tmp=$(mktemp -d "$dir/.build-XXXXXX")
	env[0]="GOBIN=$tmp"
	log "building ollama $v (go install github.com/ollama/ollama@v$v; log in $dir/build.log)"
	start=$(date +%s)
	if ! (cd "$tmp" && env "${env[@]}" go install "github.com/ollama/ollama@v$v") >"$dir/build.log" 2>&1; then
		tail -n 40 "$dir/build.log" >&2
		rm -rf "$tmp"
		exec 9>&-
		log "building ollama $v failed"
		return 1
	fi
	mv "$tmp/ollama" "$bin"
	rm -rf "$tmp"
	exec 9>&-
	printf 'ollama %s: %s (built in %ss)\n' "$v" "$bin" "$(($(date +%s) - start))"
}

command -v go >/dev/null || { log "the go command is required"; exit 1; }
status=0
for v in "${versions[@]}"; do
	v=${v#v}
	v=${v// /}
	[ -n "$v" ] || continue
	if ! [[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]]; then
		log "bad version $v"
		exit 2
	fi
	build "$v" || status=1
done
exit $status
