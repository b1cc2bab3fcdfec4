#!/usr/bin/env bash
# What a user's module sees when it imports vramguard and vramguard/nodes
# (`make check-importer`, part of `make check`):
#
#  1. A throwaway module outside the repo (under mktemp -d) with a tiny main
#     using vramguard.NewClient and a nodes.PromptGenerator, the repo as a
#     replace, and go-nvml forced to v0.13.4-1 (`go get`), the version whose
#     nvml.h prints about 150 deprecation warnings in every cgo build that
#     compiles it. It is built with CGO_ENABLED=1 and an empty GOCACHE (a
#     temp folder), so nothing comes from an earlier build; the check fails
#     if the build prints any line at all, or if go-nvml is among the
#     program's packages, or if OpenTelemetry or Prometheus code is. Only
#     the Go module proxy is needed (GOFLAGS -mod=mod lets the go command
#     fill in go.mod and go.sum).
#  2. `go doc -all` of the root and of nodes is the same with CGO_ENABLED=0
#     and 1: the same API without a C compiler (a diff otherwise).
#
# --with-gpu also imports package gpu, and expects the build to print lines
# (the warnings this check exists to catch): a test of the check itself.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
with_gpu=false
case ${1:-} in
"") ;;
--with-gpu) with_gpu=true ;;
*)
	echo "usage: $0 [--with-gpu]" >&2
	exit 2
	;;
esac
start=$SECONDS
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vramguard-importer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mod=$tmp/importer
mkdir "$mod"

cd "$repo"
echo "check-importer: go doc -all with CGO_ENABLED=0 and 1"
for pkg in . ./nodes; do
	CGO_ENABLED=0 go doc -all "$pkg" >"$tmp/doc0"
	CGO_ENABLED=1 go doc -all "$pkg" >"$tmp/doc1"
	if ! diff -u --label "CGO_ENABLED=0 go doc -all $pkg" --label "CGO_ENABLED=1 go doc -all $pkg" "$tmp/doc0" "$tmp/doc1"; then
		echo "check-importer: FAIL: the API of $pkg depends on cgo"
		exit 1
	fi
done
goline=$(go list -m -f '{{.GoVersion}}')

gpuimport="" gpuuse=""
if $with_gpu; then
	gpuimport='"github.com/vramguard/vramguard/gpu"'
	gpuuse='if r, err := gpu.NewAutoReader(context.Background(), gpu.ReaderOptions{}); err == nil { _ = r.Close() }'
fi
cat >"$mod/main.go" <<EOF
// Command importer is what a user of vramguard and its prompt nodes builds.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/nodes"
	$gpuimport
)

func main() {
	c, err := vramguard.NewClient(vramguard.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	g := nodes.PromptGenerator{Guard: vramguard.Guard{Client: c}, Model: "llama3.2"}
	res, err := g.Generate(context.Background(), nodes.GenerateInput{Description: "a castle at dawn"})
	fmt.Println(res, err)
	$gpuuse
}
EOF
cat >"$mod/go.mod" <<EOF
module example.com/importer

go $goline

require github.com/vramguard/vramguard v0.0.0

replace github.com/vramguard/vramguard => $repo
EOF

export GOFLAGS=-mod=mod GOCACHE=$tmp/gocache CGO_ENABLED=1 GOTOOLCHAIN=local
cd "$mod"
gofmt -w main.go
# Resolving modules prints ("go: added ...", "go: downloading ..."); only
# the build that follows must be silent.
go get github.com/NVIDIA/go-nvml@v0.13.4-1 >"$tmp/get.log" 2>&1 || { cat "$tmp/get.log"; exit 1; }
go list -deps . >"$tmp/deps" 2>"$tmp/list.log" || { cat "$tmp/list.log"; exit 1; }
nvml=$(go list -m -f '{{.Version}}' github.com/NVIDIA/go-nvml)
if [[ $nvml != v0.13.4-1 ]]; then
	echo "check-importer: FAIL: go-nvml is $nvml in the importer, want v0.13.4-1"
	exit 1
fi
echo "check-importer: building a module importing vramguard and nodes$($with_gpu && echo " and gpu") (go-nvml $nvml, empty GOCACHE, CGO_ENABLED=1)"
build_start=$SECONDS
status=0
go build -o "$tmp/importer.bin" . >"$tmp/build.log" 2>&1 || status=$?
lines=$(wc -l <"$tmp/build.log")
echo "check-importer: build took $((SECONDS - build_start))s and printed $lines lines (status $status)"
if $with_gpu; then
	if ((status != 0 || lines == 0)); then
		cat "$tmp/build.log"
		echo "check-importer: FAIL: with package gpu the build should print go-nvml's warnings (and succeed)"
		exit 1
	fi
	grep -c -- '-Wdeprecated-declarations' "$tmp/build.log" | sed 's/^/check-importer: deprecation warnings with gpu: /'
	echo "check-importer: ok (--with-gpu: the warnings are seen), $((SECONDS - start))s in all"
	exit 0
fi
if ((status != 0 || lines != 0)); then
	cat "$tmp/build.log"
	echo "check-importer: FAIL: the build printed $lines lines"
	exit 1
fi
if grep -q '^github.com/NVIDIA/go-nvml' "$tmp/deps"; then
	grep '^github.com/NVIDIA/go-nvml' "$tmp/deps"
	echo "check-importer: FAIL: the importer compiles go-nvml"
	exit 1
fi
# The metrics adapters are packages of their own (vramotel, vramprom): a
# program that imports only the root and nodes compiles neither OTel nor
# Prometheus (issue #27).
if grep -E '^(go\.opentelemetry\.io/|github\.com/prometheus/)' "$tmp/deps"; then
	echo "check-importer: FAIL: the importer compiles OpenTelemetry or Prometheus code"
	exit 1
fi
cgo=$(go list -deps -f '{{if and .CgoFiles (not .Standard)}}{{.ImportPath}}{{end}}' .)
if [[ -n $cgo ]]; then
	echo "$cgo"
	echo "check-importer: FAIL: packages with cgo outside the standard library"
	exit 1
fi
echo "check-importer: ok, $((SECONDS - start))s in all"
