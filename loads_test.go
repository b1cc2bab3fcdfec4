package vramguard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/vramguard/vramguard/vramguardtest"
)

// Calls of one client that waited for one load report it once: Ollama
// gives each the load_duration of its wait, and Generation.Loaded (so the
// load hooks and vramguard_model_loads_total) counted the load once per
// waiter (composition oracle seed 1796171620578333446). Two loads one
// after the other still count twice.
func TestOneLoadCountedOnceForItsWaiters(t *testing.T) {
	for _, waiters := range []int{2, 5} {
		t.Run(fmt.Sprint(waiters), func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 80 * time.Millisecond})
			var mu sync.Mutex
			loaded := 0
			c := newTestClient(t, s, Options{Hooks: Hooks{OnCallEnd: func(ctx context.Context, ev CallEnd) {
				if ev.Generation != nil && ev.Generation.Loaded {
					mu.Lock()
					loaded++
					mu.Unlock()
				}
			}}})
			var wg sync.WaitGroup
			gens := make([]*Generation, waiters)
			for i := range waiters {
				wg.Go(func() {
					g, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: fmt.Sprint("p", i)}, KeepAliveFor(time.Minute), nil)
					if err != nil {
						t.Error(err)
					}
					gens[i] = g
				})
				time.Sleep(10 * time.Millisecond) // all within the 80 ms load
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			if n := s.Loads("tiny"); n != 1 {
				t.Fatalf("the server loaded %d times, want 1 (the calls did not share the load)", n)
			}
			reported := 0
			for _, g := range gens {
				if g.Loaded {
					reported++
				}
				if g.Metrics.LoadDuration < 10*time.Millisecond {
					t.Errorf("a waiter reported load_duration %v: it did not wait for the load", g.Metrics.LoadDuration)
				}
			}
			if reported != 1 || loaded != 1 {
				t.Errorf("%d of %d waiters report Loaded, OnCallEnd saw %d loads; want 1 and 1", reported, waiters, loaded)
			}

			// A second load after a verified unload is a load of its own.
			if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
				t.Fatal(err)
			}
			g, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "again"}, KeepAliveFor(time.Minute), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !g.Loaded || s.Loads("tiny") != 2 {
				t.Errorf("the load after the unload: Loaded %v, server loads %d; want true, 2", g.Loaded, s.Loads("tiny"))
			}
		})
	}
}

// Two loads one right after the other, the second as soon as the first's
// runner went (LoadLatency 0: each counts MinLoadDuration), are two.
func TestBackToBackLoadsCountTwice(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{})
	for i := range 3 {
		g, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !g.Loaded {
			t.Errorf("load %d not reported (load_duration %v)", i+1, g.Metrics.LoadDuration)
		}
		eventually(t, s, "tiny gone", func() bool { return len(s.Running()) == 0 })
	}
	if n := s.Loads("tiny"); n != 3 {
		t.Errorf("server loads %d, want 3", n)
	}
}
