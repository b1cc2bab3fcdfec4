package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/vramguard/vramguard/vramguardtest"
)

func TestGuardPanicStillEvicts(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{})
	// KeepLoaded is off (the zero value), so the model must go even though
	// the generation asked the server to keep it and the function panicked.
	g := Guard{Client: c}
	type boom struct{ n int }
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_ = g.Run(t.Context(), "tiny", func(ctx context.Context, s *Session) error {
			r := GenerateRequest{Prompt: "x"}
			if _, err := s.Generate(ctx, &r, nil); err != nil {
				return err
			}
			// Keep it warm on purpose, as a buggy node might.
			if _, err := c.GenerateStreaming(ctx, &GenerateRequest{Model: "tiny", Prompt: "y"}, KeepAliveForever, nil); err != nil {
				return err
			}
			panic(boom{42})
		})
	}()
	if b, ok := recovered.(boom); !ok || b.n != 42 {
		t.Fatalf("recovered %#v, want the original panic value", recovered)
	}
	if s.Listed("tiny") {
		t.Fatal("model resident after a panicking guarded call")
	}
}

func TestGuardCanceledContextStillEvicts(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 100, TokenLatency: 5 * time.Millisecond})
	c := newTestClient(t, s, Options{})
	g := Guard{Client: c}
	ctx, cancel := context.WithCancel(t.Context())
	err := g.Run(ctx, "tiny", func(ctx context.Context, s *Session) error {
		if _, err := c.GenerateStreaming(ctx, &GenerateRequest{Model: "tiny", Prompt: "warm"}, KeepAliveForever, nil); err != nil {
			return err
		}
		_, err := s.Generate(ctx, &GenerateRequest{Prompt: "x"}, func(ch Chunk) error {
			if ch.Index == 2 {
				cancel()
			}
			return nil
		})
		return err
	})
	if !errors.Is(err, KindCanceled) {
		t.Fatalf("got %v, want canceled", err)
	}
	if s.Listed("tiny") {
		t.Fatal("model resident after a canceled guarded call")
	}
}

