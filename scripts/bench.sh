#!/usr/bin/env bash
# Runs the benchmarks of BENCHMARKS.md and prints their figures and targets
# (`make bench`). Raw results, benchstat tables and the summary are kept in
# $BENCH_OUT (default: a new folder under $TMPDIR).
#
# Comparisons are interleaved: each round runs A once and B once (in
# alternating order) in separate processes of one test binary, so that a
# noisy neighbour hits both sides alike. Timed targets are judged on
# medians (benchstat's estimator); the fastest rounds are printed next to
# them as a check against rounds slowed by other processes.
#
# Environment:
#   BENCH_ROUNDS       rounds of the streaming comparison (default 10)
#   BENCH_PAIRED       -count of the paired streaming benchmark (default 10)
#   BENCH_COUNT        -count of the root micro-benchmarks (default 6)
#   BENCH_REAL_ROUNDS  rounds against the real Ollama servers (default 6)
#   BENCH_BUDGET       seconds after which no further real-server round is
#                      started once two are done (default 420), so that a
#                      busy machine still finishes within 10 minutes
#   BENCH_PROFILE=0    skip the CPU and memory profiles of the streaming
#                      benchmarks (written to $BENCH_OUT, summarised)
#   BENCHSTAT          the benchstat command (default: go run, pinned version)
#   VRAMGUARD_OLLAMA_VERSIONS and the other internal/testkit/ollamatest variables
#                      select the servers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=${BENCH_ROUNDS:-10}
paired=${BENCH_PAIRED:-10}
count=${BENCH_COUNT:-6}
real_rounds=${BENCH_REAL_ROUNDS:-6}
budget=${BENCH_BUDGET:-420}
out=${BENCH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/vramguard-bench.XXXXXX")}
mkdir -p "$out"
benchstat=${BENCHSTAT:-go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da}
chunks=10001 # callbacks per streamed generation: 10,000 text chunks and the done line
poll_ms=10   # PollInterval of the vramguard client in internal/suites/benchreal
start=$(date +%s)

say() { printf '%s\n' "$*" | tee -a "$out/summary.txt"; }
# vals NAME UNIT < results: the UNIT values of the lines whose name contains NAME.
vals() { awk -v n="$1" -v u="$2" 'index($1, n) == 1 { for (i = 3; i <= NF; i++) if ($i == u) print $(i - 1) }'; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else printf "%.10g\n", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# med FILE NAME UNIT: the median of a benchmark's UNIT values; least: the minimum.
med() { vals "$2" "$3" <"$1" | median; }
least() { vals "$2" "$3" <"$1" | sort -g | head -1; }
# ratio FILE NAME_A NAME_B UNIT: the median of the per-round ratios B/A.
ratio() { paste <(vals "$2" "$4" <"$1") <(vals "$3" "$4" <"$1") | awk 'NF == 2 && $1 > 0 { print $2 / $1 }' | median; }
calc() { awk "BEGIN { printf \"%.${2:-3}f\", $1 }"; }
verdict() { if awk "BEGIN { exit !($1) }"; then echo MET; else echo MISSED; fi; }
stat() { $benchstat "$@" 2>&1 | tee -a "$out/summary.txt"; }

: >"$out/summary.txt"
say "# vramguard benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC')"
say "go: $(go version | cut -d' ' -f3-)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores online, load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "tree: commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- '*.go' 2>/dev/null || echo ', tracked Go files modified')"
say "ollama servers: ${VRAMGUARD_OLLAMA_VERSIONS:-0.6.5,0.17.4} (internal/testkit/ollamatest, CPU only)"
say "results: $out"

echo "building test binaries..."
go test -c -o "$out/root.test" .
go test -c -o "$out/gpu.test" ./gpu # BenchmarkNVMLSnapshot8GPU: a go-nvml mock, cgo builds only
go test -c -o "$out/benchreal.test" ./internal/suites/benchreal
$benchstat -h >/dev/null 2>&1 || { echo "benchstat unavailable ($benchstat); set BENCHSTAT"; exit 1; }

# runroot BENCH [flags...]: one run of root benchmarks matching BENCH.
runroot() {
	local b=$1
	shift
	"$out/root.test" -test.run '^$' -test.bench "$b" -test.benchmem "$@" | grep -E '^(Benchmark|--- )' || true
}

# 1. Streaming overhead.
say ""
say "## 1. Streaming: GenerateStreaming vs the raw api.Client (10,000 chunks + done; $rounds interleaved rounds, paired -count $paired)"
: >"$out/streaming.txt"
for ((i = 1; i <= rounds; i++)); do
	if ((i % 2)); then order="RawAPIGenerate GenerateStreaming"; else order="GenerateStreaming RawAPIGenerate"; fi
	for b in $order; do
		runroot "^Benchmark$b\$" -test.count 1 >>"$out/streaming.txt"
	done
done
stat -col '.name@(RawAPIGenerate GenerateStreaming)' "$out/streaming.txt"
runroot '^BenchmarkStreamingPaired$' -test.count "$paired" >"$out/paired.txt"
stat "$out/paired.txt"
raw_ns=$(med "$out/streaming.txt" BenchmarkRawAPIGenerate ns/op)
gs_ns=$(med "$out/streaming.txt" BenchmarkGenerateStreaming ns/op)
sep_ratio=$(calc "$gs_ns / $raw_ns")
round_ratio=$(ratio "$out/streaming.txt" BenchmarkRawAPIGenerate BenchmarkGenerateStreaming ns/op)
time_ratio=$(med "$out/paired.txt" BenchmarkStreamingPaired ratio)
raw_allocs=$(med "$out/streaming.txt" BenchmarkRawAPIGenerate allocs/op)
gs_allocs=$(med "$out/streaming.txt" BenchmarkGenerateStreaming allocs/op)
extra=$(calc "$gs_allocs - $raw_allocs" 0)
per_chunk=$(calc "($gs_allocs - $raw_allocs) / $chunks" 4)
say "separate runs: median ns/op raw $raw_ns, vramguard $gs_ns: ${sep_ratio}x (median of per-round ratios ${round_ratio}x)"
min_ratio=$(calc "$(least "$out/paired.txt" BenchmarkStreamingPaired vramguard-ns/op) / $(least "$out/paired.txt" BenchmarkStreamingPaired raw-ns/op)")
say "paired runs (each iteration both, alternating, after a GC): median ratio ${time_ratio}x (fastest rounds ${min_ratio}x); target <= 1.05x: $(verdict "$time_ratio <= 1.05")"
say "median allocs/op raw $raw_allocs, vramguard $gs_allocs: $extra extra per generation, $per_chunk extra per chunk; target <= 2: $(verdict "$per_chunk <= 2")"
say "per chunk: raw $(calc "$raw_ns / $chunks" 0) ns and $(calc "$raw_allocs / $chunks" 2) allocs, vramguard $(calc "$gs_ns / $chunks" 0) ns and $(calc "$gs_allocs / $chunks" 2) allocs"

if [[ ${BENCH_PROFILE:-1} == 1 ]]; then
	for b in GenerateStreaming RawAPIGenerate; do
		runroot "^Benchmark$b\$" -test.benchtime 300x -test.cpuprofile "$out/$b.cpu" >/dev/null
		runroot "^Benchmark$b\$" -test.benchtime 10x -test.memprofilerate 1 -test.memprofile "$out/$b.mem" >/dev/null
	done
	say ""
	say "### CPU profile: share of the callbacks (cum), vramguard then raw"
	go tool pprof -top -cum -nodefraction 0 -edgefraction 0 "$out/root.test" "$out/GenerateStreaming.cpu" 2>/dev/null |
		grep -E 'Total samples|OllamaClient\)\.stream\.func|watchdog|Timer\)\.Reset|time\.Since$' | tee -a "$out/summary.txt" || true
	go tool pprof -top -cum -nodefraction 0 -edgefraction 0 "$out/root.test" "$out/RawAPIGenerate.cpu" 2>/dev/null |
		grep -E 'Total samples|streamRaw\.func' | tee -a "$out/summary.txt" || true
	say "### Allocations, vramguard minus raw, 11 generations (objects)"
	go tool pprof -sample_index=alloc_objects -diff_base "$out/RawAPIGenerate.mem" -top -nodecount 12 "$out/root.test" "$out/GenerateStreaming.mem" 2>/dev/null |
		tail -n +5 | tee -a "$out/summary.txt" || true
fi

# 2. CleanupAsync, Guard.Run, VRAM snapshot.
say ""
say "## 2. CleanupAsync, Guard.Run, NVML snapshot, one unload request (-count $count)"
runroot '^(BenchmarkCleanupAsync|BenchmarkGuardRun|BenchmarkUnloadRequest)$' -test.count "$count" >"$out/root.txt"
"$out/gpu.test" -test.run '^$' -test.bench '^BenchmarkNVMLSnapshot8GPU$' -test.benchmem -test.count "$count" | grep -E '^(Benchmark|--- )' >>"$out/root.txt" || true
stat "$out/root.txt"
call_ns=$(med "$out/root.txt" BenchmarkCleanupAsync call-ns/op)
say "CleanupAsync call: median $(calc "$call_ns / 1000" 1) µs, $(med "$out/root.txt" BenchmarkCleanupAsync call-allocs/op) allocs; target microseconds: $(verdict "$call_ns < 100000")"
say "CleanupAsync round trip (call + verified unload on the simulator, joined): median $(calc "$(med "$out/root.txt" BenchmarkCleanupAsync ns/op) / 1000000" 2) ms, $(med "$out/root.txt" BenchmarkCleanupAsync B/op) B/op"
g_ns=$(med "$out/root.txt" BenchmarkGuardRun/guard ns/op)
d_ns=$(med "$out/root.txt" BenchmarkGuardRun/direct ns/op)
say "Guard.Run (KeepLoaded, no-op fn): median $g_ns ns/op vs $d_ns ns/op direct: $(calc "$g_ns - $d_ns" 0) ns and $(med "$out/root.txt" BenchmarkGuardRun/guard allocs/op) allocs per call"
: >"$out/guard-scale.txt"
for n in 1000 100000 3000000; do
	runroot '^BenchmarkGuardRun$/^guard$' -test.benchtime "${n}x" >>"$out/guard-scale.txt"
done
say "Guard.Run at b.N = 1000, 100000, 3000000:"
tee -a "$out/summary.txt" <"$out/guard-scale.txt"
a=$(vals BenchmarkGuardRun/guard allocs/op <"$out/guard-scale.txt" | sort -u | tr '\n' ' ')
say "allocs/op seen: $a-> stable: $(verdict "$(wc -w <<<"$a") == 1")"
if grep -q BenchmarkNVMLSnapshot8GPU "$out/root.txt"; then
	say "NVML snapshot, mocked 8-GPU machine: median $(calc "$(med "$out/root.txt" BenchmarkNVMLSnapshot8GPU ns/op) / 1000" 1) µs, $(med "$out/root.txt" BenchmarkNVMLSnapshot8GPU allocs/op) allocs"
else
	say "NVML snapshot: not run (needs cgo)"
fi
ua=$(med "$out/root.txt" BenchmarkUnloadRequest/client=api.Generate ns/op)
up=$(med "$out/root.txt" BenchmarkUnloadRequest/client=http.Post ns/op)
say "one unload request: api.Generate $(calc "$ua / 1000" 1) µs and $(med "$out/root.txt" BenchmarkUnloadRequest/client=api.Generate B/op) B/op; plain POST $(calc "$up / 1000" 1) µs and $(med "$out/root.txt" BenchmarkUnloadRequest/client=http.Post B/op) B/op"

# 2b. Chat: ChatStreaming vs the raw api.Client.Chat on the same stream.
say ""
say "## 2b. Chat: ChatStreaming vs the raw api.Client.Chat (10,000 chunks + done, -count $count)"
runroot '^BenchmarkChatStreamingVsRaw$' -test.count "$count" >"$out/chat.txt"
stat -col /client "$out/chat.txt"
ch_raw=$(med "$out/chat.txt" BenchmarkChatStreamingVsRaw/chunks=10000/client=raw ns/op)
ch_vg=$(med "$out/chat.txt" BenchmarkChatStreamingVsRaw/chunks=10000/client=vramguard ns/op)
chb_raw=$(med "$out/chat.txt" BenchmarkChatStreamingVsRaw/chunks=10000/client=raw B/op)
chb_vg=$(med "$out/chat.txt" BenchmarkChatStreamingVsRaw/chunks=10000/client=vramguard B/op)
say "chat time vramguard/raw $(calc "$ch_vg / $ch_raw") (target <= 1: $(verdict "$ch_vg <= $ch_raw")); bytes $(calc "$chb_vg / $chb_raw") (target <= 0.5: $(verdict "$chb_vg <= 0.5 * $chb_raw"))"

# 3. Real servers.
say ""
say "## 3. Real Ollama servers (up to $real_rounds rounds of unload 6x and workflow 2x; vramguard PollInterval ${poll_ms} ms, bare loop polls every 1 ms)"
: >"$out/unload.txt"
: >"$out/workflow.txt"
runreal() {
	(cd internal/suites/benchreal && "$out/benchreal.test" -test.run '^$' -test.bench "$1" -test.benchtime "$2" -test.count 1 2>&1) |
		tee -a "$out/real.log" | grep -E '^Benchmark' || true
}
for ((i = 1; i <= real_rounds; i++)); do
	if ((i > 2 && $(date +%s) - start > budget)); then
		say "time budget (${budget} s) spent: $((i - 1)) rounds instead of $real_rounds"
		break
	fi
	runreal '^BenchmarkUnload$' 6x >>"$out/unload.txt"
	runreal '^BenchmarkWorkflow$' 2x >>"$out/workflow.txt"
done
if grep -q -- '--- FAIL' "$out/real.log"; then
	say "WARNING: $(grep -c -- '--- FAIL' "$out/real.log") failure lines in $out/real.log (those rounds lack figures):"
	grep -A2 -- '--- FAIL' "$out/real.log" | head -12 | tee -a "$out/summary.txt"
	grep -A3 'fatal error' "$out/real.log" | head -8 | tee -a "$out/summary.txt" || true
fi
if ! grep -q 'ns/op' "$out/unload.txt" "$out/workflow.txt"; then
	say "no real server: benchmarks skipped ($(grep -m1 -i 'unavailable' "$out/real.log" || echo 'see real.log'))"
else
	stat -col '/mode@(bare verified)' "$out/unload.txt"
	stat -col '/mode@(per-call phase)' "$out/workflow.txt"
	for v in $(grep -oE 'ollama=[^/]+' "$out/unload.txt" "$out/workflow.txt" | cut -d= -f2 | sort -uV); do
		b=$(med "$out/unload.txt" "BenchmarkUnload/ollama=$v/mode=bare-" ns/op)
		u=$(med "$out/unload.txt" "BenchmarkUnload/ollama=$v/mode=verified-" ns/op)
		if [[ $b != nan && $u != nan ]]; then
			d=$(calc "($u - $b) / 1000000" 2)
			lb=$(least "$out/unload.txt" "BenchmarkUnload/ollama=$v/mode=bare-" ns/op)
			lu=$(least "$out/unload.txt" "BenchmarkUnload/ollama=$v/mode=verified-" ns/op)
			ld=$(calc "($lu - $lb) / 1000000" 2)
			say "ollama $v unload: median verified $(calc "$u / 1000000" 2) ms vs bare $(calc "$b / 1000000" 2) ms: +$d ms (fastest rounds $(calc "$lu / 1000000" 2) vs $(calc "$lb / 1000000" 2): +$ld ms); target within one poll interval (${poll_ms} ms): $(verdict "$d <= $poll_ms")"
		fi
		p=$(med "$out/workflow.txt" "BenchmarkWorkflow/ollama=$v/mode=per-call-" ns/op)
		q=$(med "$out/workflow.txt" "BenchmarkWorkflow/ollama=$v/mode=phase-" ns/op)
		if [[ $p != nan && $q != nan ]]; then
			lp=$(med "$out/workflow.txt" "BenchmarkWorkflow/ollama=$v/mode=per-call-" loads/op)
			lq=$(med "$out/workflow.txt" "BenchmarkWorkflow/ollama=$v/mode=phase-" loads/op)
			r=$(calc "$p / $q" 2)
			mp=$(least "$out/workflow.txt" "BenchmarkWorkflow/ollama=$v/mode=per-call-" ns/op)
			mq=$(least "$out/workflow.txt" "BenchmarkWorkflow/ollama=$v/mode=phase-" ns/op)
			mr=$(calc "$mp / $mq" 2)
			say "ollama $v workflow: median per-call $(calc "$p / 1000000000" 3) s vs phase $(calc "$q / 1000000000" 3) s: ${r}x (fastest rounds $(calc "$mp / 1000000000" 3) s vs $(calc "$mq / 1000000000" 3) s: ${mr}x); median loads/op $lp vs $lq; target >= 1.8x: $(verdict "$r >= 1.8"), loads 5 vs 2: $(verdict "$lp == 5 && $lq == 2")"
		fi
	done
fi

say ""
say "total: $(($(date +%s) - start)) s; figures are for this machine only"
