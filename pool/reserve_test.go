package pool_test

import (
	"context"
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

// A load the pool places is reserved host-wide on the member's device from
// the placement until the member answers, as a budget's admitted load is:
// another program's reservation (a hand-over for a render) taken before
// the member's runner shows the load cannot count those bytes free and
// hand them over (the seed's out-of-memory, with a pool where the gate
// was). Placed by room and after making room; nothing is left reserved
// once the member answered.
func TestPoolPlacedLoadReserved(t *testing.T) {
	for _, reason := range []pool.PlaceReason{pool.PlaceRoom, pool.PlaceMadeRoom} {
		t.Run(string(reason), func(t *testing.T) {
			sims := poolSims(t, 16*gib, 16*gib)
			if reason == pool.PlaceMadeRoom {
				loadOn(t, sims[0], "b") // 11 GiB free: c (9) fits
				loadOn(t, sims[0], "a") // 8 GiB free
				loadOn(t, sims[1], "b") // the same: gpu0, the first, is chosen
				loadOn(t, sims[1], "a")
			}
			dir := filepath.Join(t.TempDir(), "leases")
			leases := vramguard.LeaseOptions{Dir: dir}
			other, err := vramguard.NewClient(vramguard.Options{Host: sims[0].URL().String(), VRAM: sims[0].GPU(), Leases: leases})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = other.Close() })
			var (
				placed pool.Placement
				rerr   error
				seen   []vramguard.LeaseInfo
			)
			c := newPool(t, sims, pool.Options{OnPlace: func(ctx context.Context, pl pool.Placement) {
				placed = pl
				// The request has not gone out: the device shows none of the load.
				_, rerr = other.Reserve(ctx, 0, 8*gib, vramguard.ReserveOptions{For: "render"})
				if rep, _ := other.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 1, DryRun: true}); rep != nil && rep.Snapshot != nil {
					seen = rep.Snapshot.Device(0).Reserved
				}
			}}, vramguard.Options{Leases: leases})
			if _, err := gen(t.Context(), c, "c"); err != nil {
				t.Fatal(err)
			}
			if placed.Member != "gpu0" || placed.Reason != reason {
				t.Fatalf("placement %+v; want gpu0, %s", placed, reason)
			}
			if len(seen) != 1 || seen[0].Load != "c:latest" || seen[0].Bytes < 9*gib {
				t.Fatalf("another program saw reserved %+v during the placement; want the load of c", seen)
			}
			re := roomErrOf(t, rerr)
			if len(re.Reserved) != 1 || re.Reserved[0].Load != "c:latest" {
				t.Fatalf("another program's Reserve during the placement: %v; want refused naming the load of c", rerr)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*.reserve")); len(left) != 0 {
				t.Fatalf("reservations left after the member answered: %v", left)
			}
		})
	}
}

func roomErrOf(t *testing.T, err error) *vramguard.RoomError {
	t.Helper()
	var re *vramguard.RoomError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a *RoomError", err)
	}
	return re
}
