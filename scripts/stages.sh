#!/usr/bin/env bash
# Runs the given make targets in order, printing how long each took, and
# stops at the first that fails. `make test` uses it so that every run,
# CI's included, shows where its time went.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
summary=()
for target in "$@"; do
	t0=$(date +%s)
	echo "stage $target: start"
	if ! ${MAKE:-make} --no-print-directory "$target"; then
		echo "stage $target: FAILED after $(($(date +%s) - t0))s"
		exit 1
	fi
	summary+=("$target $(($(date +%s) - t0))s")
	echo "stage $target: done in $(($(date +%s) - t0))s"
done
echo "stages: ${summary[*]}; total $(($(date +%s) - start))s"
