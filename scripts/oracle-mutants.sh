#!/usr/bin/env bash
# The race oracle's mutation check: each patch in
# internal/suites/oracle/testdata/mutants breaks one guarantee of the unload
# (the runner-process check, the resend of a lost unload); the oracle's sweep
# must find a violation with it on at least two server versions. Each mutant
# runs in a copy of the working tree (files git does not ignore), never in
# the checkout. A patch that no longer applies fails the
# check: the code it breaks moved, and the mutant must follow it.
#
# Usage: scripts/oracle-mutants.sh [BUDGET [RACE]]   (default 60s per version,
# -race on; RACE=norace turns the race detector off). The CI sweep's 25 s
# found the no-resend mutant on no version in one of two runs at 2c851e7:
# the mutation check gets a minute.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/mutant-tree.sh"
budget=${1:-60s}
race=-race
[ "${2:-}" = norace ] && race=
status=0
for patch in "$repo"/internal/suites/oracle/testdata/mutants/*.patch; do
	name=$(basename "$patch" .patch)
	tmp=$(mutant_tree "$repo" "$patch") || exit 1
	trap 'rm -rf "$tmp"' EXIT
	start=$(date +%s)
	log="$tmp/oracle.log"
	(cd "$tmp" && go test $race -count=1 -run 'TestOracle$' -v -parallel 4 -timeout 30m ./internal/suites/oracle \
		-oracle.budget "$budget" -oracle.sim=false -oracle.failfast) >"$log" 2>&1 || true
	if ! grep -q -- '--- ' "$log"; then
		echo "oracle-mutants: $name: the sweep did not run:" >&2
		tail -20 "$log" >&2
		exit 1
	fi
	found=$(grep -E 'oracle: [0-9]+ violations on ollama' "$log" | sed -E 's/^ *oracle_test.go:[0-9]+: //' || true)
	versions=$(printf '%s\n' "$found" | grep -c 'violations on ollama' || true)
	echo "oracle-mutants: $name: found on $versions version(s) in $(( $(date +%s) - start ))s"
	printf '%s\n' "$found" | sed 's/^/  /'
	grep -E '^\s+(verified-but-resident|gave-up-on-idle-model|close-left-resident|left-resident|[a-z-]+): ' "$log" | sort | uniq -c | sort -rn | head -5 | sed 's/^/  /' || true
	if [ "$versions" -lt 2 ]; then
		echo "oracle-mutants: $name: found on fewer than two versions" >&2
		status=1
	fi
	rm -rf "$tmp"
	trap - EXIT
done
exit $status
