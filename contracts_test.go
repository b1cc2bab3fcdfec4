package vramguard_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// countingTransport counts the requests a client sends.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// countedClient returns a client for s whose requests are counted. The
// test closes it itself where it needs to; it is closed at the end anyway.
func countedClient(t *testing.T, s *vramguardtest.Server, opts vramguard.Options) (*vramguard.OllamaClient, *countingTransport) {
	t.Helper()
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	ct := &countingTransport{next: inner}
	opts.Host = s.URL().String()
	opts.HTTPClient = &http.Client{Transport: ct}
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, ct
}

// TestClosedClientSendsNothing: after Close, every public method of the
// client, and of a Guard, Session or Phase on it, fails fast with
// ErrClosed (KindUnavailable), runs no caller code and sends no request.
func TestClosedClientSendsNothing(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a"}}})
	t.Cleanup(s.Close)
	c, ct := countedClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}})
	released := 0
	if _, err := c.RegisterTenant(vramguard.Tenant{Name: "r", Device: -1, Release: func(context.Context) error { released++; return nil }}); err != nil {
		t.Fatal(err)
	}
	p, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	released = 0
	before := ct.n.Load()
	called := false
	fn := func(context.Context, *vramguard.Session) error { called = true; return nil }
	req := &vramguard.GenerateRequest{Model: "a", Prompt: "x"}
	calls := map[string]func() error{
		"GenerateStreaming": func() error {
			_, err := c.GenerateStreaming(t.Context(), req, vramguard.KeepAliveUnload, nil)
			return err
		},
		"UnloadModel":      func() error { _, err := c.UnloadModel(t.Context(), "a"); return err },
		"ForceUnloadModel": func() error { _, err := c.ForceUnloadModel(t.Context(), "a"); return err },
		"HoldModel":        func() error { _, err := c.HoldModel(t.Context(), "a", time.Minute); return err },
		"UnloadAll":        func() error { _, err := c.UnloadAll(t.Context()); return err },
		"Cleanup": func() error {
			_, err := c.Cleanup(t.Context(), vramguard.CleanupOptions{AllModels: true, Release: true})
			return err
		},
		"CleanupAsync": func() error {
			_, err := c.CleanupAsync(t.Context(), vramguard.CleanupOptions{AllModels: true}).Wait()
			return err
		},
		"ReleaseVRAM": func() error { _, err := c.ReleaseVRAM(t.Context()); return err },
		"EnsureFree": func() error {
			_, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1})
			return err
		},
		"Running":    func() error { _, err := c.Running(t.Context()); return err },
		"IsResident": func() error { _, err := c.IsResident(t.Context(), "a"); return err },
		"ListModels": func() error { _, err := c.ListModels(t.Context()); return err },
		"ModelBlob":  func() error { _, err := c.ModelBlob(t.Context(), "a"); return err },
		"StartPhase": func() error {
			_, err := c.StartPhase(t.Context(), "q", vramguard.PhaseOptions{})
			return err
		},
		"Guard.Run": func() error {
			g := vramguard.Guard{Client: c, Release: true}
			return g.Run(t.Context(), "a", fn)
		},
		"Guard.Generate": func() error {
			g := vramguard.Guard{Client: c}
			_, err := g.Generate(t.Context(), req, nil)
			return err
		},
		"Phase guard": func() error {
			g := p.Guard()
			return g.Run(t.Context(), "a", fn)
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			sent := ct.n.Load()
			called, released = false, 0
			err := call()
			if !errors.Is(err, vramguard.ErrClosed) || !errors.Is(err, vramguard.KindUnavailable) {
				t.Errorf("got %v, want ErrClosed (KindUnavailable)", err)
			}
			if n := ct.n.Load() - sent; n != 0 {
				t.Errorf("%d requests sent after Close", n)
			}
			if called || released != 0 {
				t.Errorf("caller code ran after Close: fn %v, tenant releases %d", called, released)
			}
		})
	}
	// The phase was ended by Close; End reports that end again.
	if rep, err := p.End(t.Context()); err != nil || rep == nil {
		t.Errorf("Phase.End after Close: %+v, %v", rep, err)
	}
	if n := ct.n.Load() - before; n != 0 {
		t.Errorf("%d requests sent after Close in all", n)
	}
}

