#!/usr/bin/env bash
# What a user who copies the project's examples gets (`make check-copy`,
# part of `make check`): every check runs in a throwaway module outside the
# repo (under mktemp -d) that requires github.com/vramguard/vramguard with
# the checkout as a replace, so nothing resolves through the repo's own
# module, its internal packages or its test helpers.
#
#  1. Each example program (examples/<name>/ and cmd/<name>/, their non-_test .go files) is
#     copied into a package of that module and built.
#  2. Each public package (every package of `go list ./...` outside
#     internal/) with godoc Example files (example_test.go,
#     example_*_test.go) has those files, and only those, copied into a
#     package of that module, where `go test -run '^Example'` must pass:
#     the Examples compile without the package's other _test.go files
#     (helpers, export_test.go) and their // Output: holds. A name left
#     undefined is reported with the non-example _test.go files that
#     declare it.
#  3. No Example file and no example program imports a path containing
#     "/internal/" (the offending files and imports are printed).
#  4. The adopter module of testdata/adopter (a user's own tests against
#     vramguardtest.Server) is copied out, its replace pointed at the
#     checkout, and tested with -race.
#
# Every step runs; the script fails at the end if any failed, naming each.
# Only the Go module proxy is needed (GOFLAGS -mod=mod lets the go command
# fill in go.mod and go.sum); the repo's go.sum is copied in to start from.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if (($# != 0)); then
	echo "usage: $0" >&2
	exit 2
fi
start=$SECONDS
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vramguard-copy.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mod=$tmp/copy
mkdir "$mod"
failures=()
fail() {
	echo "check-copy: FAIL: $*"
	failures+=("$*")
}

cd "$repo"
modpath=$(go list -m -f '{{.Path}}')
goline=$(go list -m -f '{{.GoVersion}}')
cat >"$mod/go.mod" <<EOF
module example.com/copy

go $goline

require $modpath v0.0.0

replace $modpath => $repo
EOF
cp go.sum "$mod/go.sum"

# The example programs, and the public packages with their Example files.
shopt -s nullglob
programs=()
for dir in examples/*/ cmd/*/; do
	dir=${dir%/}
	if [[ -n $(find "$dir" -maxdepth 1 -name '*.go' ! -name '*_test.go' -print -quit) ]]; then
		programs+=("$dir")
	fi
