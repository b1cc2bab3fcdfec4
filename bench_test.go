package vramguard_test

// Benchmarks of BENCHMARKS.md for the root package; scripts/bench.sh runs
// them (`make bench`). The figures against real Ollama servers are in
// internal/suites/benchreal.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/benchstream"
	"github.com/vramguard/vramguard/vramguardtest"
)

// streamChunks is the number of text chunks of the benchmark stream
// (benchstream's fixture, BENCHMARKS.md §1); the done line makes
// streamChunks+1 callbacks per generation.
const streamChunks = benchstream.Chunks

// streamServer starts benchstream's server, which answers every
// /api/generate (and /api/chat) with the same pre-rendered stream, so that
// a benchmark measures client cost only. It returns the server's URL and an
// HTTP client with its own transport; both are closed at the end of b.
func streamServer(b *testing.B) (*url.URL, *http.Client) {
	b.Helper()
	u := benchstream.Server(b)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	b.Cleanup(tr.CloseIdleConnections) // runs before the server's close
	return u, &http.Client{Transport: tr}
}

// streamVramguard is one generation through GenerateStreaming with a
// callback that counts the chunks (benchstream.Generate).
func streamVramguard(b *testing.B, c *vramguard.OllamaClient) { benchstream.Generate(b, c) }

// streamRaw is what a correct user of api.Client does without vramguard:
// count, accumulate the text and check that done arrived (a stream that
// ends early returns nil).
func streamRaw(b *testing.B, client *api.Client) {
	var (
		text strings.Builder
		n    int
		done bool
	)
	err := client.Generate(context.Background(), &api.GenerateRequest{Model: "bench", Prompt: "a castle at dawn", KeepAlive: &api.Duration{}},
		func(r api.GenerateResponse) error {
			n++
			text.WriteString(r.Response)
			if r.Done {
				done = true
			}
			return nil
		})
	if err != nil {
		b.Fatal(err)
	}
	if !done || n != streamChunks+1 || text.Len() == 0 {
		b.Fatalf("done %v, %d callbacks, %d bytes", done, n, text.Len())
	}
}

func newStreamClients(b *testing.B) (*vramguard.OllamaClient, *api.Client) {
	u, hc := streamServer(b)
	c, err := vramguard.NewClient(vramguard.Options{Host: u.String(), HTTPClient: hc})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c, api.NewClient(u, hc)
}

// BenchmarkGenerateStreaming streams streamChunks chunks through
// OllamaClient.GenerateStreaming. Compare with BenchmarkRawAPIGenerate
// (same stream, same work).
func BenchmarkGenerateStreaming(b *testing.B) {
	b.Run(fmt.Sprintf("chunks=%d", streamChunks), func(b *testing.B) {
		c, _ := newStreamClients(b)
		b.ReportAllocs()
		for b.Loop() {
			streamVramguard(b, c)
		}
	})
}

// BenchmarkRawAPIGenerate streams the same chunks through api.Client.Generate.
func BenchmarkRawAPIGenerate(b *testing.B) {
	b.Run(fmt.Sprintf("chunks=%d", streamChunks), func(b *testing.B) {
		_, client := newStreamClients(b)
		b.ReportAllocs()
		for b.Loop() {
			streamRaw(b, client)
		}
	})
}

// BenchmarkStreamingPaired runs both generations in every iteration, in
// alternating order, so that drift and noisy neighbours hit both alike; it
// reports each side's time (raw-ns/op, vramguard-ns/op), their ratio
// (vramguard/raw) and the other metrics of benchstream.Paired (allocations
// per side, median-ratio). ns/op is the pair. Each side starts after a GC
// (untimed), so that both start from the same heap and the collections a
// generation triggers are its own.
func BenchmarkStreamingPaired(b *testing.B) {
	b.Run(fmt.Sprintf("chunks=%d", streamChunks), func(b *testing.B) {
		c, client := newStreamClients(b)
		benchstream.PairedAs(b, "raw", "vramguard", func() { streamRaw(b, client) }, func() { streamVramguard(b, c) })
	})
}

