package pool_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A call on a model that a placement's room-making is unloading, begun
// after the plan, does not hold that room-making to the unload's timeout
// (issue #35: the unload waited for the call, which waited for the
// placement turn the room-making held).
func TestPoolCallOnAPlannedVictimDoesNotStall(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 12 * gib, StrictVRAM: true, UnloadDelay: 200 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib, LoadLatency: 20 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "c", SizeVRAM: 9 * gib, LoadLatency: 20 * time.Millisecond})
	const unloadTimeout = 10 * time.Second
	p := newTestPool(t, []*vramguardtest.Server{sim}, vramguard.Options{UnloadTimeout: unloadTimeout})
	poolGen(t, p, "c") // resident, idle: b's room is made by unloading it
	var wg sync.WaitGroup
	var bErr error
	var bTook time.Duration
	wg.Go(func() {
		start := time.Now()
		_, bErr = gen(t.Context(), p, "b")
		bTook = time.Since(start)
	})
	// The room-making's unload of c has gone out: a call on c begins.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := sim.WaitFor(ctx, func() bool {
		return slices.ContainsFunc(sim.Events("c"), func(e vramguardtest.Event) bool { return e.Kind == vramguardtest.EventUnloadRequest })
	}); err != nil {
		t.Fatalf("no unload of c: %v", err)
	}
	var cErr error
	wg.Go(func() { _, cErr = gen(t.Context(), p, "c") })
	wg.Wait()
	t.Logf("b: %v in %v; the call on c: %v", bErr, bTook.Round(time.Millisecond), cErr)
	if bTook >= unloadTimeout/2 {
		t.Errorf("the placement of b took %v: held to the unload timeout (%v) by the call on c", bTook, unloadTimeout)
	}
	if bErr != nil || !sim.Listed("b") {
		t.Errorf("b: %v, listed %v; want placed and loaded, its room made", bErr, sim.Listed("b"))
	}
	// The call on c, held at the turn, goes on once b is placed: c fits
	// only without b, whose load is in flight, so it is refused, typed
	// (or, had b's call ended first, made its room and ran).
	var nr *pool.NoRoomError
	if cErr != nil && !errors.As(cErr, &nr) {
		t.Errorf("the call on c: %v; want a result or a *pool.NoRoomError", cErr)
	}
}
