package vramguard_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// churnCase plays what happens to "tiny" between two generations of the
// client (both with the keep-alive ka and the options opts); the second
// one's Generation.Reload must name want.
type churnCase struct {
	name    string
	ka      vramguard.KeepAlive
	between func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient)
	opts2   map[string]any // the second generation's options
	want    vramguard.ReloadCause
	unload  vramguard.UnloadCause // for ReloadUnloaded and ReloadEvicted
	evid    string                // in Evidence
}

func churnCases() []churnCase {
	hour := vramguard.KeepAliveFor(time.Hour)
	return []churnCase{{
		name: "this client unloads it",
		ka:   hour,
		between: func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) {
			if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
				t.Fatal(err)
			}
		},
		want: vramguard.ReloadUnloaded, unload: vramguard.CauseUnloadModel, evid: "this client unloaded it (unload)",
	}, {
		name: "another program unloads it",
		ka:   hour,
		between: func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) {
			zero := &api.Duration{}
			if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", KeepAlive: zero},
				func(api.GenerateResponse) error { return nil }); err != nil {
				t.Fatal(err)
			}
			waitUnlisted(t, s, "tiny")
		},
		want: vramguard.ReloadForeign, evid: "keep-alive 1h0m0s sent",
	}, {
		name: "keep-alive 0 ends with the request",
		ka:   vramguard.KeepAliveUnload,
		between: func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) {
			waitUnlisted(t, s, "tiny")
		},
		want: vramguard.ReloadExpired, evid: "keep-alive 0s sent",
	}, {
		name: "a short keep-alive runs out",
		ka:   vramguard.KeepAliveFor(50 * time.Millisecond),
		between: func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) {
			waitUnlisted(t, s, "tiny")
		},
		want: vramguard.ReloadExpired, evid: "keep-alive 50ms sent",
	}, {
		name:  "the context size changes",
		ka:    hour,
		opts2: map[string]any{"num_ctx": 8192},
		want:  vramguard.ReloadContextChanged, evid: "num_ctx 8192, the load before the server's default",
	}, {
		name: "the server restarts during a generation",
		ka:   hour,
		between: func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) {
			if err := s.FailNext("tiny", vramguardtest.StallAfter(1, time.Hour)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
				done <- err
			}()
			if err := s.WaitFor(t.Context(), func() bool { return s.InFlight("tiny") == 1 }); err != nil {
				t.Fatal(err)
			}
			s.Restart()
			if err := <-done; err == nil {
				t.Fatal("the generation cut by the restart succeeded")
			}
		},
		want: vramguard.ReloadRestarted, evid: "the connection to the server failed",
	}}
}

// The churn report names why a model loaded again, in each case the client
// can tell apart, on the simulator: Generation.Reload, the Generation
// Hooks.OnCallEnd is told (with the call's context) and one INFO log line
// carry the same cause.
func TestReloadCauses(t *testing.T) {
	for _, tc := range churnCases() {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 20 * time.Millisecond})
			var hooked []vramguard.ReloadEvent
			var logs strings.Builder
			type key struct{}
			c := newTestClient(t, s, vramguard.Options{
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
				Hooks: vramguard.Hooks{
					OnCallStart: func(ctx context.Context, _ vramguard.CallStart) context.Context {
						return context.WithValue(ctx, key{}, "call")
					},
					OnCallEnd: func(ctx context.Context, e vramguard.CallEnd) {
						if ctx.Value(key{}) != "call" {
							t.Error("OnCallEnd did not get the call's context")
						}
						if e.Generation != nil && e.Generation.Reload != nil {
							hooked = append(hooked, *e.Generation.Reload)
						}
					},
				},
			})
			gen := func(opts map[string]any) *vramguard.Generation {
				t.Helper()
				g, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x", Options: opts}, tc.ka, nil)
				if err != nil {
					t.Fatal(err)
				}
				return g
			}
			if g := gen(nil); !g.Loaded || g.Reload != nil {
				t.Fatalf("first generation: loaded %v, reload %+v; want a first load", g.Loaded, g.Reload)
			}
			if tc.between != nil {
				tc.between(t, s, c)
			}
			g := gen(tc.opts2)
			if !g.Loaded || g.Reload == nil {
				t.Fatalf("second generation: loaded %v, reload %+v; want a reload", g.Loaded, g.Reload)
			}
			r := g.Reload
			if r.Cause != tc.want || r.Unload != tc.unload || r.Model != "tiny" {
				t.Errorf("reload %+v; want cause %q, unload %q", r, tc.want, tc.unload)
			}
			if !strings.Contains(r.Evidence, tc.evid) {
				t.Errorf("evidence %q; want it to say %q", r.Evidence, tc.evid)
			}
			if len(hooked) != 1 || hooked[0].Cause != tc.want {
				t.Errorf("OnCallEnd saw reloads %+v; want one with cause %q", hooked, tc.want)
			}
			if n := strings.Count(logs.String(), "model loaded again"); n != 1 || !strings.Contains(logs.String(), `cause="`+string(tc.want)+`"`) {
				t.Errorf("log %q: want one line naming the cause", logs.String())
			}
		})
	}
}

