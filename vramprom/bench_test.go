package vramprom_test

// Issue #27's overhead target for the Prometheus adapter: BENCHMARKS.md
// §12.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramprom"
)

// streamChunks is the number of text chunks of BENCHMARKS.md §1's stream,
// the one issue #27's overhead target is judged on.
const streamChunks = 10_000

// streamBody renders an /api/generate reply of n text chunks and a done
// line, as the root's bench_test.go does for BenchmarkStreamingPaired.
func streamBody(n int) []byte {
	const created = "2025-11-29T16:49:16.123456789Z"
	words := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa")
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `{"model":"bench","created_at":%q,"response":" %s","done":false}`+"\n", created, words[i%len(words)])
	}
	fmt.Fprintf(&buf, `{"model":"bench","created_at":%q,"response":"","done":true,"done_reason":"stop",`+
		`"context":[1,2,3,4,5,6,7,8],"total_duration":2000000000,"load_duration":1000000,`+
		`"prompt_eval_count":8,"prompt_eval_duration":1000000,"eval_count":%d,"eval_duration":1500000000}`+"\n", created, n)
	return buf.Bytes()
}

// streamClients starts a server that answers every /api/generate with the
// same pre-rendered stream of streamChunks chunks (so that only client
// cost is measured), and returns a client of it without hooks and one
// with h, each with its own transport; all are closed at the end of b.
func streamClients(b *testing.B, h vramguard.Hooks) (off, on *vramguard.OllamaClient) {
	b.Helper()
	body := streamBody(streamChunks)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/api/generate" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	client := func(h vramguard.Hooks) *vramguard.OllamaClient {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		c, err := vramguard.NewClient(vramguard.Options{Host: srv.URL, HTTPClient: &http.Client{Transport: tr}, Hooks: h,
			Leases: vramguard.LeaseOptions{Off: true}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(tr.CloseIdleConnections) // before srv.Close
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	return client(vramguard.Hooks{}), client(h)
}

// streamOnce is one generation of the stream, with a callback that counts
// the chunks.
func streamOnce(b *testing.B, c *vramguard.OllamaClient) {
	n := 0
	gen, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "bench", Prompt: "a castle at dawn"},
		vramguard.KeepAliveUnload, func(vramguard.Chunk) error { n++; return nil })
	if err != nil {
		b.Fatal(err)
	}
	if n != streamChunks+1 || gen.Chunks != n || len(gen.Text) == 0 {
		b.Fatalf("%d callbacks, %d chunks, %d bytes", n, gen.Chunks, len(gen.Text))
	}
}

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
// after an untimed GC, as the root's BenchmarkStreamingPaired does.
// off-ns/op and on-ns/op are each side's time, ratio is on/off over the
// run, median-ratio the median of the iterations' on/off (which a burst
// in one iteration moves less); ns/op is the pair with its GCs.
// hooks=none is the control: "on" has no hooks either, so its ratios are
// the noise of the measurement on this machine at the time.
func BenchmarkStreamingPaired(b *testing.B) {
	for _, hooks := range []string{"vramprom", "none"} {
		b.Run(fmt.Sprintf("chunks=%d/hooks=%s", streamChunks, hooks), func(b *testing.B) {
			var h vramguard.Hooks
			if hooks == "vramprom" {
				h = benchCollector(b).Hooks()
			}
			off, on := streamClients(b, h)
			streamOnce(b, off) // connections made, untimed
			streamOnce(b, on)
			paired(b, func() { streamOnce(b, off) }, func() { streamOnce(b, on) })
		})
	}
}

// paired runs off and on in each of b.N iterations, in alternating order,
// each after an untimed GC, so that drift and noisy neighbours hit both
// alike. It reports off-ns/op and on-ns/op, off-allocs/op and
// on-allocs/op (the process's allocations while each side ran, background
// goroutines' included), ratio (on/off over the run) and median-ratio
// (the median of the iterations' on/off, which a burst in one iteration
// moves less).
func paired(b *testing.B, off, on func()) {
	var ms runtime.MemStats
	timed := func(f func(), allocs *uint64) time.Duration {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.Mallocs
		start := time.Now()
		f()
		d := time.Since(start)
		runtime.ReadMemStats(&ms) // untimed, as the GC is
		*allocs += ms.Mallocs - before
		return d
	}
	var offT, onT time.Duration
	var offA, onA uint64
	ratios := make([]float64, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var offD, onD time.Duration
		if i%2 == 0 {
			offD = timed(off, &offA)
			onD = timed(on, &onA)
		} else {
			onD = timed(on, &onA)
			offD = timed(off, &offA)
		}
		offT, onT = offT+offD, onT+onD
		ratios = append(ratios, float64(onD)/float64(offD))
	}
	slices.Sort(ratios)
	b.ReportMetric(float64(offT.Nanoseconds())/float64(b.N), "off-ns/op")
	b.ReportMetric(float64(onT.Nanoseconds())/float64(b.N), "on-ns/op")
	b.ReportMetric(float64(offA)/float64(b.N), "off-allocs/op")
	b.ReportMetric(float64(onA)/float64(b.N), "on-allocs/op")
	b.ReportMetric(float64(onT)/float64(offT), "ratio")
	b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
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
			off, on := client(vramguard.Hooks{}), client(benchCollector(b).Hooks())
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
			paired(b, func() { stream(off) }, func() { stream(on) })
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
