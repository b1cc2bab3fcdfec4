package vramguard_test

import (
	"context"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// blindReader is a reader that lists no processes (a ROCm or remote
// reader that reports only free and total), over the fake GPU.
type blindReader struct{ r vramguard.VRAMReader }

func (b blindReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	s, err := b.r.Snapshot(ctx)
	if s != nil {
		for i := range s.Devices {
			s.Devices[i].Processes, s.Devices[i].ProcessesKnown = nil, false
		}
	}
	return s, err
}

// TestReceiptsPerModel (issue #45, item 6): when one EnsureFree or one
// hand-over unloads two models together, each UnloadReport.VRAMFreed is
// that model's share, not the whole rise: the shares add up to no more
// than the rise the call reports (FreeAfter - FreeBefore), and each is the
// model's own bytes, what its runner held (a reader that lists processes)
// or Ollama's size_vram (one that lists none; the simulator's is exact).
// Before, each report was the whole rise its unload saw: big and mid on a
// 24 GiB GPU reported 14 GiB each, 28 GiB for a rise of 14.
func TestReceiptsPerModel(t *testing.T) {
	sizes := map[string]int64{"big:latest": 8 * gib, "mid:latest": 6 * gib}
	tests := []struct {
		name     string
		handover bool // Phase.End's hand-over, else EnsureFree
		blind    bool // the reader lists no processes
		// lag: the driver gives a runner's memory back this long after
		// it left; each unload then waits for its own runner, not for
		// the other model's memory.
		lag time.Duration
	}{
		{name: "EnsureFree"},
		{name: "EnsureFree, no processes", blind: true},
		{name: "hand-over", handover: true},
		{name: "hand-over, no processes", handover: true, blind: true},
		{name: "EnsureFree, driver lag", lag: 150 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := threeModelSim(t, vramguardtest.Config{ReleaseLag: tt.lag})
			loadForever(t, s, "big", "mid", "small") // 16 of 24 GiB
			var r vramguard.VRAMReader = s.GPU()
			if tt.blind {
				r = blindReader{r: r}
			}
			c, _ := countedClient(t, s, vramguard.Options{VRAM: r, VerifyVRAM: true,
				Leases: vramguard.LeaseOptions{Dir: leaseDir(t)}})
			// 20 GiB free needs 12 more: big and mid (14 GiB) together.
			const need = 20 * gib
			var rep *vramguard.EnsureReport
			if tt.handover {
				p, err := c.StartPhase(t.Context(), "llm", vramguard.PhaseOptions{NeedBytes: need})
				if err != nil {
					t.Fatal(err)
				}
				pr, err := p.End(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				rep = pr.Handover
			} else {
				var err error
				if rep, err = c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: need}); err != nil {
					t.Fatal(err)
				}
			}
			if len(rep.Evicted) != 2 || sizes[rep.Evicted[0].Model] != 8*gib || sizes[rep.Evicted[1].Model] != 6*gib {
				t.Fatalf("evicted %+v; want big and mid", rep.Evicted)
			}
			rise := int64(rep.FreeAfter) - int64(rep.FreeBefore)
			var sum int64
			for _, u := range rep.Evicted {
				sum += u.VRAMFreed
				if !u.Verified || u.Checked&vramguard.CheckDeviceMemory == 0 {
					t.Errorf("%s: verified %v by %v; want the device memory among the checks", u.Model, u.Verified, u.Checked)
				}
				if u.VRAMFreed != sizes[u.Model] {
					t.Errorf("%s: VRAMFreed %d MiB, want its own %d MiB", u.Model, u.VRAMFreed>>20, sizes[u.Model]>>20)
				}
			}
			if sum > rise {
				t.Errorf("the reports add up to %d MiB, more than the %d MiB the call freed", sum>>20, rise>>20)
			}
		})
	}
}

// TestReceiptOwnRunner: a lone unload with VerifyVRAM counts what its own
// runner held, and waits for that runner: another program that gives
// memory back meanwhile (here 6 GiB, while the driver still holds the
// model's 8 GiB) neither ends the wait nor enters the receipt. Before, the
// wait ended on the other program's 6 GiB (75% of the model's estimate)
// and the report said 6 GiB.
func TestReceiptOwnRunner(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{ReleaseLag: 300 * time.Millisecond})
	loadForever(t, s, "big")
	if err := s.Reserve("comfyui", 6*gib); err != nil {
		t.Fatal(err)
	}
	c, _ := countedClient(t, s, vramguard.Options{VRAM: s.GPU(), VerifyVRAM: true, Leases: vramguard.LeaseOptions{Dir: leaseDir(t)}})
	type result struct {
		rep *vramguard.UnloadReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := c.UnloadModel(t.Context(), "big")
		done <- result{rep, err}
	}()
	eventually(t, s, "big unlisted", func() bool { return !s.Listed("big") })
	s.Release("comfyui")
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.rep.VRAMFreed != 8*gib {
		t.Errorf("VRAMFreed %d MiB; want big's own 8192 MiB", r.rep.VRAMFreed>>20)
	}
	if _, _, free := s.Memory(); free != 24*gib {
		t.Errorf("%d MiB free after the unload; want all 24 GiB (big's memory back)", free>>20)
	}
}
