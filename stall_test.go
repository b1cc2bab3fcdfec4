package vramguard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A call on a model that a budget's room-making is unloading, begun after
// the plan, does not hold that room-making to the unload's timeout: it
// waited for the admission slot the room-making held, while the unload
// waited for it (the same stall the pool's placement turn had, issue #35).
func TestBudgetCallOnAPlannedVictimDoesNotStall(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 12 * gib, StrictVRAM: true, UnloadDelay: 200 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib},
		vramguardtest.ModelConfig{Name: "c", SizeVRAM: 9 * gib})
	const unloadTimeout = 10 * time.Second
	c := newClientAt(t, s.URL().String(), vramguard.Options{UnloadTimeout: unloadTimeout,
		VRAM: &vramguardtest.GPU{Server: s}, Budget: &vramguard.Budget{MakeRoom: true}})
	hour := vramguard.KeepAliveFor(time.Hour)
	generate := func(model string) (*vramguard.Generation, error) {
		return c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: model, Prompt: "x"}, hour, nil)
	}
	if _, err := generate("c"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var bErr, cErr error
	var bTook time.Duration
	wg.Go(func() {
		start := time.Now()
		_, bErr = generate("b")
		bTook = time.Since(start)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, func() bool {
		for _, e := range s.Events("c") {
			if e.Kind == vramguardtest.EventUnloadRequest {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("no unload of c: %v", err)
	}
	wg.Go(func() { _, cErr = generate("c") })
	wg.Wait()
	t.Logf("b: %v in %v; the call on c: %v", bErr, bTook.Round(time.Millisecond), cErr)
	if bTook >= unloadTimeout/2 {
		t.Errorf("the admission of b took %v: held to the unload timeout (%v) by the call on c", bTook, unloadTimeout)
	}
}