func TestGuardKeepLoadedAndAsync(t *testing.T) {
	s := newSim(t, vramguardtest.Config{UnloadDelay: 100 * time.Millisecond}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{KeepModelsOnClose: true})
	keep := Guard{Client: c, KeepLoaded: true}
	if _, err := keep.Generate(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	if !s.Listed("tiny") {
		t.Fatal("KeepLoaded: model was unloaded")
	}
	async := Guard{Client: c, Async: true}
	if _, err := async.Generate(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	// Generate returned before the verified unload could finish (the
	// server takes 100 ms to remove the runner): the cleanup is running in
	// the background.
	if !s.Listed("tiny") {
		t.Fatal("Async: Generate waited for the unload")
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if s.Listed("tiny") {
		t.Fatal("Async: model still resident after the client's Wait")
	}
}

func TestGuardValidation(t *testing.T) {
	var nilGuard *Guard
	tests := []struct {
		name string
		err  error
	}{
		{"nil guard", nilGuard.Run(t.Context(), "m", func(context.Context, *Session) error { return nil })},
		{"no client", (&Guard{}).Run(t.Context(), "m", func(context.Context, *Session) error { return nil })},
		{"nil fn", (&Guard{Client: &OllamaClient{}}).Run(t.Context(), "m", nil)},
		{"empty model", (&Guard{Client: &OllamaClient{}}).Run(t.Context(), "", func(context.Context, *Session) error { return nil })},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, KindInvalidInput) {
			t.Errorf("%s: got %v, want invalid input", tt.name, tt.err)
		}
	}
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"}, vramguardtest.ModelConfig{Name: "b"})
	c := newTestClient(t, s, Options{})
	err := (&Guard{Client: c}).Run(t.Context(), "a", func(ctx context.Context, s *Session) error {
		_, err := s.Generate(ctx, &GenerateRequest{Model: "b", Prompt: "x"}, nil)
		return err
	})
	if !errors.Is(err, KindInvalidInput) {
		t.Errorf("generation on another model: got %v", err)
	}
}

// TestConcurrentGuardsNeverUnloadInUse runs many guards on one model and
// checks, at the moment each unload request is sent, that no guarded use
// and no generation of the client is running.
func TestConcurrentGuardsNeverUnloadInUse(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 4, TokenLatency: time.Millisecond, LoadLatency: 5 * time.Millisecond})
	var c *OllamaClient
	var violations, unloads atomic.Int32
	c = newTestClient(t, s, Options{HTTPClient: unloadSpy(func(m string) {
		unloads.Add(1)
		if n, f := Users(c, m), InFlight(c, m); n != 0 || f != 0 {
			violations.Add(1)
			t.Errorf("unload of %s requested with %d users and %d in-flight generations", m, n, f)
		}
	})})
	const workers, rounds = 8, 6
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				g := Guard{Client: c, Async: rng.IntN(2) == 0}
				err := g.Run(t.Context(), "tiny", func(ctx context.Context, s *Session) error {
					for range 1 + rng.IntN(3) {
						if _, err := s.Generate(ctx, &GenerateRequest{Prompt: "x"}, nil); err != nil {
							return err
						}
						time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if violations.Load() != 0 {
		t.Fatalf("%d unloads raced a use", violations.Load())
	}
	if unloads.Load() == 0 {
		t.Fatal("no unload was ever requested: the check proved nothing")
	}
	if s.Listed("tiny") || s.Stats("tiny").Crashes != 0 {
		t.Fatalf("listed %v, stats %+v", s.Listed("tiny"), s.Stats("tiny"))
	}
}

// originalWorkflow runs the seed design's prompt stage: generator on b,
// refiner three passes on a, negative prompt on a.
func originalWorkflow(ctx context.Context, g Guard) error {
	steps := []string{"b", "a", "a", "a", "a"}
	for i, m := range steps {
		if _, err := g.Generate(ctx, &GenerateRequest{Model: m, Prompt: fmt.Sprintf("step %d", i)}, nil); err != nil {
			return err
		}
	}
	return nil
}

func TestPhaseAvoidsReloads(t *testing.T) {
	models := []vramguardtest.ModelConfig{
		{Name: "a", Size: 2 << 30, LoadLatency: 30 * time.Millisecond},
		{Name: "b", Size: 4 << 30, LoadLatency: 30 * time.Millisecond},
	}
	t.Run("per-call", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{}, models...)
		c := newTestClient(t, s, Options{})
		if err := originalWorkflow(t.Context(), Guard{Client: c}); err != nil {
			t.Fatal(err)
		}
		if got := s.Loads(""); got != 5 {
			t.Errorf("per-call mode: %d loads, want 5", got)
		}
		if len(s.Running()) != 0 {
			t.Errorf("resident at the end: %v", s.Running())
		}
	})
	t.Run("phase", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{}, models...)
		var loads atomic.Int32
		c := newTestClient(t, s, Options{Hooks: Hooks{OnCallEnd: func(_ context.Context, e CallEnd) {
			if e.Generation != nil && e.Generation.Loaded {
				loads.Add(1)
			}
		}}})
		p, err := c.StartPhase(t.Context(), "prompts", PhaseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := originalWorkflow(t.Context(), p.Guard()); err != nil {
			t.Fatal(err)
		}
		if !s.Listed("a") {
			t.Error("phase: model a is not warm before End")
		}
		rep, err := p.End(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Loads(""); got != 2 || loads.Load() != 2 {
			t.Errorf("phase mode: %d server loads, %d loads OnCallEnd saw; want 2", got, loads.Load())
		}
		if len(s.Running()) != 0 {
			t.Errorf("resident at the end: %v", s.Running())
		}
		if len(rep.Models) != 2 || len(rep.Cleanup.Unloads) != 2 || rep.Cleanup.Release == nil {
			t.Errorf("report %+v", rep)
		}
		// End is idempotent and the phase is closed for new work.
		rep2, err2 := p.End(t.Context())
		if rep2 != rep || err2 != nil {
			t.Errorf("second End: %v, %v", rep2, err2)
		}
		g := p.Guard()
		if _, err := g.Generate(t.Context(), &GenerateRequest{Model: "a", Prompt: "x"}, nil); !errors.Is(err, KindInvalidInput) {
			t.Errorf("generate after End: %v", err)
		}
	})
}

func TestPhaseEndsWhenContextCanceled(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"})
	c := newTestClient(t, s, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	p, err := c.StartPhase(ctx, "prompts", PhaseOptions{KeepAlive: KeepAliveFor(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Guard()
	if _, err := g.Generate(ctx, &GenerateRequest{Model: "a", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	if !s.Listed("a") {
		t.Fatal("model not warm inside the phase")
	}
	cancel()
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if s.Listed("a") {
		t.Fatal("model resident after the phase's context was canceled")
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Errorf("End after the automatic end: %v", err)
	}
}

func TestPhaseHandover(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"})
	r := &fakeReader{free: []uint64{20 << 30}}
	c := newTestClient(t, s, Options{VRAM: r})
	p, err := c.StartPhase(t.Context(), "prompts", PhaseOptions{NeedBytes: 12 << 30})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Guard()
	if _, err := g.Generate(t.Context(), &GenerateRequest{Model: "a", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := p.End(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Handover == nil || rep.Handover.FreeAfter < 12<<30 {
		t.Fatalf("handover %+v", rep.Handover)
	}
	if _, err := c.StartPhase(t.Context(), "x", PhaseOptions{Timeout: -1}); !errors.Is(err, KindInvalidInput) {
		t.Errorf("negative timeout: %v", err)
	}
}

// TestStartPhaseWithCanceledContext: the phase ends by itself at once, and
// the callback that ends it never runs before the phase is set up.
func TestStartPhaseWithCanceledContext(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"})
	c := newTestClient(t, s, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 50 {
		p, err := c.StartPhase(ctx, "x", PhaseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		g := p.Guard()
		_, _ = g.Generate(t.Context(), &GenerateRequest{Model: "a", Prompt: "x"}, nil)
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if s.Listed("a") {
		t.Fatal("a phase ended by its context left the model resident")
	}
}

// TestPhaseEndWaitsForRunningUses: End must not verify the unload while a
// guarded use of the phase is still running, or that use would load the
// model again after End returned.
func TestPhaseEndWaitsForRunningUses(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a", LoadLatency: 30 * time.Millisecond})
	c := newTestClient(t, s, Options{})
	p, err := c.StartPhase(t.Context(), "x", PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan struct{}), make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		g := p.Guard()
		runErr <- g.Run(t.Context(), "a", func(ctx context.Context, s *Session) error {
			close(inside)
			<-release // the use has begun but not yet sent its request
			_, err := s.Generate(ctx, &GenerateRequest{Prompt: "x"}, nil)
			return err
		})
	}()
	<-inside
	ended := make(chan struct{})
	go func() {
		if _, err := p.End(t.Context()); err != nil {
			t.Error(err)
		}
		close(ended)
	}()
	select {
	case <-ended:
		t.Fatal("End returned while a use of the phase was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	<-ended
	if s.Listed("a") {
		t.Fatal("model resident after End")
	}
}

// TestWaitReturnsEachFailureOnce: a failed background cleanup is reported
// by the next Wait, not by every Wait after it.
func TestWaitReturnsEachFailureOnce(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	c := newTestClient(t, s, Options{})
	fail := true
	if _, err := c.RegisterTenant(Tenant{Name: "flaky", Device: -1, Release: func(context.Context) error {
		if fail {
			return errors.New("boom")
		}
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	c.CleanupAsync(t.Context(), CleanupOptions{Release: true})
	if err := c.Wait(); !errors.Is(err, KindInternal) {
		t.Fatalf("first Wait: %v", err)
	}
	fail = false
	c.CleanupAsync(t.Context(), CleanupOptions{Release: true})
	if err := c.Wait(); err != nil {
		t.Fatalf("second Wait returned an old failure: %v", err)
	}
}

// TestAsyncGuardOnClosedClient: a guarded use that began before Close
// still cleans up after itself, synchronously, instead of being refused in
// silence.
func TestAsyncGuardOnClosedClient(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"})
	c, err := NewClient(Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	released := 0
	if _, err := c.RegisterTenant(Tenant{Name: "r", Device: -1, Release: func(context.Context) error { released++; return nil }}); err != nil {
		t.Fatal(err)
	}
	g := Guard{Client: c, Async: true, Release: true}
	if err := g.Run(t.Context(), "a", func(ctx context.Context, s *Session) error {
		if _, err := s.Generate(ctx, &GenerateRequest{Prompt: "x"}, nil); err != nil {
			return err
		}
		return c.Close() // closed while the use runs
	}); err != nil {
		t.Fatal(err)
	}
	if released != 1 {
		t.Fatalf("release ran %d times, want 1", released)
	}
	if s.Listed("a") {
		t.Fatal("model resident after the guarded use")
	}
}

// Of the sixteen combinations of a Guard's policy fields, the eight that
// mean something run; the eight whose fields would be ignored fail with
// KindInvalidInput and send nothing.
func TestGuardPolicyCombinations(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{})
	p, err := c.StartPhase(t.Context(), "p", PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	valid := 0
	for i := range 16 {
		g := Guard{Client: c, KeepLoaded: i&1 != 0, Async: i&2 != 0, Release: i&4 != 0}
		if i&8 != 0 {
			g.Phase = p
		}
		want := !(g.KeepLoaded && g.Async && !g.Release)
		if g.Phase != nil {
			want = !g.KeepLoaded && !g.Async && !g.Release
		}
		before := s.Requests("tiny")
		_, err := g.Generate(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, nil)
		name := fmt.Sprintf("KeepLoaded=%v Async=%v Release=%v Phase=%v", g.KeepLoaded, g.Async, g.Release, g.Phase != nil)
		switch {
		case want && err != nil:
			t.Errorf("%s: %v", name, err)
		case !want && !errors.Is(err, KindInvalidInput):
			t.Errorf("%s: %v, want KindInvalidInput", name, err)
		case !want && s.Requests("tiny") != before:
			t.Errorf("%s: refused, but sent a request", name)
		}
		if want {
			valid++
		}
		if err := c.Wait(); err != nil { // an async cleanup ends before the next case counts requests
			t.Fatal(err)
		}
	}
	if valid != 8 {
		t.Errorf("%d valid combinations, want 8", valid)
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Fatal(err)
	}
}