// A budget that evicts a model to admit another reports the eviction when
// the first model loads again.
func TestReloadAfterBudgetEviction(t *testing.T) {
	s := newSim(t, vramguardtest.Config{StrictVRAM: true},
		vramguardtest.ModelConfig{Name: "big", SizeVRAM: 8 * gib, LoadLatency: 20 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "mid", SizeVRAM: 6 * gib, LoadLatency: 20 * time.Millisecond})
	if err := s.Reserve("comfyui", 12*gib); err != nil { // 12 GiB free: big (8) or mid (6), not both
		t.Fatal(err)
	}
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{MakeRoom: true}})
	var reloads []*vramguard.ReloadEvent
	for _, m := range []string{"big", "mid", "big"} {
		g, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: m, Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		reloads = append(reloads, g.Reload)
	}
	if reloads[0] != nil || reloads[1] != nil {
		t.Errorf("first loads reported reloads: %+v %+v", reloads[0], reloads[1])
	}
	if r := reloads[2]; r == nil || r.Cause != vramguard.ReloadEvicted || r.Unload != vramguard.CauseBudget {
		t.Errorf("big's second load: %+v; want ReloadEvicted by CauseBudget", r)
	}
}

// A load long after the last use, past Options.ReloadWindow, is no reload;
// a reuse never is.
func TestReloadWindow(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 20 * time.Millisecond})
	c := newTestClient(t, s, vramguard.Options{ReloadWindow: time.Nanosecond})
	for i := range 2 {
		g, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !g.Loaded || g.Reload != nil {
			t.Errorf("generation %d: loaded %v, reload %+v; want a load reported as no reload", i, g.Loaded, g.Reload)
		}
		waitUnlisted(t, s, "tiny")
	}
	w := newTestClient(t, s, vramguard.Options{})
	for i := range 2 {
		g, err := w.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		if g.Reload != nil || g.Loaded != (i == 0) {
			t.Errorf("generation %d: loaded %v, reload %+v; want a load, then a reuse, no reload", i, g.Loaded, g.Reload)
		}
	}
	if _, err := vramguard.NewClient(vramguard.Options{ReloadWindow: -time.Second}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("NewClient with a negative ReloadWindow = %v; want KindInvalidInput", err)
	}
}

// waitUnlisted waits until the simulator no longer lists model.
func waitUnlisted(t *testing.T, s *vramguardtest.Server, model string) {
	t.Helper()
	if err := s.WaitFor(t.Context(), func() bool { return !s.Listed(model) }); err != nil {
		t.Fatal(err)
	}
}

// failOnce resets the next /api/generate request it is armed for.
type failOnce struct {
	rt   http.RoundTripper
	fail atomic.Bool
}

func (f *failOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/api/generate" && f.fail.CompareAndSwap(true, false) {
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return f.rt.RoundTrip(r)
}

// A keep-alive this client sent that ran out is the cause, even when a
// connection failed in between (a failure of another model's request is
// no restart of this one's server).
func TestReloadExpiryBeatsAFailedConnection(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 20 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "other", LoadLatency: 20 * time.Millisecond})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	fl := &failOnce{rt: tr}
	c := newTestClient(t, s, vramguard.Options{HTTPClient: &http.Client{Transport: fl}})
	gen := func(m string) (*vramguard.Generation, error) {
		return c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: m, Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	}
	if _, err := gen("tiny"); err != nil {
		t.Fatal(err)
	}
	waitUnlisted(t, s, "tiny")
	fl.fail.Store(true)
	if _, err := gen("other"); err == nil {
		t.Fatal("the reset request succeeded")
	}
	g, err := gen("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if g.Reload == nil || g.Reload.Cause != vramguard.ReloadExpired {
		t.Errorf("reload %+v; want ReloadExpired (keep-alive 0 sent)", g.Reload)
	}
}
