#!/usr/bin/env bash
# Installs a Prometheus server for the integration test that scrapes
# vramwatch -listen and vramprom (internal/suites/integration,
# TestPrometheusScrapes): Debian's `prometheus` package (2.42 on bookworm),
# about 12 s on a fresh machine. Safe to run again: a prometheus already on
# PATH is kept. Called by `make tools`, which CI runs first (.ci/run).
#
# Usage: scripts/install-prometheus.sh
set -euo pipefail

log() { printf 'install-prometheus: %s\n' "$*" >&2; }

if command -v prometheus >/dev/null 2>&1; then
	log "$(command -v prometheus): $(prometheus --version 2>&1 | head -n 1)"
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "no prometheus on PATH and no apt-get: install Prometheus 2.x yourself (the test skips without it outside CI, and fails in CI)"
	exit 1
fi
start=$SECONDS
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if sudo -n true 2>/dev/null; then
		sudo=(sudo -n)
	else
		log "no prometheus on PATH, not root and no passwordless sudo: run apt-get install prometheus yourself"
		exit 1
	fi
fi
log "installing Debian's prometheus"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null
log "$(command -v prometheus): $(prometheus --version 2>&1 | head -n 1), installed in $((SECONDS - start))s"
