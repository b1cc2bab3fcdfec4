package integration_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Issue #27, item 4: when a model loads again, the client says why it had
// left, on every server version: its own unload, its budget's eviction,
// another program's unload, the keep-alive, a restart of the server (seen
// by the pid of the server its runner belongs to) and a changed context
// size (Ollama loads the model again for that while it is resident).
func TestReloadCausesOnRealServers(t *testing.T) {
	hour := vramguard.KeepAliveFor(time.Hour)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		cases := []struct {
			name    string
			ka      vramguard.KeepAlive
			ctx2    int // the second generation's num_ctx; 0: as the first
			between func(t *testing.T, c *vramguard.OllamaClient)
			want    vramguard.ReloadCause
			evid    string
		}{
			{"this client unloads it", hour, 0, func(t *testing.T, c *vramguard.OllamaClient) {
				if _, err := c.UnloadModel(t.Context(), modelA); err != nil {
					t.Fatal(err)
				}
			}, vramguard.ReloadUnloaded, "this client unloaded it (unload), verified"},
			{"another program unloads it", hour, 0, func(t *testing.T, c *vramguard.OllamaClient) {
				if err := s.Client().Generate(t.Context(), &api.GenerateRequest{Model: modelA, KeepAlive: &api.Duration{}},
					func(api.GenerateResponse) error { return nil }); err != nil {
					t.Fatal(err)
				}
				waitEmpty(t, s, time.Minute)
			}, vramguard.ReloadForeign, "keep-alive 1h0m0s sent"},
			{"keep-alive 0 ends with the request", vramguard.KeepAliveUnload, 0, func(t *testing.T, c *vramguard.OllamaClient) {
				waitEmpty(t, s, time.Minute)
			}, vramguard.ReloadExpired, "keep-alive 0s sent"},
			{"the context size changes", hour, 256, nil, vramguard.ReloadContextChanged, "num_ctx 256, the load before 128"},
			{"the server restarts", hour, 0, func(t *testing.T, c *vramguard.OllamaClient) {
				skipIfExternal(t, s, "restarts the server")
				if err := s.Restart(t.Context()); err != nil {
					t.Fatal(err)
				}
			}, vramguard.ReloadRestarted, "its runner's server was pid"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				c := newClient(t, s, vramguard.Options{})
				gen := func(numCtx int) *vramguard.Generation {
					t.Helper()
					opts := short(4)
					opts["num_ctx"] = numCtx
					g, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "a castle", Options: opts}, tc.ka, nil)
					if err != nil {
						t.Fatal(err)
					}
					return g
				}
				if g := gen(128); !g.Loaded || g.Reload != nil {
					t.Fatalf("first generation: loaded %v, reload %+v; want a first load", g.Loaded, g.Reload)
				}
				if tc.between != nil {
					tc.between(t, c)
				}
				g := gen(max(tc.ctx2, 128))
				if !g.Loaded || g.Reload == nil || g.Reload.Cause != tc.want || !strings.Contains(g.Reload.Evidence, tc.evid) {
					t.Fatalf("second generation: loaded %v, reload %+v; want cause %q with evidence %q", g.Loaded, g.Reload, tc.want, tc.evid)
				}
				t.Logf("%s: %s (%s)", tc.name, g.Reload.Cause, g.Reload.Evidence)
				if _, err := c.UnloadModel(t.Context(), modelA); err != nil {
					t.Fatal(err)
				}
			})
		}
		t.Run("the budget evicts it", func(t *testing.T) {
			testReloadAfterEviction(t, s)
		})
	})
}

// testReloadAfterEviction: a budget whose cap holds either model but not
// both evicts the first to load the second, and the first's next load
// names that eviction. The device is the public fake that follows the
// server's /api/ps.
func testReloadAfterEviction(t *testing.T, s *ollamatest.Server) {
	// The cap is the larger estimate: either model fits alone, and, with
	// the sizes the server lists for the one loaded, not both.
	probe := newClient(t, s, vramguard.Options{})
	est := map[string]uint64{}
	for _, m := range []string{modelA, modelB} {
		e, err := probe.EstimateModel(t.Context(), m, 0)
		if err != nil {
			t.Fatal(err)
		}
		est[m] = uint64(e.Total)
	}
	capBytes := max(est[modelA], est[modelB])
	gpu := &vramguardtest.PSGPU{Client: s.Client(), Total: 1 << 40}
	c := newClient(t, s, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{MaxBytes: capBytes, MakeRoom: true}})
	var last *vramguard.Generation
	for _, m := range []string{modelA, modelB, modelA} {
		g, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: m, Prompt: "a castle", Options: short(4)},
			vramguard.KeepAliveFor(time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		last = g
	}
	if r := last.Reload; r == nil || r.Cause != vramguard.ReloadEvicted || r.Unload != vramguard.CauseBudget {
		t.Fatalf("%s's second load: reload %+v; want ReloadEvicted by the budget", modelA, r)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
	defer cancel()
	if _, err := c.UnloadAll(ctx); err != nil {
		t.Fatal(err)
	}
}

// Two calls of one client sent at once for a model that is not loaded
// wait for one load, and Ollama reports a load_duration to each: the
// client reports the load once (Generation.Loaded, OnCallEnd), so the
// loads metric counts one load (composition oracle seed
// 1796171620578333446; it counted one per waiter).
func TestOneLoadCountedOnceOnRealServers(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		var mu sync.Mutex
		told := 0
		c := newClient(t, s, vramguard.Options{Hooks: vramguard.Hooks{OnCallEnd: func(_ context.Context, e vramguard.CallEnd) {
			if e.Generation != nil && e.Generation.Loaded {
				mu.Lock()
				told++
				mu.Unlock()
			}
		}}})
		gens := make([]*vramguard.Generation, 2)
		var wg sync.WaitGroup
		release := make(chan struct{})
		for i := range gens {
			wg.Go(func() {
				<-release
				g, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "a castle", Options: short(4)}, vramguard.KeepAliveFor(time.Minute), nil)
				if err != nil {
					t.Error(err)
				}
				gens[i] = g
			})
		}
		close(release)
		wg.Wait()
		if t.Failed() {
			return
		}
		defer func() {
			if _, err := c.UnloadModel(context.Background(), modelA); err != nil {
				t.Error(err)
			}
		}()
		const threshold = 10 * time.Millisecond // Options.LoadThreshold's default
		for i, g := range gens {
			t.Logf("call %d: load_duration %v, total %v, Loaded %v", i, g.Metrics.LoadDuration, g.Metrics.TotalDuration, g.Loaded)
			if g.Metrics.LoadDuration < threshold {
				t.Skipf("call %d did not wait for the load (load_duration %v): the calls did not overlap on this machine", i, g.Metrics.LoadDuration)
			}
		}
		reported := 0
		for _, g := range gens {
			if g.Loaded {
				reported++
			}
		}
		if reported != 1 || told != 1 {
			t.Errorf("%d calls report Loaded and OnCallEnd was told %d loads for one load; want 1 and 1", reported, told)
		}
		if ms := running(t, s); len(ms) != 1 {
			t.Errorf("/api/ps lists %v, want %s once", ms, modelA)
		}
	})
}
