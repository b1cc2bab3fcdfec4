// Package benchstream is BENCHMARKS.md §1's stream fixture and the paired
// runner of §1 and §12 (§11's lease check uses it too), shared by the
// benchmarks of the root package, vramotel and vramprom: a local server that answers /api/generate and
// /api/chat with pre-rendered NDJSON replies of Chunks text chunks and a
// done line (so that a benchmark measures client cost only), clients of
// it, one counted generation, and Paired, which times two sides in
// alternation.
package benchstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
)

// Chunks is the number of text chunks of the benchmark stream; the done
// line makes Chunks+1 callbacks per generation.
const Chunks = 10_000

// GenerateBody renders an Ollama /api/generate reply of n text chunks and
// a final done line, as the server writes it.
func GenerateBody(n int) []byte {
	return render(n, `{"model":"bench","created_at":%q,"response":" %s","done":false}`,
		`{"model":"bench","created_at":%q,"response":"","done":true,"done_reason":"stop",`+
			`"context":[1,2,3,4,5,6,7,8],"total_duration":2000000000,"load_duration":1000000,`+
			`"prompt_eval_count":8,"prompt_eval_duration":1000000,"eval_count":%d,"eval_duration":1500000000}`)
}

// ChatBody renders an Ollama /api/chat reply of n text chunks and a final
// done line: the same words as GenerateBody, in message.content.
func ChatBody(n int) []byte {
	return render(n, `{"model":"bench","created_at":%q,"message":{"role":"assistant","content":" %s"},"done":false}`,
		`{"model":"bench","created_at":%q,"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",`+
			`"total_duration":2000000000,"load_duration":1000000,`+
			`"prompt_eval_count":8,"prompt_eval_duration":1000000,"eval_count":%d,"eval_duration":1500000000}`)
}

// render writes n lines of chunk (formatted with the creation time and a
// word) and the done line (with the time and n).
func render(n int, chunk, done string) []byte {
	const created = "2025-11-29T16:49:16.123456789Z"
	words := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa")
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, chunk+"\n", created, words[i%len(words)])
	}
	fmt.Fprintf(&buf, done+"\n", created, n)
	return buf.Bytes()
}

// Server starts a local HTTP server that answers every /api/generate with
// GenerateBody(Chunks) and every /api/chat with ChatBody(Chunks), and any
// other path with 404. It returns the server's URL; the server is closed
// at the end of tb, after the cleanups registered later (such as the
// clients' of Client).
func Server(tb testing.TB) *url.URL {
	tb.Helper()
	bodies := map[string][]byte{"/api/generate": GenerateBody(Chunks), "/api/chat": ChatBody(Chunks)}
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
	tb.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// Client is a client of the server at u with hooks h, its own transport
// and leases off; the client is closed and the transport's idle
// connections dropped at the end of tb (before a Server started earlier
// in tb closes).
func Client(tb testing.TB, u *url.URL, h vramguard.Hooks) *vramguard.OllamaClient {
	tb.Helper()
	return client(tb, vramguard.Options{Host: u.String(), Hooks: h})
}

// client is a client with o, its own transport and leases off, closed at
// the end of tb.
func client(tb testing.TB, o vramguard.Options) *vramguard.OllamaClient {
	tb.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	o.HTTPClient, o.Leases = &http.Client{Transport: tr}, vramguard.LeaseOptions{Off: true}
	c, err := vramguard.NewClient(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(tr.CloseIdleConnections)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Generate is one generation of the stream through GenerateStreaming
// (KeepAliveUnload, as a guard sends it) with a callback that counts the
// chunks; it fails tb unless there were Chunks+1 of them and some text.
// It is what benchmarks time, so it calls no tb.Helper.
func Generate(tb testing.TB, c *vramguard.OllamaClient) {
	n := 0
	gen, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "bench", Prompt: "a castle at dawn"},
		vramguard.KeepAliveUnload, func(vramguard.Chunk) error { n++; return nil })
	if err != nil {
		tb.Fatal(err)
	}
	if n != Chunks+1 || gen.Chunks != n || len(gen.Text) == 0 {
		tb.Fatalf("%d callbacks, %d chunks, %d bytes", n, gen.Chunks, len(gen.Text))
	}
}

// HooksPaired is §12's BenchmarkStreamingPaired of an adapter: for each of
// "hooks=name" and the control "hooks=none", a sub-benchmark
// "chunks=Chunks/hooks=…" streams the fixture of Server through a Client
// without hooks ("off") and one with the hooks ("on": hooks(b) for name,
// none for the control, whose ratios are then the measurement's own
// noise), one untimed generation each to make the connections, then
// Paired on Generate.
func HooksPaired(b *testing.B, name string, hooks func(*testing.B) vramguard.Hooks) {
	for _, side := range []string{name, "none"} {
		b.Run(fmt.Sprintf("chunks=%d/hooks=%s", Chunks, side), func(b *testing.B) {
			var h vramguard.Hooks
			if side == name {
				h = hooks(b)
			}
			u := Server(b)
			off, on := Client(b, u, vramguard.Hooks{}), Client(b, u, h)
			Generate(b, off) // connections made, untimed
			Generate(b, on)
			Paired(b, func() { Generate(b, off) }, func() { Generate(b, on) })
		})
	}
}

// Paired runs off and on in each of b.N iterations, in alternating order
// (off first in even iterations), each after an untimed GC, so that drift
// and noisy neighbours hit both alike. It resets b's timer first and
// reports off-ns/op and on-ns/op, off-allocs/op and on-allocs/op (the
// process's allocations while each side ran, background goroutines'
// included, read untimed), ratio (on/off over the run) and median-ratio
// (the median of the iterations' on/off, which a burst in one iteration
// moves less); ns/op is the pair with its GCs.
func Paired(b *testing.B, off, on func()) {
	PairedAs(b, "off", "on", off, on)
}

// PairedAs is Paired with the sides' metrics named offName-ns/op,
// onName-ns/op, offName-allocs/op and onName-allocs/op; ratio and
// median-ratio are still on/off.
func PairedAs(b *testing.B, offName, onName string, off, on func()) {
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
	b.ReportMetric(float64(offT.Nanoseconds())/float64(b.N), offName+"-ns/op")
	b.ReportMetric(float64(onT.Nanoseconds())/float64(b.N), onName+"-ns/op")
	b.ReportMetric(float64(offA)/float64(b.N), offName+"-allocs/op")
	b.ReportMetric(float64(onA)/float64(b.N), onName+"-allocs/op")
	b.ReportMetric(float64(onT)/float64(offT), "ratio")
	b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
}

// LoadedPaired is §12's short-generation pair (BenchmarkStreamingInstrumented
// of vramotel and vramprom): a server at u with a model "bench" of chunks
// chunks (the simulator), two clients of it as Client makes them but with
// KeepModelsOnClose, "off" without hooks and "on" with h, the model loaded
// once (untimed), then Paired on one KeepAliveForever generation each,
// which must count chunks+1 callbacks from the loaded model. on-ns/op less
// off-ns/op is h's fixed cost per call, around a real HTTP round trip.
func LoadedPaired(b *testing.B, u *url.URL, chunks int, h vramguard.Hooks) {
	b.Helper()
	off := client(b, vramguard.Options{Host: u.String(), KeepModelsOnClose: true})
	on := client(b, vramguard.Options{Host: u.String(), Hooks: h, KeepModelsOnClose: true})
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
	Paired(b, func() { stream(off) }, func() { stream(on) })
}
