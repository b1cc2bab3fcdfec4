package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/testkit/benchstream"
)

// benchChunks is the length of the benchmark's stream, as the root
// package's streaming benchmarks (BENCHMARKS.md §1).
const benchChunks = 10_000

// streamFixture is an Ollama stand-in that answers /api/ps with the model
// "bench" resident (so that the gate's admission is the resident check
// every request makes) and /api/generate with n numbered chunks and a done
// line, pre-rendered and written at once as BENCHMARKS.md §1's fixture
// writes them (flushEach false), or flushed chunk by chunk as Ollama
// flushes them, at full speed (flushEach true: the worst case for a
// proxy, one read and one write per chunk).
func streamFixture(tb testing.TB, n int, flushEach bool) *httptest.Server {
	tb.Helper()
	lines := make([][]byte, 0, n+1)
	for i := range n {
		lines = append(lines, fmt.Appendf(nil, `{"model":"bench","created_at":"2026-12-02T00:00:00Z","response":"c%05d ","done":false}`+"\n", i))
	}
	lines = append(lines, []byte(`{"model":"bench","created_at":"2026-12-02T00:00:00Z","response":"","done":true,"done_reason":"stop","eval_count":1}`+"\n"))
	body := bytes.Join(lines, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/ps", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"models":[{"name":"bench:latest","model":"bench:latest","size":1,"size_vram":0,"expires_at":"2099-01-01T00:00:00Z"}]}`)
	})
	mux.HandleFunc("POST /api/generate", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		if !flushEach {
			_, _ = w.Write(body)
			return
		}
		f := w.(http.Flusher)
		for _, l := range lines {
			if _, err := w.Write(l); err != nil {
				return
			}
			f.Flush()
		}
	})
	s := httptest.NewServer(mux)
	tb.Cleanup(s.Close)
	return s
}

// readStream is one generation read as a correct raw client does: every
// chunk counted and checked in order, done required.
func readStream(c *api.Client, n int) error {
	i, done := 0, false
	err := c.Generate(context.Background(), &api.GenerateRequest{Model: "bench", Prompt: "a castle"}, func(r api.GenerateResponse) error {
		if r.Done {
			done = true
			return nil
		}
		if want := fmt.Sprintf("c%05d ", i); r.Response != want {
			return fmt.Errorf("chunk %d is %q, want %q (lost or duplicated)", i, r.Response, want)
		}
		i++
		return nil
	})
	switch {
	case err != nil:
		return err
	case i != n || !done:
		return fmt.Errorf("%d chunks, done %v; want %d and done", i, done, n)
	}
	return nil
}

// BenchmarkStreamThroughGate is the gate's overhead: the same
// 10,000-chunk stream read by Ollama's own client straight from the server
// ("off") and through the gate ("on"), in alternation in every iteration
// (benchstream.Paired: ratio and median-ratio); BENCHMARKS.md §16 has the
// figures (target: at most 1.05× the time). body=once is §1's fixture (the
// reply written at once), body=flushed a server that flushes each chunk at
// full speed.
//
// chunks=10 is the gate's fixed cost per request (the admission's /api/ps
// and the second HTTP hop): on-ns/op less off-ns/op.
func BenchmarkStreamThroughGate(b *testing.B) {
	for _, c := range []struct {
		chunks    int
		flushEach bool
		flags     []string
	}{{benchChunks, false, nil}, {benchChunks, true, nil}, {10, false, nil}, {10, false, []string{"-max-loaded", "2"}}} {
		name := "once"
		if c.flushEach {
			name = "flushed"
		}
		if c.flags != nil {
			name += "/rules=slots" // the admission reads /api/ps (OllamaClient.Admit)
		}
		b.Run(fmt.Sprintf("chunks=%d/body=%s", c.chunks, name), func(b *testing.B) {
			up := streamFixture(b, c.chunks, c.flushEach)
			g := startGate(b, up.URL, nil, c.flags...)
			straight, through := apiClient(b, up.URL), apiClient(b, g.URL)
			for _, cl := range []*api.Client{straight, through} { // the connections, untimed
				if err := readStream(cl, c.chunks); err != nil {
					b.Fatal(err)
				}
			}
			benchstream.Paired(b, func() {
				if err := readStream(straight, c.chunks); err != nil {
					b.Fatal(err)
				}
			}, func() {
				if err := readStream(through, c.chunks); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkStreamThroughBareProxy is the floor under the gate's figure:
// BenchmarkStreamThroughGate's at-once row through a bare
// httputil.ReverseProxy (FlushInterval -1, nothing else: no admission, no
// guard, no metrics) instead of the gate, paired the same way
// (BENCHMARKS.md §20).
func BenchmarkStreamThroughBareProxy(b *testing.B) {
	up := streamFixture(b, benchChunks, false)
	u, err := url.Parse(up.URL)
	if err != nil {
		b.Fatal(err)
	}
	px := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, FlushInterval: -1})
	b.Cleanup(px.Close)
	straight, through := apiClient(b, up.URL), apiClient(b, px.URL)
	for _, cl := range []*api.Client{straight, through} { // the connections, untimed
		if err := readStream(cl, benchChunks); err != nil {
			b.Fatal(err)
		}
	}
	benchstream.Paired(b, func() {
		if err := readStream(straight, benchChunks); err != nil {
			b.Fatal(err)
		}
	}, func() {
		if err := readStream(through, benchChunks); err != nil {
			b.Fatal(err)
		}
	})
}

// TestManyClients is the load test: 32 clients at once, 8 streams of 500
// chunks each, all through one gate on loopback; every chunk arrives once
// and in order, and every stream ends with its done line.
func TestManyClients(t *testing.T) {
	const clients, streams, chunks = 32, 8, 500
	up := streamFixture(t, chunks, true)
	g := startGate(t, up.URL, nil)
	var wg sync.WaitGroup
	errs := make(chan error, clients*streams)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := apiClient(t, g.URL)
			for j := range streams {
				if err := readStream(c, chunks); err != nil {
					errs <- fmt.Errorf("client %d, stream %d: %w", i, j, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d streams lost, duplicated or cut chunks", n, clients*streams)
	}
	code, _, body := do(t, "GET", g.URL+"/metrics", "")
	if want := fmt.Sprintf(`vramgate_requests_total{client="unnamed",code="200",route="/api/generate"} %d`, clients*streams); code != 200 || !strings.Contains(string(body), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}