// TestSessionOutsideItsScope: a Session used after its Run returned, or
// after its Phase ended, fails and sends nothing, instead of loading the
// model again behind a verified unload.
func TestSessionOutsideItsScope(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a"}}})
	t.Cleanup(s.Close)
	c, ct := countedClient(t, s, vramguard.Options{})
	req := &vramguard.GenerateRequest{Prompt: "x"}

	var kept *vramguard.Session
	g := vramguard.Guard{Client: c}
	if err := g.Run(t.Context(), "a", func(ctx context.Context, s *vramguard.Session) error {
		kept = s
		_, err := s.Generate(ctx, req, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	before, loads := ct.n.Load(), s.Loads("a")
	_, err := kept.Generate(t.Context(), req, nil)
	if !errors.Is(err, vramguard.ErrSessionEnded) || !errors.Is(err, vramguard.KindInvalidInput) {
		t.Fatalf("session after Run: %v, want ErrSessionEnded", err)
	}
	if ct.n.Load() != before || s.Loads("a") != loads || s.Listed("a") {
		t.Fatalf("the ended session reached the server (%d requests, %d loads)", ct.n.Load()-before, s.Loads("a")-loads)
	}

	// A session of a phase, used after End from inside a Run that outlived
	// End's wait.
	p, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pg := p.Guard()
	ended := make(chan struct{})
	var phaseErr error
	runErr := pg.Run(t.Context(), "a", func(ctx context.Context, s *vramguard.Session) error {
		go func() { _, _ = p.End(context.Background()); close(ended) }()
		<-ended // End gave up waiting for this use and unloaded
		before = ct.n.Load()
		_, phaseErr = s.Generate(ctx, req, nil)
		return nil
	})
	if !errors.Is(phaseErr, vramguard.ErrPhaseEnded) || !errors.Is(phaseErr, vramguard.KindInvalidInput) {
		t.Fatalf("session after Phase.End: %v, want ErrPhaseEnded", phaseErr)
	}
	if ct.n.Load() != before || s.Listed("a") {
		t.Fatal("the session of the ended phase reached the server")
	}
	if runErr != nil {
		t.Fatalf("Run: %v", runErr)
	}
}

// TestRefusedCallLeavesTheModel: a guarded call refused before anything
// reached the server leaves the model as it was: here a copy another
// program loaded with a 1 h keep-alive.
func TestRefusedCallLeavesTheModel(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a"}}})
	t.Cleanup(s.Close)
	other := s.APIClient()
	if err := other.Generate(t.Context(), &api.GenerateRequest{Model: "a", Prompt: "x", KeepAlive: &api.Duration{Duration: time.Hour}},
		func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	c, _ := countedClient(t, s, vramguard.Options{KeepModelsOnClose: true})
	g := vramguard.Guard{Client: c}
	for name, req := range map[string]*vramguard.GenerateRequest{
		"prompt over the limit": {Model: "a", Prompt: strings.Repeat("x", vramguard.MaxPromptBytes+1)},
		"invalid option":        {Model: "a", Prompt: "x", Options: map[string]any{"temperature": func() {}}},
		"negative timeout":      {Model: "a", Prompt: "x", Timeouts: vramguard.Timeouts{Idle: -1}},
	} {
		t.Run(name, func(t *testing.T) {
			unloads := s.Unloads("a")
			_, err := g.Generate(t.Context(), req, nil)
			if !errors.Is(err, vramguard.KindInvalidInput) {
				t.Fatalf("got %v, want KindInvalidInput", err)
			}
			if !s.Listed("a") || s.Unloads("a") != unloads {
				t.Fatalf("the refused call unloaded the other program's model")
			}
		})
	}
	// A session that sends nothing leaves it too.
	if err := g.Run(t.Context(), "a", func(context.Context, *vramguard.Session) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !s.Listed("a") {
		t.Fatal("an empty guarded use unloaded the other program's model")
	}
}

// TestFailureBeforeAnyLoadIsOneError: a guarded call that cannot have
// loaded its model (no server answers, or the server has no such model)
// returns the call's error alone: no cleanup is tried, nothing is joined,
// nothing is logged at WARN, and Close has no model to unload.
func TestFailureBeforeAnyLoadIsOneError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a"}}})
	t.Cleanup(s.Close)
	for _, tt := range []struct {
		name, host, model string
		kind              vramguard.Kind
	}{
		{"no server", "http://" + closed, "tiny-a", vramguard.KindUnavailable},
		{"no such model", s.URL().String(), "missing", vramguard.KindNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs strings.Builder
			var unloads atomic.Int32
			c, err := vramguard.NewClient(vramguard.Options{
				Host: tt.host, PollInterval: 5 * time.Millisecond,
				Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
				HTTPClient: unloadSpy(func(string) { unloads.Add(1) }),
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range []vramguard.Guard{{Client: c}, {Client: c, Async: true, Release: true}} {
				_, err = g.Generate(t.Context(), &vramguard.GenerateRequest{Model: tt.model, Prompt: "x"}, nil)
				if !errors.Is(err, tt.kind) || errors.Is(err, vramguard.KindUnverified) {
					t.Fatalf("async %v: got %v, want %v alone", g.Async, err, tt.kind)
				}
				if u, ok := err.(interface{ Unwrap() []error }); ok {
					t.Fatalf("async %v: %d joined errors, want one: %v", g.Async, len(u.Unwrap()), err)
				}
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v, want nil (nothing loaded)", err)
			}
			if n := unloads.Load(); n != 0 {
				t.Errorf("%d unloads requested for a model that never loaded", n)
			}
			if logs.Len() > 0 {
				t.Errorf("logged at WARN or above:\n%s", logs.String())
			}
		})
	}
}

// TestStoppingIsIdempotent: after Close, Shutdown and Close return nil
// (stopping twice is not an error, as in net/http) and send nothing, while
// every other call fails with ErrClosed; a failure of the first Close is
// returned once, by whichever call comes first.
func TestStoppingIsIdempotent(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a"}}})
	t.Cleanup(s.Close)
	c, ct := countedClient(t, s, vramguard.Options{})
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if s.Listed("a") {
		t.Fatal("Close left the warm model")
	}
	sent := ct.n.Load()
	if err := c.Shutdown(t.Context()); err != nil {
		t.Errorf("Shutdown after Close: %v, want nil", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if _, err := c.UnloadModel(t.Context(), "a"); !errors.Is(err, vramguard.ErrClosed) {
		t.Errorf("UnloadModel after Close: %v, want ErrClosed", err)
	}
	if n := ct.n.Load() - sent; n != 0 {
		t.Errorf("%d requests sent after Close", n)
	}

	// A first Close that fails: its failure comes once.
	c2, _ := countedClient(t, s, vramguard.Options{CleanupTimeout: 50 * time.Millisecond})
	if _, err := c2.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	s.Close() // the server goes: Close cannot verify the unload
	if err := c2.Close(); err == nil {
		t.Fatal("Close with the server gone: nil, want the unload's failure")
	}
	if err := c2.Shutdown(t.Context()); err != nil {
		t.Errorf("Shutdown after a failed Close: %v, want nil (the failure was returned)", err)
	}
}

// TestGuardDoesNotWaitForOthers: a guard's cleanup does not wait for
// another program's generation on the same model: it sends the unload and
// reports the model still held (KindUnverified, ErrHeldByOthers), with the
// good result, in a time bounded by the client's own settings. The
// server unloads the model when the other request ends. UnloadModel, whose
// purpose is the memory, still waits for it.
func TestGuardDoesNotWaitForOthers(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a", Chunks: 400, TokenLatency: 25 * time.Millisecond}}})
	t.Cleanup(s.Close)
	c, _ := countedClient(t, s, vramguard.Options{})
	g := vramguard.Guard{Client: c}

	otherCtx, stopOther := context.WithCancel(t.Context())
	defer stopOther()
	otherDone := make(chan error, 1)
	var cleanupStart time.Time
	var gen *vramguard.Generation
	err := g.Run(t.Context(), "a", func(ctx context.Context, ss *vramguard.Session) error {
		var err error
		r := &vramguard.GenerateRequest{Prompt: "x", Options: map[string]any{"num_predict": 2}}
		if gen, err = ss.Generate(ctx, r, nil); err != nil {
			return err
		}
		// Another program starts a long generation on the model (10 s).
		first := make(chan struct{})
		go func() {
			var once bool
			otherDone <- s.APIClient().Generate(otherCtx, &api.GenerateRequest{Model: "a", Prompt: "y"},
				func(api.GenerateResponse) error {
					if !once {
						once = true
						close(first)
					}
					return nil
				})
		}()
		<-first
		cleanupStart = time.Now()
		return nil
	})
	cleanup := time.Since(cleanupStart)
	if gen == nil || gen.Text == "" {
		t.Fatal("no generation")
	}
	k := vramguard.KindOf(err)
	if !errors.Is(err, vramguard.ErrHeldByOthers) || k != vramguard.KindUnverified || k.Retryable() {
		t.Fatalf("cleanup: %v (kind %v), want KindUnverified with ErrHeldByOthers, not retryable", err, k)
	}
	if errors.Is(err, vramguard.KindTimeout) {
		t.Errorf("the cleanup's failure reads as a timeout: %v", err)
	}
	select {
	case err := <-otherDone:
		t.Fatalf("the other program's generation ended (%v) before the guard returned", err)
	default:
	}
	// Bounded by the client's settings: the wait for a held model ends
	// after max(4 polls, 200 ms) of seeing it held, plus a poll or two.
	if cleanup > 2*time.Second {
		t.Errorf("the guard's cleanup took %v while another program's generation ran", cleanup)
	}
	if !s.Listed("a") {
		t.Fatal("the model is gone while the other program still generates on it")
	}
	// UnloadModel waits for the other request; once it ends, the model
	// goes, because the unload was sent.
	stopOther()
	<-otherDone
	eventually(t, s, "model gone after the other request ended", func() bool { return !s.Listed("a") })
}

// TestUnloadCauses: every call that unloads says so, in OnUnloadStart
// and in its UnloadReport, so that a program can tell the budget's
// evictions from its own unloads.
func TestUnloadCauses(t *testing.T) {
	ctx := t.Context()
	warm := func(t *testing.T, c *vramguard.OllamaClient, model string) {
		t.Helper()
		if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: model, Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		want vramguard.UnloadCause
		do   func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport
	}{
		{vramguard.CauseUnloadModel, func(t *testing.T, _ *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			warm(t, c, "small")
			rep, _ := c.UnloadModel(ctx, "small")
			return []vramguard.UnloadReport{*rep}
		}},
		{vramguard.CauseUnloadAll, func(t *testing.T, _ *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			warm(t, c, "small")
			reps, _ := c.UnloadAll(ctx)
			return reps
		}},
		{vramguard.CauseCleanup, func(t *testing.T, _ *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			warm(t, c, "small")
			rep, _ := c.Cleanup(ctx, vramguard.CleanupOptions{Models: []string{"small"}})
			return rep.Unloads
		}},
		{vramguard.CauseGuard, func(t *testing.T, _ *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			g := vramguard.Guard{Client: c}
			if _, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, nil); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{vramguard.CausePhaseEnd, func(t *testing.T, _ *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			p, err := c.StartPhase(ctx, "p", vramguard.PhaseOptions{})
			if err != nil {
				t.Fatal(err)
			}
			g := p.Guard()
			if _, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, nil); err != nil {
				t.Fatal(err)
			}
			rep, _ := p.End(ctx)
			return rep.Cleanup.Unloads
		}},
		{vramguard.CauseEnsureFree, func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			warm(t, c, "big")
			rep, _ := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: free(t, s) + gib})
			return rep.Evicted
		}},
		{vramguard.CauseBudget, func(t *testing.T, s *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			warm(t, c, "big")
			if err := s.Reserve("comfyui", 14*gib); err != nil { // 24 - 8 - 14: 2 GiB free
				t.Fatal(err)
			}
			warm(t, c, "mid") // the budget makes room: big goes
			return nil
		}},
		{vramguard.CauseClose, func(t *testing.T, _ *vramguardtest.Server, c *vramguard.OllamaClient) []vramguard.UnloadReport {
			warm(t, c, "small")
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
	} {
		t.Run(string(tt.want), func(t *testing.T) {
			s := threeModelSim(t, vramguardtest.Config{})
			var mu sync.Mutex
			var causes []vramguard.UnloadCause
			opts := vramguard.Options{VRAM: s.GPU(), Hooks: vramguard.Hooks{OnUnloadStart: func(ctx context.Context, e vramguard.UnloadStart) context.Context {
				mu.Lock()
				defer mu.Unlock()
				causes = append(causes, e.Cause)
				return ctx
			}}}
			if tt.want == vramguard.CauseBudget {
				opts.Budget = &vramguard.Budget{MakeRoom: true}
			}
			c, _ := countedClient(t, s, opts)
			reps := tt.do(t, s, c)
			mu.Lock()
			defer mu.Unlock()
			if len(causes) == 0 || causes[0] != tt.want {
				t.Errorf("OnUnloadStart causes %q, want %q first", causes, tt.want)
			}
			switch tt.want {
			case vramguard.CauseGuard, vramguard.CauseBudget, vramguard.CauseClose: // seen by the hook only
			default:
				if len(reps) == 0 {
					t.Fatal("no unload report")
				}
			}
			for _, r := range reps {
				if r.Cause != tt.want {
					t.Errorf("report of %s: cause %q, want %q", r.Model, r.Cause, tt.want)
				}
			}
		})
	}
}
