# vramguard: `make test` is what CI runs (see .ci/run).
GO        ?= go
PKGS      := ./...
# The packages that run real Ollama servers (the harness and the stand-in
# llama-server test themselves against them too): they run once, in
# test-integration.
# internal/testkit/gpucheck runs its CPU path against a real server too.
REAL_PKGS := ./internal/testkit/ollamatest ./internal/testkit/standin/... ./internal/testkit/gpucheck ./internal/suites/integration ./internal/suites/reliability ./internal/suites/oracle
UNIT_PKGS := $(shell $(GO) list ./... | grep -v -e /internal/suites/oracle -e /internal/suites/integration -e /internal/suites/reliability -e /internal/testkit/ollamatest -e /internal/testkit/standin -e /internal/testkit/gpucheck)
# go-nvml from v0.13.1-0 ships an nvml.h whose DEPRECATED marks are live:
# the first cgo build of every program that compiles go-nvml prints about
# 150 lines of -Wdeprecated-declarations warnings, which only the builder's
# own CGO_CFLAGS could silence. Only package gpu imports go-nvml: a program
# importing the root and nodes compiles no C whatever go-nvml version its
# module selects (check-importer proves it with v0.13.4-1). For importers of
# gpu, go.mod keeps go-nvml at v0.13.0-1 (its header defines DEPRECATED as a
# no-op), so no flag is set here: make's builds show what an importer's build
# shows, and `make check` fails if a bump brings the warnings back.
STATICCHECK ?= $(shell command -v staticcheck 2>/dev/null || echo $(shell $(GO) env GOPATH)/bin/staticcheck)
FUZZTIME  ?= 1s

.PHONY: test tools check check-importer check-copy test-unit test-nocgo test-integration fuzz-short fuzz bench soak oracle oracle-mutants compose compose-mutants install-ollama

## test: everything CI checks (installs what is missing first), timing each stage
test:
	@./scripts/stages.sh tools check test-nocgo test-unit test-integration fuzz-short

## tools: staticcheck, the Ollama servers of the integration tests and a
## Prometheus server (Debian's package) for the one that scrapes vramwatch
tools:
	@command -v staticcheck >/dev/null 2>&1 || test -x $(shell $(GO) env GOPATH)/bin/staticcheck || \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	env -u CGO_CFLAGS ./scripts/install-ollama.sh
	./scripts/install-prometheus.sh

## check: formatting, vet (cgo and not), staticcheck, builds, check-importer,
## check-copy
check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) build $(PKGS)
	$(GO) build ./examples/... ./cmd/...
	CGO_CFLAGS="-O2 -g -Werror=deprecated-declarations" $(GO) build github.com/NVIDIA/go-nvml/pkg/nvml
	$(STATICCHECK) $(PKGS)
	./scripts/check-importer.sh
	./scripts/check-copy.sh

## check-importer: a fresh module importing the root and nodes, with go-nvml
## forced to v0.13.4-1, builds with cgo and an empty GOCACHE printing
## nothing; go doc -all of both is the same with and without cgo
check-importer:
	./scripts/check-importer.sh

## check-copy: the example programs and each public package's Example files,
## copied into a module outside the repo, build and pass there alone (no test
## helpers, no internal packages); the adopter module of testdata/adopter
## passes its tests with -race against the checkout
check-copy:
	./scripts/check-copy.sh

## test-unit: unit tests with the race detector (simulator, mocks)
test-unit:
	$(GO) test -race -count=1 $(UNIT_PKGS)

## test-nocgo: the library and its tests without cgo (no NVML)
test-nocgo:
	CGO_ENABLED=0 $(GO) test -count=1 $(UNIT_PKGS)

## test-integration: against real Ollama servers (built on first use, cached);
## one package at a time, since each runs one server per version; the
## race tests of #13 run side by side on servers of their own (-parallel).
## A test whose server died of Ollama's known /api/ps crash (v0.6.5 to
## v0.32.3) runs once more, and only such a test (scripts/test-integration.sh).
## Then cmd/vramgate's one real-server test (the gate in process, reading
## the fake device the pipeline shares), which skips unless
## VRAMGUARD_REAL_GATE=1: its package's other tests ran in test-unit.
test-integration:
	GO=$(GO) ./scripts/test-integration.sh -race -count=1 -p 1 -parallel 4 -timeout 40m $(REAL_PKGS)
	VRAMGUARD_REAL_GATE=1 GO=$(GO) ./scripts/test-integration.sh -race -count=1 -timeout 20m -run='^TestHandOverReservedOnRealServers$$' ./cmd/vramgate

## fuzz-short: every fuzz target for $(FUZZTIME)
fuzz-short:
	./scripts/fuzz.sh $(FUZZTIME)

## fuzz: every fuzz target for a minute
fuzz:
	./scripts/fuzz.sh 60s

## bench: the benchmarks of BENCHMARKS.md
bench:
	./scripts/bench.sh

## soak: thousands of guarded calls with random faults (not in CI)
soak:
	$(GO) test -race -count=1 -run TestSoak -timeout 30m -v ./internal/suites/soak/ -soak

## oracle: the race oracle's long sweep (issue #23), every version side by
## side: SEED=<seed> replays one schedule (N=1 unless set); N schedules per
## server, else BUDGET of wall time per server; SERVERS per version, each
## with its own seeds; VERSIONS limits the servers; figures go to
## ORACLE_REPORT (JSON lines, one per server)
SEED     ?= 0
N        ?= $(if $(filter-out 0,$(SEED)),1,0)
BUDGET   ?= 30m
VERSIONS ?=
SERVERS  ?= 1
ORACLE_REPORT ?= oracle-report.jsonl
oracle:
	$(if $(VERSIONS),VRAMGUARD_OLLAMA_VERSIONS=$(VERSIONS)) $(GO) test -count=1 -run 'TestOracle$$' -v -timeout 0 -parallel 64 ./internal/suites/oracle \
		-oracle.seed $(SEED) -oracle.n $(N) -oracle.budget $(BUDGET) -oracle.servers $(SERVERS) -oracle.report $(abspath $(ORACLE_REPORT))

## compose: the composition oracle on the simulator, COMPOSE_N schedules from fresh seeds (SEED=<seed> COMPOSE_N=1 replays one)
COMPOSE_N ?= 1000
compose:
	$(GO) test -count=1 -run 'TestCompose$$' -v -timeout 0 . -compose.n $(COMPOSE_N) $(if $(SEED),-compose.seed $(SEED))

## compose-mutants: the composition oracle's CI sweep must find each mutant (scripts/compose-mutants.sh)
compose-mutants:
	./scripts/compose-mutants.sh

## oracle-mutants: the oracle must find each mutant of the unload (scripts/oracle-mutants.sh)
oracle-mutants:
	./scripts/oracle-mutants.sh

## install-ollama: build and cache the Ollama servers the integration tests use
install-ollama:
	env -u CGO_CFLAGS ./scripts/install-ollama.sh
