#!/usr/bin/env bash
# Runs the real-server tests (make test-integration) and, once, the failed
# top-level tests whose output says their server died of a crash known to
# be Ollama's own: the /api/ps data race of v0.6.5 to v0.32.3 ("fatal
# error: concurrent map iteration and map write", ollama/ollama#17376,
# fixed in v0.32.4; README, known server issues). Every verified unload
# polls /api/ps, so a few hundred of them on a busy machine meet it now and
# then. The harness logs ollamatest.CrashMarker for such a death and
# restarts the server; internal/tools/rerun excuses a failed test only when
# its own output carries that line, and anything else fails the stage as
# before. The second run must pass; both runs' output is printed.
#
# Usage: scripts/test-integration.sh GO_TEST_FLAGS... PACKAGES...
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
go=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$go" build -o "$tmp/rerun" ./internal/tools/rerun || exit 1

"$go" test -json "$@" 2>&1 | "$tmp/rerun" -plan "$tmp/plan"
codes=("${PIPESTATUS[@]}")
test_rc=${codes[0]} judge_rc=${codes[1]}
if [ "$test_rc" -eq 0 ] && [ "$judge_rc" -eq 0 ]; then
	exit 0
fi
if [ "$judge_rc" -ne 3 ]; then
	# A failure that is not a known crash, or go test failed in a way the
	# stream did not show (the judge saw nothing fail): the stage fails.
	[ "$judge_rc" -eq 0 ] && echo "test-integration: go test exited $test_rc"
	exit 1
fi

# Flags for the rerun: the caller's, without the package list and any -run.
flags=()
for a in "$@"; do
	case $a in
	./* | github.com/*) ;;
	-run=*) ;;
	*) flags+=("$a") ;;
	esac
done
rc=0
while IFS=$'\t' read -r pkg pattern; do
	echo "test-integration: again after a known server crash: $pkg -run '$pattern'"
	if ! "$go" test "${flags[@]}" -v -run "$pattern" "$pkg"; then
		rc=1
	fi
done < "$tmp/plan"
if [ $rc -eq 0 ]; then
	echo "test-integration: passed; the first run's failures followed a known server crash (above) and passed when run again"
fi
exit $rc
