package vramguard_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/benchstream"
	"github.com/vramguard/vramguard/vramguardtest"
)

// BenchmarkAdmissionReservationsPaired is issue #45's overhead target: a
// budget's admission with another program's reservation on the device
// costs at most 1.02x one with none. Each side is a client with a budget
// (Budget{}) on a simulator of its own, whose generation loads a model
// (KeepAliveUnload, no unload delay: every iteration is a load, so every
// iteration is admitted: an estimate, a listing, a device reading through
// the client's view, which reads the reservations). off: an empty lease
// directory; on: a directory where another client holds a 1 GiB
// reservation (which leaves room for the load). ratio is on/off
// (BENCHMARKS.md §21).
func BenchmarkAdmissionReservationsPaired(b *testing.B) {
	var sims []*vramguardtest.Server
	side := func(reserve bool) func() {
		s := newSim(b, vramguardtest.Config{UnloadDelay: -1}, vramguardtest.ModelConfig{Name: "m", SizeVRAM: 2 * gib})
		sims = append(sims, s)
		leases := vramguard.LeaseOptions{Dir: filepath.Join(b.TempDir(), "leases")}
		c := newTestClient(b, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{}, Leases: leases})
		if reserve {
			holder := newTestClient(b, s, vramguard.Options{VRAM: s.GPU(), Leases: leases})
			if _, err := holder.Reserve(b.Context(), 0, gib, vramguard.ReserveOptions{For: "bench", TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
		}
		return func() {
			if _, err := c.GenerateStreaming(b.Context(), &vramguard.GenerateRequest{Model: "m", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	benchstream.Paired(b, side(false), side(true))
	for i, s := range sims {
		if s.Loads("m") != b.N {
			b.Fatalf("side %d loaded %d times in %d iterations: not every iteration was an admission", i, s.Loads("m"), b.N)
		}
	}
}