done
declare -A examplefiles=() # repo-relative package dir -> its Example files
while IFS='|' read -r path dir; do
	case $path/ in */internal/*) continue ;; esac
	rel=${dir#"$repo"}
	rel=${rel#/}
	[[ -n $rel ]] || rel=.
	files=$(cd "$dir" && find . -maxdepth 1 \( -name example_test.go -o -name 'example_*_test.go' \) -printf '%f\n' | sort)
	if [[ -n $files ]]; then
		examplefiles[$rel]=$(echo $files)
	fi
done < <(go list -f '{{.ImportPath}}|{{.Dir}}' ./...)
pkgs=$(printf '%s\n' "${!examplefiles[@]}" | sort)

# imports prints the import paths of a gofmt'd Go file, one a line.
imports() {
	awk '
		/^import \($/ { block = 1; next }
		block && /^\)$/ { block = 0; next }
		block || /^import / {
			if (match($0, /"[^"]*"/)) print substr($0, RSTART + 1, RLENGTH - 2)
		}
	' "$1"
}

echo "check-copy: no /internal/ imports in the example programs and Example files"
offenders=0
copied=()
for dir in "${programs[@]}"; do
	while IFS= read -r f; do copied+=("$f"); done < <(find "$dir" -maxdepth 1 -name '*.go' ! -name '*_test.go' | sort)
done
for p in $pkgs; do
	for f in ${examplefiles[$p]}; do
		if [[ $p == . ]]; then copied+=("$f"); else copied+=("$p/$f"); fi
	done
done
for f in "${copied[@]}"; do
	for imp in $(imports "$f" | grep -- '/internal/' || true); do
		echo "  $f imports $imp"
		offenders=$((offenders + 1))
	done
done
((offenders == 0)) || fail "$offenders /internal/ imports in example programs or Example files (listed above)"

export GOFLAGS=-mod=mod CGO_ENABLED=1 GOTOOLCHAIN=local

echo "check-copy: building ${#programs[@]} example programs in a module outside the repo"
for dir in "${programs[@]}"; do
	mkdir -p "$mod/$dir"
	find "$dir" -maxdepth 1 -name '*.go' ! -name '*_test.go' -exec cp {} "$mod/$dir/" \;
	if ! (cd "$mod" && go build -o /dev/null "./$dir") >"$tmp/build.log" 2>&1; then
		sed 's/^/  /' "$tmp/build.log"
		fail "$dir does not build outside the repo"
	else
		echo "  ok $dir"
	fi
done

# helpers names, for each name a failed build left undefined, the repo's
# non-example _test.go files in package dir $1 that declare it.
helpers() {
	local dir=$1 log=$2 name decl
	for name in $(grep -o 'undefined: [A-Za-z_.][A-Za-z0-9_.]*' "$log" | sed 's/undefined: //; s/^[A-Za-z0-9_]*\.//' | sort -u); do
		decl=$(cd "$repo/$dir" && grep -lE "^(func|type|var|const)[[:space:]]+(\([^)]*\)[[:space:]]*)?$name\b|^[[:space:]]+$name([[:space:]]*,[[:space:]]*[A-Za-z0-9_]+)*[[:space:]]*(=|[[:space:]][^=]*=)" \
			$(ls *_test.go | grep -vx -e example_test.go -e 'example_.*_test.go') 2>/dev/null | paste -sd ' ' || true)
		echo "      $name: ${decl:-not declared in a _test.go file of $dir}"
	done
}

# each runs the Examples of the test binary $1 (built from package dir $2)
# one by one, and prints each that fails with the start of its output;
# when none fails alone, the output of the run of them all ($3).
each() {
	local bin=$1 dir=$2 all=$3 name n=0 m=0
	for name in $(cd "$dir" && "$bin" -test.list '^Example'); do
		m=$((m + 1))
		if ! (cd "$dir" && "$bin" -test.count=1 -test.run "^$name\$") >"$tmp/one.log" 2>&1; then
			echo "    $name fails:"
			grep -v -e '^FAIL$' -e '^--- FAIL' "$tmp/one.log" | head -n 6 | sed 's/^/      /'
			n=$((n + 1))
		fi
	done
	echo "    $n of $m Examples fail alone"
	if ((n == 0)); then
		echo "    all together:"
		tail -n 20 "$all" | sed 's/^/      /'
	fi
}

echo "check-copy: running the Example files of $(echo $pkgs | wc -w) packages outside the repo, alone"
for p in $pkgs; do
	dst=copied/$p
	[[ $p == . ]] && dst=copied/root
	mkdir -p "$mod/$dst"
	for f in ${examplefiles[$p]}; do cp "$p/$f" "$mod/$dst/"; done
	echo "  $p: ${examplefiles[$p]}"
	if (cd "$mod" && go test -count=1 -v -run '^Example' "./$dst") >"$tmp/test.log" 2>&1; then
		echo "    ok, $(grep -c '^--- PASS: Example' "$tmp/test.log" || true) Examples with output passed"
	elif ! (cd "$mod" && go test -c -o "$tmp/example.test" "./$dst") >"$tmp/build.log" 2>&1; then
		sed 's/^/    /' "$tmp/build.log"
		if grep -q 'undefined: ' "$tmp/build.log"; then
			echo "    undefined names, and the repo's non-example _test.go files that declare them:"
			helpers "$p" "$tmp/build.log"
		fi
		fail "the Example files of $p do not compile alone outside the repo"
	else
		each "$tmp/example.test" "$mod/$dst" "$tmp/test.log"
		fail "Examples of $p fail alone outside the repo (listed above)"
	fi
done

echo "check-copy: the adopter module (testdata/adopter) outside the repo, with -race"
cp -r testdata/adopter "$tmp/adopter"
(cd "$tmp/adopter" && go mod edit -replace="$modpath=$repo")
if ! (cd "$tmp/adopter" && go test -race -count=1 ./...) >"$tmp/adopter.log" 2>&1; then
	sed 's/^/  /' "$tmp/adopter.log"
	fail "the adopter module's tests fail"
else
	sed 's/^/  /' "$tmp/adopter.log"
fi

if ((${#failures[@]} > 0)); then
	echo "check-copy: ${#failures[@]} failed, $((SECONDS - start))s in all:"
	printf '  %s\n' "${failures[@]}"
	exit 1
fi
echo "check-copy: ok, $((SECONDS - start))s in all"
