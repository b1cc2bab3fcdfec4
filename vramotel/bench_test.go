package vramotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/vramguard/vramguard"
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

// BenchmarkStreamingInstrumented streams a generation of a loaded model
// from the simulator through two clients of one server, one without hooks
// ("off") and one with vramotel's ("on"), in every iteration, in
// alternating order, each after a GC (untimed), as the root's
// BenchmarkStreamingPaired does: off-ns/op and on-ns/op are each side's
// time, ratio is on/off, and median-ratio the median of the iterations'
// on/off, which a noisy neighbour's burst in one iteration moves less;
// ns/op is the pair with its GCs.
func BenchmarkStreamingInstrumented(b *testing.B) {
	for _, chunks := range []int{vramguardtest.DefaultChunks, 128} {
		b.Run(fmt.Sprintf("chunks=%d", chunks), func(b *testing.B) {
			s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "bench", Chunks: chunks}}})
			b.Cleanup(s.Close)
			inst := newBenchInstrumentation(b)
			client := func(h vramguard.Hooks) *vramguard.OllamaClient {
				tr := http.DefaultTransport.(*http.Transport).Clone()
				c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), HTTPClient: &http.Client{Transport: tr},
					Hooks: h, KeepModelsOnClose: true, Leases: vramguard.LeaseOptions{Off: true}})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(tr.CloseIdleConnections)
				b.Cleanup(func() { _ = c.Close() })
				return c
			}
			off, on := client(vramguard.Hooks{}), client(inst.Hooks())
			stream := func(c *vramguard.OllamaClient) {
				n := 0
				gen, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "bench", Prompt: "a castle at dawn"},
					vramguard.KeepAliveForever, func(vramguard.Chunk) error { n++; return nil })
				if err == nil && (n != chunks+1 || gen.Loaded) {
					err = errors.New("not a stream of a loaded model")
				}
				if err != nil {
					b.Fatalf("%v (%d chunks)", err, n)
				}
			}
			if _, err := off.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "bench", Prompt: "load"}, vramguard.KeepAliveForever, nil); err != nil {
				b.Fatal(err)
			}
			var offT, onT time.Duration
			ratios := make([]float64, 0, b.N)
			timed := func(c *vramguard.OllamaClient) time.Duration {
				runtime.GC()
				start := time.Now()
				stream(c)
				return time.Since(start)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var offD, onD time.Duration
				if i%2 == 0 {
					offD = timed(off)
					onD = timed(on)
				} else {
					onD = timed(on)
					offD = timed(off)
				}
				offT, onT = offT+offD, onT+onD
				ratios = append(ratios, float64(onD)/float64(offD))
			}
			slices.Sort(ratios)
			b.ReportMetric(float64(offT.Nanoseconds())/float64(b.N), "off-ns/op")
			b.ReportMetric(float64(onT.Nanoseconds())/float64(b.N), "on-ns/op")
			b.ReportMetric(float64(onT)/float64(offT), "ratio")
			b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
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
