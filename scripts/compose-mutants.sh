#!/usr/bin/env bash
# The composition oracle's mutation check: each patch in
# testdata/compose-mutants switches off one guarantee of features in pairs
# (room-making on the device asked for; a phase's models held for the
# client's other phases and guards; others' reservations kept out of every
# admission, or out of a budget's); the CI sweep (N schedules, default the
# CI's 100, fresh seeds) must find a violation with it. Each mutant runs in
# a copy of the working tree (files git does not ignore), never in the
# checkout; a patch that no longer applies fails the check.
#
# Usage: scripts/compose-mutants.sh [N]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/mutant-tree.sh"
n=${1:-100}
status=0
for patch in "$repo"/testdata/compose-mutants/*.patch; do
	name=$(basename "$patch" .patch)
	tmp=$(mutant_tree "$repo" "$patch") || exit 1
	trap 'rm -rf "$tmp"' EXIT
	start=$(date +%s)
	log="$tmp/compose.log"
	(cd "$tmp" && go test -count=1 -run 'TestCompose$' -v . -compose.n "$n") >"$log" 2>&1 || true
	if ! grep -q -- '--- ' "$log"; then
		echo "compose-mutants: $name: the sweep did not run:" >&2
		tail -20 "$log" >&2
		exit 1
	fi
	if grep -q 'VIOLATION' "$log"; then
		seed=$(grep -oE 'seed [0-9]+ failed' "$log" | head -1)
		played=$(grep -cE '^    --- (PASS|FAIL): TestCompose/' "$log" || true)
		echo "compose-mutants: $name: found ($seed, after $played of $n schedules, $(( $(date +%s) - start ))s)"
		grep 'VIOLATION' "$log" | sort | uniq -c | sort -rn | head -3 | sed 's/^/  /'
	else
		echo "compose-mutants: $name: not found in $n schedules" >&2
		status=1
	fi
	rm -rf "$tmp"
	trap - EXIT
done
exit $status
