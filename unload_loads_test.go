package vramguard_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

// startLoad starts a generation of c on model and waits until the
// simulator has it in flight, loading. The result arrives on the channel.
func startLoad(t *testing.T, s *vramguardtest.Server, c *OllamaClient, model string) <-chan error {
	t.Helper()
	n := s.Requests(model)
	done := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(context.WithoutCancel(t.Context()),
			&GenerateRequest{Model: model, Prompt: "x"}, KeepAliveFor(time.Hour), nil)
		done <- err
	}()
	if err := s.WaitFor(t.Context(), func() bool { return InFlight(c, model) == 1 && s.Requests(model) == n+1 }); err != nil {
		t.Fatal(err)
	}
	return done
}

// An unload of a model this client is loading cuts that load instead of
// racing it: the generation fails with ErrUnloadedWhileLoading, and the
// unload is verified long before the load would have ended.
func TestUnloadCancelsOwnLoad(t *testing.T) {
	const load = 2 * time.Second
	for _, lose := range []bool{true, false} {
		t.Run(map[bool]string{true: "unload lost during load", false: "unload kept"}[lose], func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: load})
			s.SetLoseUnloadDuringLoad(lose)
			c := newTestClient(t, s, Options{})
			SetProcRoot(c, newFakeProcs(t).root)
			done := startLoad(t, s, c, "tiny")
			start := time.Now()
			rep, err := c.UnloadModel(t.Context(), "tiny")
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			gerr := <-done
			if !errors.Is(gerr, KindCanceled) || !errors.Is(gerr, ErrUnloadedWhileLoading) {
				t.Errorf("the loading generation returned %v, want KindCanceled wrapping ErrUnloadedWhileLoading", gerr)
			}
			if !rep.Verified || rep.CanceledLoads != 1 {
				t.Errorf("report %+v, want verified with one canceled load", rep)
			}
			if took >= load/2 {
				t.Errorf("the unload took %v: it waited for the load (%v) instead of cutting it", took, load)
			}
			if s.Cancelled("tiny") != 1 {
				t.Errorf("the server saw %d canceled requests, want 1", s.Cancelled("tiny"))
			}
			// The load the server finishes (or drops) must not leave the
			// model listed.
			time.Sleep(load + 200*time.Millisecond)
			if s.Listed("tiny") {
				t.Errorf("tiny listed %v after a verified unload", time.Since(start))
			}
		})
	}
}

// A generation that already streams belongs to its caller: the unload
// waits for it and does not cut it.
func TestUnloadWaitsForOwnStream(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 20, TokenLatency: 20 * time.Millisecond})
	c := newTestClient(t, s, Options{})
	first := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once bool
		_, err := c.GenerateStreaming(context.WithoutCancel(t.Context()), &GenerateRequest{Model: "tiny", Prompt: "x"},
			KeepAliveFor(time.Hour), func(Chunk) error {
				if !once {
					once = true
					close(first)
				}
				return nil
			})
		done <- err
	}()
	<-first
	rep, err := c.UnloadModel(t.Context(), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case gerr := <-done:
		if gerr != nil {
			t.Errorf("the streaming generation failed: %v", gerr)
		}
	default:
		t.Error("UnloadModel returned while the generation still ran")
	}
	if rep.CanceledLoads != 0 || !rep.Verified {
		t.Errorf("report %+v", rep)
	}
}

// The library's own cleanups do not own the client's other generations: a
// guard's after-use cleanup and Phase.End wait for a load of the same model
// that another call of the client started, and that generation succeeds.
func TestOwnCleanupsKeepOtherLoads(t *testing.T) {
	// used runs a guarded generation of tiny in scope, then unloads tiny
	// with another client and starts an unguarded generation of c that
	// loads it again; it returns that generation's result.
	used := func(t *testing.T, s *vramguardtest.Server, c *OllamaClient, g Guard) <-chan error {
		t.Helper()
		if _, err := g.Generate(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, nil); err != nil {
			t.Fatal(err)
		}
		other := newTestClient(t, s, Options{})
		// Forced: in the phase case the phase's lease keeps tiny.
		if _, err := other.ForceUnloadModel(t.Context(), "tiny"); err != nil {
			t.Fatal(err)
		}
		n := s.Requests("tiny")
		done := make(chan error, 1)
		go func() {
			_, err := c.GenerateStreaming(context.WithoutCancel(t.Context()),
				&GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveFor(time.Hour), nil)
			done <- err
		}()
		if err := s.WaitFor(t.Context(), func() bool { return s.Requests("tiny") == n+1 }); err != nil {
			t.Fatal(err)
		}
		return done
	}
	check := func(t *testing.T, s *vramguardtest.Server, cleanupErr error, done <-chan error) {
		t.Helper()
		if cleanupErr != nil {
			t.Errorf("cleanup: %v", cleanupErr)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the client's other generation failed: %v", err)
			}
		default:
			t.Error("the cleanup returned while the client's other generation still ran")
		}
		if s.Cancelled("tiny") != 0 || s.Listed("tiny") {
			t.Errorf("%d requests canceled, listed %v: want none canceled and tiny gone", s.Cancelled("tiny"), s.Listed("tiny"))
		}
	}
	t.Run("guard", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 300 * time.Millisecond})
		s.SetLoseUnloadDuringLoad(true)
		c := newTestClient(t, s, Options{})
		g := Guard{Client: c}
		var done <-chan error
		err := g.Run(t.Context(), "tiny", func(ctx context.Context, ss *Session) error {
			if _, err := ss.Generate(ctx, &GenerateRequest{Model: "tiny", Prompt: "x"}, nil); err != nil {
				return err
			}
			done = used(t, s, c, Guard{Client: c, KeepLoaded: true})
			return nil
		})
		check(t, s, err, done)
	})
	t.Run("phase", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 300 * time.Millisecond})
		s.SetLoseUnloadDuringLoad(true)
		c := newTestClient(t, s, Options{})
		p, err := c.StartPhase(t.Context(), "prompts", PhaseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		done := used(t, s, c, p.Guard())
		rep, err := p.End(t.Context())
		if err == nil && (len(rep.Cleanup.Unloads) != 1 || !rep.Cleanup.Unloads[0].Verified) {
			t.Errorf("phase report %+v", rep.Cleanup)
		}
		check(t, s, err, done)
	})
}

