package vramotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/benchstream"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramotel"
)

// newBenchInstrumentation is an Instrumentation on the real SDK as a
// program runs it: spans batched to an exporter (one that discards them,
// so that no export cost is counted), metrics aggregated for a reader.
func newBenchInstrumentation(b *testing.B) *vramotel.Instrumentation {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	inst, err := vramotel.New(vramotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = inst.Close()
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return inst
}

// BenchmarkStreamingInstrumented streams a short generation of a loaded
// model from the simulator (its default chunks, and 128) through two
// clients of one server, one without hooks ("off") and one with
// vramotel's ("on"), paired as BenchmarkStreamingPaired is: on-ns/op less
// off-ns/op is the instrumentation's fixed cost per call, around a real
// HTTP round trip.
func BenchmarkStreamingInstrumented(b *testing.B) {
	for _, chunks := range []int{vramguardtest.DefaultChunks, 128} {
		b.Run(fmt.Sprintf("chunks=%d", chunks), func(b *testing.B) {
			s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "bench", Chunks: chunks}}})
			b.Cleanup(s.Close)
			inst := newBenchInstrumentation(b)
			benchstream.LoadedPaired(b, s.URL(), chunks, inst.Hooks())
		})
	}
}

// BenchmarkCallHooks is the hooks' own cost for one successful call
// (OnCallStart, OnCallEnd) with no HTTP around it: on the SDK, and on the
// no-op providers of a program that set none.
func BenchmarkCallHooks(b *testing.B) {
	gen := &vramguard.Generation{Model: "bench", Chunks: 9, DoneReason: "stop", FirstChunk: time.Millisecond, Elapsed: 5 * time.Millisecond}
	gen.Metrics.PromptEvalCount, gen.Metrics.EvalCount = 8, 9
	for _, side := range []string{"sdk", "noop"} {
		b.Run(side, func(b *testing.B) {
			inst := newBenchInstrumentation(b)
			if side == "noop" {
				var err error
				if inst, err = vramotel.New(vramotel.Config{}); err != nil {
					b.Fatal(err)
				}
			}
			h := inst.Hooks()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				cs := vramguard.CallStart{Op: "generate", Model: "bench", Server: "http://127.0.0.1:11434", Start: time.Now()}
				cctx := h.OnCallStart(ctx, cs)
				h.OnCallEnd(cctx, vramguard.CallEnd{CallStart: cs, Elapsed: 5 * time.Millisecond, Generation: gen})
			}
		})
	}
}

// BenchmarkStreamingPaired is issue #27's overhead target: BENCHMARKS.md
// §1's stream (10,000 chunks and a done line from a pre-rendered NDJSON
// body) through a client without hooks ("off") and one with vramotel's
// on the real SDK ("on": spans batched to a discarding exporter, metrics
// aggregated for a manual reader), both in every iteration, in
// alternating order, each after an untimed GC, as the root's
// BenchmarkStreamingPaired does (benchstream.HooksPaired). off-ns/op and
// on-ns/op are each side's time, ratio is on/off over the run,
// median-ratio the median of the iterations' on/off; ns/op is the pair
// with its GCs. hooks=none is the control: "on" has no hooks either, so
// its ratios are the noise of the measurement on this machine at the
// time.
func BenchmarkStreamingPaired(b *testing.B) {
	benchstream.HooksPaired(b, "vramotel", func(b *testing.B) vramguard.Hooks { return newBenchInstrumentation(b).Hooks() })
}
