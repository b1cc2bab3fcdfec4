package vramguard_test

// Benchmarks of BENCHMARKS.md for the root package; scripts/bench.sh runs
// them (`make bench`). The figures against real Ollama servers are in
// internal/suites/benchreal.

import (
	"bytes"
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
	"github.com/vramguard/vramguard/vramguardtest"
)

// streamChunks is the number of text chunks of the benchmark stream; the
// done line makes streamChunks+1 callbacks per generation.
const streamChunks = 10_000

// streamBody renders an Ollama /api/generate reply of n text chunks and a
// final done line, as the server writes it.
func streamBody(n int) []byte {
	return renderStream(n, `{"model":"bench","created_at":%q,"response":" %s","done":false}`,
		`{"model":"bench","created_at":%q,"response":"","done":true,"done_reason":"stop",`+
			`"context":[1,2,3,4,5,6,7,8],"total_duration":2000000000,"load_duration":1000000,`+
			`"prompt_eval_count":8,"prompt_eval_duration":1000000,"eval_count":%d,"eval_duration":1500000000}`)
}

// chatBody renders an Ollama /api/chat reply of n text chunks and a final
// done line: the same words as streamBody, in message.content.
func chatBody(n int) []byte {
	return renderStream(n, `{"model":"bench","created_at":%q,"message":{"role":"assistant","content":" %s"},"done":false}`,
		`{"model":"bench","created_at":%q,"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",`+
			`"total_duration":2000000000,"load_duration":1000000,`+
			`"prompt_eval_count":8,"prompt_eval_duration":1000000,"eval_count":%d,"eval_duration":1500000000}`)
}

// renderStream writes n lines of chunk (formatted with the creation time
// and a word) and the done line (with the time and n).
func renderStream(n int, chunk, done string) []byte {
	const created = "2025-11-29T16:49:16.123456789Z"
	words := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa")
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, chunk+"\n", created, words[i%len(words)])
	}
	fmt.Fprintf(&buf, done+"\n", created, n)
	return buf.Bytes()
}

// streamServer starts a local HTTP server that answers every
// /api/generate (and /api/chat) with the same pre-rendered stream, so that
// a benchmark measures client cost only. It returns the server's URL and an HTTP
// client with its own transport; both are closed at the end of b.
func streamServer(b *testing.B) (*url.URL, *http.Client) {
	b.Helper()
	bodies := map[string][]byte{"/api/generate": streamBody(streamChunks), "/api/chat": chatBody(streamChunks)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		body, ok := bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(body)
	}))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	b.Cleanup(srv.Close)
	b.Cleanup(tr.CloseIdleConnections) // runs before srv.Close
	u, err := url.Parse(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	return u, &http.Client{Transport: tr}
}

// streamVramguard is one generation through GenerateStreaming with a
// callback that counts the chunks.
func streamVramguard(b *testing.B, c *vramguard.OllamaClient) {
	req := &vramguard.GenerateRequest{Model: "bench", Prompt: "a castle at dawn"}
	n := 0
	gen, err := c.GenerateStreaming(context.Background(), req, vramguard.KeepAliveUnload, func(vramguard.Chunk) error {
		n++
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if n != streamChunks+1 || gen.Chunks != n || len(gen.Text) == 0 {
		b.Fatalf("%d callbacks, %d chunks, %d bytes", n, gen.Chunks, len(gen.Text))
	}
}

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
// reports each side's time and their ratio (vramguard/raw). ns/op is the
// pair. Each side starts after a GC (untimed), so that both start from the
// same heap and the collections a generation triggers are its own.
func BenchmarkStreamingPaired(b *testing.B) {
	b.Run(fmt.Sprintf("chunks=%d", streamChunks), func(b *testing.B) {
		c, client := newStreamClients(b)
		var vg, raw time.Duration
		timed := func(f func()) time.Duration {
			runtime.GC()
			start := time.Now()
			f()
			return time.Since(start)
		}
		for i := 0; i < b.N; i++ {
			if i%2 == 0 {
				raw += timed(func() { streamRaw(b, client) })
				vg += timed(func() { streamVramguard(b, c) })
			} else {
				vg += timed(func() { streamVramguard(b, c) })
				raw += timed(func() { streamRaw(b, client) })
			}
		}
		b.ReportMetric(float64(raw.Nanoseconds())/float64(b.N), "raw-ns/op")
		b.ReportMetric(float64(vg.Nanoseconds())/float64(b.N), "vramguard-ns/op")
		b.ReportMetric(float64(vg)/float64(raw), "ratio")
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
		if n := c.Users(model); n != 0 {
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
// alternating order, one with leases off (the library before #26), one
// with its own empty lease directory; ratio is on/off.
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
		var tOff, tOn time.Duration
		timed := func(c *vramguard.OllamaClient) time.Duration {
			runtime.GC()
			start := time.Now()
			streamVramguard(b, c)
			return time.Since(start)
		}
		for i := 0; i < b.N; i++ {
			if i%2 == 0 {
				tOff += timed(off)
				tOn += timed(on)
			} else {
				tOn += timed(on)
				tOff += timed(off)
			}
		}
		b.ReportMetric(float64(tOff.Nanoseconds())/float64(b.N), "off-ns/op")
		b.ReportMetric(float64(tOn.Nanoseconds())/float64(b.N), "on-ns/op")
		b.ReportMetric(float64(tOn)/float64(tOff), "ratio")
	})
}