// UnloadAll and Cleanup with AllModels also unload models this client is
// loading, which /api/ps does not list yet.
func TestUnloadAllCutsOwnLoads(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 2 * time.Second})
	s.SetLoseUnloadDuringLoad(true)
	c := newTestClient(t, s, Options{})
	t.Run("UnloadAll", func(t *testing.T) {
		done := startLoad(t, s, c, "tiny")
		reps, err := c.UnloadAll(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(reps) != 1 || reps[0].Model != "tiny:latest" || reps[0].CanceledLoads != 1 {
			t.Errorf("reports %+v, want one for tiny:latest with a canceled load", reps)
		}
		if err := <-done; !errors.Is(err, ErrUnloadedWhileLoading) {
			t.Errorf("generation: %v, want ErrUnloadedWhileLoading", err)
		}
	})
	t.Run("two unloads", func(t *testing.T) {
		// A generation is cut once: the reports count it once between them.
		done := startLoad(t, s, c, "tiny")
		reps := make(chan *UnloadReport, 2)
		for range 2 {
			go func() {
				rep, err := c.UnloadModel(context.WithoutCancel(t.Context()), "tiny")
				if err != nil {
					t.Error(err)
				}
				reps <- rep
			}()
		}
		n := 0
		for range 2 {
			if rep := <-reps; rep != nil {
				n += rep.CanceledLoads
			}
		}
		if n != 1 {
			t.Errorf("the two reports count %d canceled loads, want 1", n)
		}
		if err := <-done; !errors.Is(err, ErrUnloadedWhileLoading) {
			t.Errorf("generation: %v, want ErrUnloadedWhileLoading", err)
		}
	})
	t.Run("Cleanup", func(t *testing.T) {
		done := startLoad(t, s, c, "tiny")
		rep, err := c.Cleanup(t.Context(), CleanupOptions{AllModels: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Unloads) != 1 || rep.Unloads[0].CanceledLoads != 1 {
			t.Errorf("reports %+v, want one with a canceled load", rep.Unloads)
		}
		if err := <-done; !errors.Is(err, ErrUnloadedWhileLoading) {
			t.Errorf("generation: %v, want ErrUnloadedWhileLoading", err)
		}
	})
}

// Without the process check, Options.SettleWindow keeps the unload
// watching /api/ps: a load another program started just before the
// unload shows within the window and is unloaded, where a single absent
// poll reports the model gone and it appears afterwards.
func TestSettleWindowSeesOthersLoad(t *testing.T) {
	const load = 400 * time.Millisecond
	for _, window := range []time.Duration{0, 3 * load} {
		t.Run("window "+window.String(), func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: load})
			s.SetLoseUnloadDuringLoad(true)
			c := newTestClient(t, s, Options{SettleWindow: window})
			SetProcRoot(c, filepath.Join(t.TempDir(), "missing")) // no process check
			// Another program's load, with the server's default keep-alive.
			other := make(chan error, 1)
			go func() {
				other <- s.APIClient().Generate(context.WithoutCancel(t.Context()), &api.GenerateRequest{Model: "tiny", Prompt: "x"},
					func(api.GenerateResponse) error { return nil })
			}()
			if err := s.WaitFor(t.Context(), func() bool { return s.Requests("tiny") == 1 }); err != nil {
				t.Fatal(err)
			}
			rep, err := c.UnloadModel(t.Context(), "tiny")
			if err != nil {
				t.Fatal(err)
			}
			if err := <-other; err != nil {
				t.Fatal(err)
			}
			listed := s.Listed("tiny")
			if window == 0 {
				// The hole the window closes: verified by one poll, listed
				// once the load ends.
				if !rep.Verified || rep.Checked != CheckPS || !listed {
					t.Errorf("report %+v, listed %v: want verified by ps alone and the model listed after", rep, listed)
				}
				return
			}
			if !rep.Verified || rep.Checked != CheckPS|CheckSettled || rep.Attempts < 2 {
				t.Errorf("report %+v, want verified by ps+settled after a resend", rep)
			}
			if rep.Elapsed < window {
				t.Errorf("verified in %v, within the window of %v", rep.Elapsed, window)
			}
			if listed {
				t.Errorf("tiny listed after an unload verified with the settle window")
			}
		})
	}
}

func TestSettleWindowValidated(t *testing.T) {
	for _, o := range []Options{
		{SettleWindow: -time.Second},
		{SettleWindow: DefaultUnloadTimeout},
		{SettleWindow: time.Second, UnloadTimeout: time.Second},
	} {
		if _, err := NewClient(o); !errors.Is(err, KindInvalidInput) {
			t.Errorf("NewClient(SettleWindow %v, UnloadTimeout %v) = %v, want KindInvalidInput", o.SettleWindow, o.UnloadTimeout, err)
		}
	}
}
