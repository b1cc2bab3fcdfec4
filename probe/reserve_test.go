package probe_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/probe"
)

// /ready?free= counts other programs' reservations where the client has a
// GPU reader: a device whose driver shows the room, but whose room is
// reserved for a render, is not ready, the reservation named as a holder;
// a client without a reader says reservations were not checked.
func TestReadyCountsReservations(t *testing.T) {
	s := newSim(t)
	leases := vramguard.LeaseOptions{Dir: filepath.Join(t.TempDir(), "leases")}
	newClient := func(vram vramguard.VRAMReader) *vramguard.OllamaClient {
		c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: vram, Leases: leases, KeepModelsOnClose: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	holder := newClient(s.GPU())
	if _, err := holder.Reserve(t.Context(), 0, 20*gib, vramguard.ReserveOptions{For: "render 7"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		client    *vramguard.OllamaClient
		ready     bool
		reserved  bool
		countedAs string
	}{
		{"client with a reader", newClient(s.GPU()), false, true, "counted"},
		{"client without a reader", newClient(nil), true, false, "not checked: the client has no GPU reader"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := probe.New(probe.Config{Client: tc.client, VRAM: s.GPU()})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			r := h.Ready(context.Background(), probe.Query{Free: 8 * gib, HasFree: true})
			d := r.Device
			if r.Ready != tc.ready || !strings.HasPrefix(d.Reservations, tc.countedAs) {
				t.Fatalf("ready %v, reservations %q, reasons %q; want ready %v, %q", r.Ready, d.Reservations, r.Reasons, tc.ready, tc.countedAs)
			}
			named := false
			for _, x := range d.Holders {
				named = named || x.Kind == "reserved" && strings.Contains(x.Name, "render 7") && x.Bytes == 20*gib
			}
			if named != tc.reserved {
				t.Errorf("holders %+v: reservation named %v, want %v", d.Holders, named, tc.reserved)
			}
			if !tc.ready && (len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], "for render 7") || !strings.Contains(r.Reasons[0], "held by: reserved ")) {
				t.Errorf("reasons %q: want the reservation named", r.Reasons)
			}
		})
	}
}
