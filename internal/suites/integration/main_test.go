package integration_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"go.uber.org/goleak"
)

// pool holds one server per version for the whole package; TestMain stops
// them after the tests, panics included, and then checks for leaks.
var pool = ollamatest.NewPool(ollamatest.Options{})

func TestMain(m *testing.M) {
	if spec := os.Getenv(leaseHolderEnv); spec != "" {
		leaseHolderMain(spec) // TestLeasesAcrossProcesses's program A; never returns
	}
	goleak.VerifyTestMain(pool.Wrap(m))
}

const (
	modelA = ollamatest.ModelA // the small model
	modelB = ollamatest.ModelB // the larger one
)

// eachVersion runs fn as a subtest per server version, on a server with both
// models registered.
func eachVersion(t *testing.T, fn func(t *testing.T, s *ollamatest.Server)) {
	versions(t, pool.Require, fn)
}

// eachVersionAlone is eachVersion on servers of the test's own, and runs
// the test in parallel with the other tests that use it (after the
// package's sequential tests). It is for the long race tests of issue #13,
// which spend most of their time watching that a model stays absent: on
// servers of their own, each one's watches overlap the others' work.
func eachVersionAlone(t *testing.T, fn func(t *testing.T, s *ollamatest.Server)) {
	t.Parallel()
	versions(t, ollamatest.Require, fn)
}

func versions(t *testing.T, require func(testing.TB, string) *ollamatest.Server, fn func(t *testing.T, s *ollamatest.Server)) {
	for _, v := range ollamatest.Versions() {
		t.Run("ollama-"+v, func(t *testing.T) {
			s := require(t, v)
			if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
				t.Fatalf("register models: %v", err)
			}
			// Every case starts and must end with nothing resident.
			requireEmpty(t, s, "before the case")
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				c := newClient(t, s, vramguard.Options{})
				if reps, err := c.UnloadAll(ctx); err != nil || len(reps) > 0 {
					t.Errorf("models left resident after the case: %v (err %v)", reps, err)
					restartStuck(t, s)
				}
			})
			fn(t, s)
		})
	}
}

// restartStuck restarts a server that a case left with models resident
// (v0.6.5 once kept a model loaded for 30 s on a busy machine and then
// refused to unload it), so that the failure stays the case's own instead of
// failing every later case on "before the case". The case has already been
// marked failed; an external server is left as it is.
func restartStuck(t *testing.T, s *ollamatest.Server) {
	t.Helper()
	if s.External() {
		return
	}
	// A server that died says why (Ollama up to v0.32.3 can die in
	// /api/ps: README, known server issues; ReportDeath marks that crash
	// for scripts/test-integration.sh); one that lives shows its last words.
	if !ollamatest.ReportDeath(t, s) {
		t.Logf("ollama %s log before the restart:\n%s", s.Version(), s.LogTail(3000))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Restart(ctx); err != nil {
		t.Errorf("restart the server after the leftover: %v", err)
		return
	}
	// Not running(t, s): t.Context() is done once cleanups run.
	resp, err := s.Client().ListRunning(ctx)
	if err != nil {
		t.Errorf("/api/ps after the restart: %v", err)
		return
	}
	if len(resp.Models) != 0 {
		t.Errorf("after a restart /api/ps still lists %d models", len(resp.Models))
		return
	}
	t.Logf("ollama %s restarted after the leftover; later cases start clean", s.Version())
}

// newClient returns a vramguard client for s, closed at the end of the test.
func newClient(t *testing.T, s *ollamatest.Server, opts vramguard.Options) *vramguard.OllamaClient {
	t.Helper()
	opts.Host = s.URL().String()
	if opts.HTTPClient == nil {
		// Its own transport, so idle connections are closed with the test.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(tr.CloseIdleConnections)
		opts.HTTPClient = &http.Client{Transport: tr}
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 25 * time.Millisecond
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

// running lists the server's models with the raw API client. Ollama up
// to v0.32.3 reads its scheduler's map in /api/ps without the lock (README,
// known server issues): polled every 5 ms while a model unloaded, v0.17.4
// once answered 500 with no error text ("something went wrong" in the api
// client) and went on serving. Such a failure is read again, as the
// library's own polls do.
func running(t *testing.T, s *ollamatest.Server) []string {
	t.Helper()
	var resp *api.ProcessResponse
	var err error
	for try := 0; try < 3; try++ {
		if resp, err = s.Client().ListRunning(t.Context()); err == nil {
			break
		}
		t.Logf("/api/ps (try %d): %v", try+1, err)
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("/api/ps: %v", err)
	}
	var names []string
	for _, m := range resp.Models {
		names = append(names, m.Model)
	}
	return names
}

func requireEmpty(t *testing.T, s *ollamatest.Server, when string) {
	t.Helper()
	if ms := running(t, s); len(ms) != 0 {
		t.Fatalf("%s: /api/ps lists %v, want nothing", when, ms)
	}
}

// waitEmpty polls /api/ps until it is empty, returning how long that took.
func waitEmpty(t *testing.T, s *ollamatest.Server, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ms := running(t, s)
		if len(ms) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("/api/ps still lists %v after %v", ms, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func short(n int) map[string]any {
	return map[string]any{"num_predict": n, "temperature": 0.7, "seed": 1}
}

func req(model string, n int) *vramguard.GenerateRequest {
	return &vramguard.GenerateRequest{Model: model, Prompt: "a castle at dawn", Options: short(n)}
}

func mustKind(t *testing.T, err error, k vramguard.Kind) {
	t.Helper()
	if !errors.Is(err, k) {
		t.Fatalf("got %v (kind %v), want %v", err, vramguard.KindOf(err), k)
	}
}

func skipIfExternal(t *testing.T, s *ollamatest.Server, why string) {
	t.Helper()
	if s.External() {
		t.Skipf("external server (%s): %s", os.Getenv(ollamatest.EnvHost), why)
	}
}
