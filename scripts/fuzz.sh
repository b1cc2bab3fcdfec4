#!/usr/bin/env bash
# Runs every fuzz target of the module for the given time each (default 3s).
# `make fuzz-short` (part of `make test`) uses 1s per target (24 of them;
# CI must stay under 10 minutes with the servers cached), `make fuzz` a
# minute.
# Each package's instrumented test binary is built once (`go test -c
# -fuzz`) and runs each of its targets in the package's folder, as `go test
# -fuzz` would: crashers are written under the package's testdata/fuzz and
# become regression cases that plain `go test` runs from then on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime=${1:-3s}
root=$(pwd)
bin=$(mktemp -d "${TMPDIR:-/tmp}/vramguard-fuzz.XXXXXX")
trap 'rm -rf "$bin"' EXIT
cache=$(go env GOCACHE)/fuzz/$(go list -m)
total=0
built=""
while IFS= read -r line; do
	file=${line%%:*}
	name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"${line#*:}")
	dir=$(dirname "$file")
	exe=$bin/$(tr / _ <<<"$dir").test
	if [[ " $built " != *" $dir "* ]]; then
		echo "fuzz: building ./$dir"
		go test -c -fuzz "^${name}\$" -o "$exe" "./$dir"
		built="$built $dir"
	fi
	echo "fuzz: ./$dir $name for $fuzztime"
	pkgcache=$cache/$dir
	[[ $dir == . ]] && pkgcache=$cache
	run() { (cd "$root/$dir" && "$exe" -test.run '^$' -test.fuzz "^${name}\$" -test.fuzztime "$fuzztime" -test.fuzzcachedir "$pkgcache" 2>&1); }
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
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . | sed -E 's/^\.\///; s/:[0-9]+:/:/' | sort)
echo "fuzz: all targets passed, $total executions in total"
