#!/usr/bin/env bash
# Runs every fuzz target of the module for the given time each (default 3s).
# `make fuzz-short` (part of `make test`) uses 2s, `make fuzz` a minute.
# Crashers are written by `go test` under the package's testdata/fuzz and
# become regression cases that plain `go test` runs from then on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime=${1:-3s}
total=0
while IFS= read -r line; do
	file=${line%%:*}
	name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"${line#*:}")
	pkg=./$(dirname "$file")
	echo "fuzz: $pkg $name for $fuzztime"
	run() { go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" 2>&1; }
	if ! out=$(run); then
		# Go's fuzzer can end with "context deadline exceeded" and no failing
		# input when one execution outlasts -fuzztime; that is retried once.
		# A real failure writes its input to testdata/fuzz and fails again.
		if grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input written' <<<"$out"; then
			echo "fuzz: $name hit the fuzzer's deadline; running it again"
			out=$(run) || { echo "$out"; echo "fuzz: $name FAILED"; exit 1; }
		else
			echo "$out"
			echo "fuzz: $name FAILED"
			exit 1
		fi
	fi
	execs=$(grep -oE 'execs: [0-9]+' <<<"$out" | tail -1 | grep -oE '[0-9]+' || echo 0)
	total=$((total + execs))
	echo "fuzz: $name ok, $execs executions"
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . | sed -E 's/^\.\///; s/:[0-9]+:/:/')
echo "fuzz: all targets passed, $total executions in total"
