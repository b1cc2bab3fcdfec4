package pool_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
)

// A pool's placement honours another program's reservation: with gpu0
// reserved, a load that would go to gpu0 (the first of two equal members)
// goes to gpu1; with both reserved it is refused, each member's side
// naming the reservation's holder, and nothing loads.
func TestPoolPlacementHonoursReservations(t *testing.T) {
	sims := poolSims(t, 16*gib, 16*gib)
	dir := filepath.Join(t.TempDir(), "leases")
	leases := vramguard.LeaseOptions{Dir: dir}
	c := newTestPool(t, sims, vramguard.Options{Leases: leases})
	other := func(i int) *vramguard.OllamaClient {
		o, err := vramguard.NewClient(vramguard.Options{Host: sims[i].URL().String(), VRAM: sims[i].GPU(), Leases: leases})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Close() })
		return o
	}
	r0, err := other(0).Reserve(t.Context(), 0, 14*gib, vramguard.ReserveOptions{For: "render on gpu0"})
	if err != nil {
		t.Fatal(err)
	}
	g := poolGen(t, c, "b") // 5 GiB
	if g.Placement.Member != "gpu1" || g.Placement.Reason != pool.PlaceRoom {
		t.Fatalf("placement %+v; want gpu1 by room (gpu0's free memory is reserved)", g.Placement)
	}
	if _, err := c.UnloadModel(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := other(1).Reserve(t.Context(), 0, 14*gib, vramguard.ReserveOptions{For: "render on gpu1"}); err != nil {
		t.Fatal(err)
	}
	_, err = gen(t.Context(), c, "b")
	var nr *pool.NoRoomError
	if !errors.As(err, &nr) || !errors.Is(err, vramguard.KindOutOfMemory) {
		t.Fatalf("placement with both devices reserved = %v, want a NoRoomError", err)
	}
	for _, side := range nr.Members {
		if side.Free > 2*gib {
			t.Errorf("member %s counted %d bytes free, more than what its reservation leaves", side.Member, side.Free)
		}
	}
	if sims[0].Loads("b") != 0 || sims[1].Loads("b") != 1 {
		t.Errorf("loads of b: gpu0 %d, gpu1 %d; want only the first, on gpu1", sims[0].Loads("b"), sims[1].Loads("b"))
	}
	if err := r0.Release(); err != nil {
		t.Fatal(err)
	}
	if g := poolGen(t, c, "b"); g.Placement.Member != "gpu0" {
		t.Fatalf("after gpu0's reservation ended: placed on %s, want gpu0", g.Placement.Member)
	}
}

// A phase on a pool hands its room over reserved, on the member it used:
// another program's client of that member sees the reservation and cannot
// take the room; the other member is untouched.
func TestPoolPhaseHandoverReserves(t *testing.T) {
	sims := poolSims(t, 16*gib, 16*gib)
	dir := filepath.Join(t.TempDir(), "leases")
	leases := vramguard.LeaseOptions{Dir: dir}
	c := newTestPool(t, sims, vramguard.Options{Leases: leases})
	dev, ok := c.Device("gpu1")
	if !ok {
		t.Fatal("no gpu1")
	}
	p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: 12 * gib, Device: dev, Reserve: vramguard.ReserveOptions{For: "render", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.End(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Handover.Reservation == nil || rep.Handover.Reservation.Info().Bytes != 12*gib {
		t.Fatalf("hand-over %+v: want 12 GiB reserved", rep.Handover)
	}
	for i, want := range []bool{false, true} {
		o, err := vramguard.NewClient(vramguard.Options{Host: sims[i].URL().String(), VRAM: sims[i].GPU(), Leases: leases})
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 8 * gib, DryRun: true})
		if got := errors.Is(err, vramguard.ErrLeased); got != want {
			t.Errorf("gpu%d: another program's 8 GiB dry run = %v; want refused by the reservation: %v", i, err, want)
		}
		_ = o.Close()
	}
}
