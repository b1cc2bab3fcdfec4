package nodes

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// newSim starts a simulator with the given models; it is closed at the end
// of the test.
func newSim(t *testing.T, models ...vramguardtest.ModelConfig) *vramguardtest.Server {
	t.Helper()
	s := vramguardtest.New(vramguardtest.Config{Models: models})
	t.Cleanup(s.Close)
	return s
}

// newClient returns a client for s with fast polling; it is closed at the
// end of the test and must close cleanly. rec, if not nil, records the
// generate requests.
func newClient(t *testing.T, s *vramguardtest.Server, rec *recorder) *vramguard.OllamaClient {
	t.Helper()
	opts := vramguard.Options{
		Host:          s.URL().String(),
		PollInterval:  5 * time.Millisecond,
		UnloadTimeout: 5 * time.Second,
	}
	if rec != nil {
		opts.HTTPClient = &http.Client{Transport: rec}
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// recorder is an HTTP transport that records the generate requests with a
// prompt (what the simulator's Respond does not see: options, think) and
// passes everything on to http.DefaultTransport, whose idle connections
// the simulator's Close ends.
type recorder struct {
	mu   sync.Mutex
	reqs []api.GenerateRequest
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/api/generate" && req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		var g api.GenerateRequest
		if json.Unmarshal(b, &g) == nil && g.Prompt != "" {
			r.mu.Lock()
			r.reqs = append(r.reqs, g)
			r.mu.Unlock()
		}
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	return http.DefaultTransport.RoundTrip(req)
}

func (r *recorder) requests() []api.GenerateRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]api.GenerateRequest(nil), r.reqs...)
}

// reply scripts a model that answers every prompt with parts, one chunk
// each.
func reply(parts ...string) func(string) []vramguardtest.Chunk {
	return func(string) []vramguardtest.Chunk { return textChunks(parts...) }
}

func textChunks(parts ...string) []vramguardtest.Chunk {
	out := make([]vramguardtest.Chunk, len(parts))
	for i, p := range parts {
		out[i] = vramguardtest.Chunk{Text: p}
	}
	return out
}

// words splits s into word chunks, the spaces kept, as a model streams.
func words(s string) []string {
	var out []string
	for _, w := range strings.SplitAfter(s, " ") {
		if w != "" {
			out = append(out, w)
		}
	}
	return out
}

// eventually waits for cond on the simulator's state changes.
func eventually(t *testing.T, s *vramguardtest.Server, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
