package reliability_test

import (
	"context"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/faultproxy"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/vramguardtest"
	"go.uber.org/goleak"
)

// backend is a server the scenarios run against: the simulator or a real
// Ollama server. Its direct client (not through the proxy) checks what the
// server really has loaded.
type backend struct {
	name   string
	url    *url.URL
	model  string
	sim    *vramguardtest.Server // nil for a real server
	real   *ollamatest.Server    // nil for the simulator
	direct *api.Client
}

// eachBackend runs fn as a subtest on the simulator and on every real
// server version. Each subtest checks, last, that it left no goroutine.
func eachBackend(t *testing.T, fn func(t *testing.T, b *backend)) {
	t.Run("sim", func(t *testing.T) {
		// The pool's real servers may be running: only what the subtest
		// starts must be gone at its end.
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // first cleanup: runs last
		s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{
			Name: "tiny", Chunks: 16, LoadLatency: 30 * time.Millisecond, TokenLatency: time.Millisecond,
		}}})
		t.Cleanup(s.Close)
		fn(t, newBackend(t, "sim", s.URL(), "tiny", s, nil))
	})
	for _, v := range ollamatest.Versions() {
		t.Run("ollama-"+v, func(t *testing.T) {
			s := pool.Require(t, v)
			if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
				t.Fatalf("register models: %v", err)
			}
			s.CloseIdleConnections()
			// The pool's server outlives the subtest: only what the subtest
			// starts from here on must be gone at its end.
			ignore := goleak.IgnoreCurrent()
			t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
			b := newBackend(t, "ollama-"+v, s.URL(), ollamatest.ModelA, nil, s)
			if ms := b.listed(t); len(ms) != 0 {
				t.Fatalf("before the case: /api/ps lists %v", ms)
			}
			t.Cleanup(func() {
				// Leave the shared server empty for the next case.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c := newClient(t, s.URL(), vramguard.Options{})
				if reps, err := c.UnloadAll(ctx); err != nil || len(reps) > 0 {
					t.Errorf("models left resident after the case: %+v (err %v)", reps, err)
				}
			})
			fn(t, b)
		})
	}
}

func newBackend(t *testing.T, name string, u *url.URL, model string, s *vramguardtest.Server, real *ollamatest.Server) *backend {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &backend{name: name, url: u, model: model, sim: s, real: real,
		direct: api.NewClient(u, &http.Client{Transport: tr})}
}

// req is a short generation on the backend's model. The tiny real models
// send about one line per two tokens (byte tokens are held back until they
// form UTF-8): 32 tokens give 14 lines on both versions.
func (b *backend) req(tokens int) *vramguard.GenerateRequest {
	return &vramguard.GenerateRequest{
		Model:   b.model,
		Prompt:  "a castle at dawn",
		Options: map[string]any{"num_predict": tokens, "temperature": 0.7, "seed": 1},
	}
}

// listed returns the models the server lists in /api/ps, asked directly.
func (b *backend) listed(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := b.direct.ListRunning(ctx)
	if err != nil {
		t.Fatalf("/api/ps: %v", err)
	}
	var names []string
	for _, m := range resp.Models {
		names = append(names, m.Model)
	}
	return names
}

// awaitEmpty waits until the server lists nothing, and fails the test
// after limit. The simulator is awaited on its state changes, a real
// server polled.
func (b *backend) awaitEmpty(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	if b.sim != nil {
		if err := b.sim.WaitFor(ctx, func() bool { return len(b.sim.Running()) == 0 }); err != nil {
			t.Fatalf("the simulator still runs %+v after %v", b.sim.Running(), limit)
		}
		return time.Since(start)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ms := b.listed(t)
		if len(ms) == 0 {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("/api/ps still lists %v after %v", ms, limit)
		case <-tick.C:
		}
	}
}

// cancels returns how many requests the simulator saw canceled (0 for a
// real server).
func (b *backend) cancels() int {
	if b.sim != nil {
		return b.sim.Cancelled("")
	}
	return 0
}

// newProxy starts a fault proxy in front of u, closed at the end of the
// test.
func newProxy(t *testing.T, u *url.URL) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(u, faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close proxy: %v", err)
		}
	})
	return p
}

// counters are what the lifecycle hooks told a scenario: the unloads
// begun, the verified ones and the failed cleanups (the unload requests
// that reached the server are the proxy's Stats.Unloads).
type counters struct {
	unloadStarted, evictionVerified, cleanupFailed atomic.Int32
}

func (c *counters) hooks() vramguard.Hooks {
	return vramguard.Hooks{
		OnUnloadStart: func(ctx context.Context, _ vramguard.UnloadStart) context.Context {
			c.unloadStarted.Add(1)
			return ctx
		},
		OnUnloadEnd: func(_ context.Context, e vramguard.UnloadEnd) {
			if e.Err == nil && e.Report.Verified {
				c.evictionVerified.Add(1)
			}
		},
		OnCleanupFailed: func(context.Context, vramguard.CleanupEvent) { c.cleanupFailed.Add(1) },
	}
}

// clientUnloadTimeout is the test clients' UnloadTimeout unless a case
// sets its own.
const clientUnloadTimeout = 10 * time.Second

// testTimeouts are generous defaults: a case that hangs fails on them
// rather than on the test binary's timeout.
var testTimeouts = vramguard.Timeouts{FirstChunk: 20 * time.Second, Idle: 10 * time.Second, Total: time.Minute}

// newClient returns a vramguard client for u with its own transport; both
// are closed at the end of the test (Close errors are the test's to check
// when it closes the client itself first).
func newClient(t *testing.T, u *url.URL, opts vramguard.Options) *vramguard.OllamaClient {
	c, _ := newClientTransport(t, u, opts)
	return c
}

// newClientTransport is newClient that also returns the client's HTTP
// transport, to close its idle connections.
func newClientTransport(t *testing.T, u *url.URL, opts vramguard.Options) (*vramguard.OllamaClient, *http.Transport) {
	t.Helper()
	tr := &http.Transport{}
	opts.Host = u.String()
	opts.HTTPClient = &http.Client{Transport: tr}
	if opts.Timeouts == (vramguard.Timeouts{}) {
		opts.Timeouts = testTimeouts
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 25 * time.Millisecond
	}
	if opts.UnloadTimeout == 0 {
		opts.UnloadTimeout = clientUnloadTimeout
	}
	if opts.CleanupTimeout == 0 {
		opts.CleanupTimeout = 20 * time.Second
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		tr.CloseIdleConnections()
	})
	return c, tr
}

func simModel(name string, chunks int, token, load time.Duration) vramguardtest.ModelConfig {
	return vramguardtest.ModelConfig{Name: name, Chunks: chunks, TokenLatency: token, LoadLatency: load}
}