// BenchmarkCleanupAsync measures CleanupAsync with a verified unload of a
// loaded model on the simulator. ns/op is the whole round trip (the call
// plus the background unload, joined with Wait); call-ns/op is the call
// alone, the time a caller waits; call-allocs/op are the call's own
// allocations (testing.AllocsPerRun, GOMAXPROCS 1, so the background work
// does not run while they are counted). The model's load before each
// iteration is not timed.
func BenchmarkCleanupAsync(b *testing.B) {
	const model = "bench"
	s := vramguardtest.New(vramguardtest.Config{
		Models:      []vramguardtest.ModelConfig{{Name: model, Chunks: 1}},
		UnloadDelay: -1, // the runner leaves /api/ps as soon as it is unloaded
	})
	defer s.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	c, err := vramguard.NewClient(vramguard.Options{
		Host:         s.URL().String(),
		HTTPClient:   &http.Client{Transport: tr},
		PollInterval: time.Millisecond,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			b.Error(err)
		}
	}()
	ctx := context.Background()
	opts := vramguard.CleanupOptions{Models: []string{model}}
	load := func() {
		if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: model, Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
			b.Fatal(err)
		}
		if !s.Listed(model) {
			b.Fatal("model not loaded")
		}
	}

	var call time.Duration
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		load()
		b.StartTimer()
		start := time.Now()
		task := c.CleanupAsync(ctx, opts)
		call += time.Since(start)
		rep, err := task.Wait()
		if err != nil {
			b.Fatal(err)
		}
		if len(rep.Unloads) != 1 || !rep.Unloads[0].Verified {
			b.Fatalf("report %+v", rep.Unloads)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(call.Nanoseconds())/float64(b.N), "call-ns/op")

	// The call's own allocations. The model is not loaded: the pending
	// cleanups only check that, after the count.
	tasks := make([]*vramguard.CleanupTask, 0, 64)
	allocs := testing.AllocsPerRun(50, func() { tasks = append(tasks, c.CleanupAsync(ctx, opts)) })
	for _, t := range tasks {
		if _, err := t.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(allocs, "call-allocs/op")
}

// noop is the work of BenchmarkGuardRun: nothing, and not inlined, so the
// direct call is a real call.
//
//go:noinline
func noop(context.Context, *vramguard.Session) error { return nil }

// BenchmarkGuardRun measures Guard.Run's own cost: KeepLoaded, so no
// unload runs, around a function that does nothing, against a direct call.
// retained-B/op is the live heap left per call after a GC (0 unless every
// call leaves something behind, such as a map entry that is never deleted).
func BenchmarkGuardRun(b *testing.B) {
	const model = "bench"
	b.Run("direct", func(b *testing.B) {
		ctx := context.Background()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := noop(ctx, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guard", func(b *testing.B) {
		// The server is never contacted: nothing is generated or unloaded.
		c, err := vramguard.NewClient(vramguard.Options{Host: "127.0.0.1:9"})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		g := vramguard.Guard{Client: c, KeepLoaded: true}
		ctx := context.Background()
		before := liveHeap()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := g.Run(ctx, model, noop); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		retained := max(int64(liveHeap())-int64(before), 0)
		b.ReportMetric(float64(retained)/float64(b.N), "retained-B/op")
		if n := vramguard.Users(c, model); n != 0 {
			b.Fatalf("%d users left after %d runs", n, b.N)
		}
	})
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkUnloadRequest is the evidence for a recommendation in
// BENCHMARKS.md: one unload request (what UnloadModel sends per attempt)
// through api.Client.Generate, which allocates an 8 MiB line buffer per
// call, against the same request as a plain HTTP POST. The server is local
// and static; only client cost differs.
func BenchmarkUnloadRequest(b *testing.B) {
	const reply = `{"model":"bench","created_at":"2025-11-29T16:49:16.123456789Z","response":"","done":true,"done_reason":"unload"}` + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, reply)
	}))
	defer srv.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	u, err := url.Parse(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("client=api.Generate", func(b *testing.B) {
		client := api.NewClient(u, hc)
		stream := false
		b.ReportAllocs()
		for b.Loop() {
			var done bool
			err := client.Generate(ctx, &api.GenerateRequest{Model: "bench", KeepAlive: &api.Duration{}, Stream: &stream},
				func(r api.GenerateResponse) error { done = r.Done; return nil })
			if err != nil || !done {
				b.Fatal(err, done)
			}
		}
	})
	b.Run("client=http.Post", func(b *testing.B) {
		endpoint := u.JoinPath("/api/generate").String()
		b.ReportAllocs()
		for b.Loop() {
			resp, err := hc.Post(endpoint, "application/json", strings.NewReader(`{"model":"bench","keep_alive":0,"stream":false}`))
			if err != nil {
				b.Fatal(err)
			}
			var r api.GenerateResponse
			err = json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || !r.Done {
				b.Fatal(err, resp.Status, r.Done)
			}
		}
	})
}

// BenchmarkLeaseCheckPaired is issue #26's overhead target: a generation
// with KeepAliveUnload (the guard's) looks for leases on its model before
// it goes out; with no lease present that is one read of an empty lease
// directory. Both clients stream the same fixture in every iteration, in
// alternating order (benchstream.Paired), one with leases off (the library
// before #26), one with its own empty lease directory; ratio is on/off.
func BenchmarkLeaseCheckPaired(b *testing.B) {
	b.Run(fmt.Sprintf("chunks=%d", streamChunks), func(b *testing.B) {
		u, hc := streamServer(b)
		client := func(l vramguard.LeaseOptions) *vramguard.OllamaClient {
			c, err := vramguard.NewClient(vramguard.Options{Host: u.String(), HTTPClient: hc, Leases: l})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			return c
		}
		off := client(vramguard.LeaseOptions{Off: true})
		on := client(vramguard.LeaseOptions{Dir: filepath.Join(b.TempDir(), "leases")})
		benchstream.Paired(b, func() { streamVramguard(b, off) }, func() { streamVramguard(b, on) })
	})
}
