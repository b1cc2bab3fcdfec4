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
# cannot: outside CI a missing Prometheus is a warning (its test skips,
# saying so); in CI (.ci/run sets CI=true) it is a failure.
cannot() {
	log "$*"
	[ "${CI:-}" = true ] && exit 1
	log "going on without it: TestPrometheusScrapes will skip"
	exit 0
}

if command -v prometheus >/dev/null 2>&1; then
	log "$(command -v prometheus): $(prometheus --version 2>&1 | head -n 1)"
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	cannot "no prometheus on PATH and no apt-get: install Prometheus 2.x yourself"
fi
start=$SECONDS
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if sudo -n true 2>/dev/null; then
		sudo=(sudo -n)
	else
		cannot "no prometheus on PATH, not root and no passwordless sudo: run apt-get install prometheus yourself"
	fi
fi
log "installing Debian's prometheus"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null
log "$(command -v prometheus): $(prometheus --version 2>&1 | head -n 1), installed in $((SECONDS - start))s"
