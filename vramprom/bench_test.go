package vramprom_test

// Issue #27's overhead target for the Prometheus adapter: BENCHMARKS.md
// §12.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/benchstream"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramprom"
)

// benchCollector is a Collector registered on a registry of its own, as
// a program runs it.
func benchCollector(b *testing.B) *vramprom.Collector {
	col, err := vramprom.New(vramprom.Config{})
	if err != nil {
		b.Fatal(err)
	}
	prometheus.NewRegistry().MustRegister(col)
	return col
}

// BenchmarkStreamingPaired is issue #27's overhead target: BENCHMARKS.md
// §1's stream (10,000 chunks and a done line from a pre-rendered NDJSON
// body) through a client without hooks ("off") and one with the
// Collector's ("on"), both in every iteration, in alternating order, each
// after an untimed GC, as the root's BenchmarkStreamingPaired does
// (benchstream.HooksPaired).
// off-ns/op and on-ns/op are each side's time, ratio is on/off over the
// run, median-ratio the median of the iterations' on/off (which a burst
// in one iteration moves less); ns/op is the pair with its GCs.
// hooks=none is the control: "on" has no hooks either, so its ratios are
// the noise of the measurement on this machine at the time.
func BenchmarkStreamingPaired(b *testing.B) {
	benchstream.HooksPaired(b, "vramprom", func(b *testing.B) vramguard.Hooks { return benchCollector(b).Hooks() })
}

// BenchmarkStreamingInstrumented streams a short generation of a loaded
// model from the simulator (its default chunks, and 128) through two
// clients of one server, one without hooks ("off") and one with the
// Collector's ("on"), paired as BenchmarkStreamingPaired is: on-ns/op less
// off-ns/op is the Collector's fixed cost per call, around a real HTTP
// round trip.
func BenchmarkStreamingInstrumented(b *testing.B) {
	for _, chunks := range []int{vramguardtest.DefaultChunks, 128} {
		b.Run(fmt.Sprintf("chunks=%d", chunks), func(b *testing.B) {
			s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "bench", Chunks: chunks}}})
			b.Cleanup(s.Close)
			benchstream.LoadedPaired(b, s.URL(), chunks, benchCollector(b).Hooks())
		})
	}
}

// BenchmarkCallHooks is the hooks' own cost for one successful call
// (OnCallEnd; the Collector sets no OnCallStart) with no HTTP around it:
// the fixed cost the Collector adds to each generation.
func BenchmarkCallHooks(b *testing.B) {
	gen := &vramguard.Generation{Model: "bench", Chunks: 9, DoneReason: "stop", FirstChunk: time.Millisecond, Elapsed: 5 * time.Millisecond}
	gen.Metrics.PromptEvalCount, gen.Metrics.EvalCount = 8, 9
	h := benchCollector(b).Hooks()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		cs := vramguard.CallStart{Op: "generate", Model: "bench", Server: "http://127.0.0.1:11434", Start: time.Now()}
		h.OnCallEnd(ctx, vramguard.CallEnd{CallStart: cs, Elapsed: 5 * time.Millisecond, Generation: gen})
	}
}
