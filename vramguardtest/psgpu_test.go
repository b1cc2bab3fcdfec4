package vramguardtest_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A PSGPU follows what /api/ps lists: a listed model is a runner holding
// its size, a reservation another process; Used and Free add up to Total;
// a refused reservation and a failed listing are errors.
func TestPSGPUFollowsListing(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) { m.SizeVRAM = 3 * gib })}})
	g := &vramguardtest.PSGPU{Client: c, Total: 8 * gib, Index: 2}
	snap := func() vramguard.DeviceMemory {
		t.Helper()
		sn, err := g.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		d := sn.Device(2)
		if d == nil || d.Used+d.Free != d.Total || !d.ProcessesKnown {
			t.Fatalf("snapshot %+v: want device 2 whose used and free add up", sn)
		}
		return *d
	}
	if d := snap(); d.Used != 0 || len(d.Processes) != 0 {
		t.Errorf("before any load: %+v", d)
	}
	if r := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p", KeepAlive: keepAlive(time.Hour)}); r.err != nil {
		t.Fatal(r.err)
	}
	if err := g.Reserve(t.Context(), "comfyui", 4*gib); err != nil {
		t.Fatal(err)
	}
	var ve *vramguardtest.VRAMError
	if err := g.Reserve(t.Context(), "encoder", 2*gib); !errors.As(err, &ve) || ve.Free != 1*gib {
		t.Errorf("Reserve past the free memory = %v; want a *VRAMError with 1 GiB free", err)
	}
	d := snap()
	if d.Used != 7*gib || len(d.Processes) != 2 {
		t.Fatalf("after a load and a reservation: %+v", d)
	}
	run, other := d.Processes[0], d.Processes[1]
	if run.Role != vramguard.RoleOllamaRunner || run.Model != "tiny:latest" || run.UsedBytes != 3*gib || run.PID == 0 {
		t.Errorf("runner %+v; want tiny's runner with its 3 GiB", run)
	}
	if other.Role != vramguard.RoleOther || other.Command != "comfyui" || other.UsedBytes != 4*gib {
		t.Errorf("other process %+v; want comfyui's 4 GiB", other)
	}
	g.Release("comfyui")
	if d := snap(); d.Used != 3*gib {
		t.Errorf("after Release: used %d, want 3 GiB", d.Used)
	}
	s.Close()
	if _, err := g.Snapshot(t.Context()); !errors.Is(err, vramguard.KindUnavailable) {
		t.Errorf("Snapshot of a stopped server = %v; want KindUnavailable", err)
	}
}

// Concurrent reservations are counted against each other: of ten 1 GiB
// reservations on a 4 GiB device, four succeed.
func TestPSGPUReserveConcurrent(t *testing.T) {
	_, c := start(t, vramguardtest.Config{})
	g := &vramguardtest.PSGPU{Client: c, Total: 4 * gib}
	var wg sync.WaitGroup
	var ok atomic.Int32
	for i := range 10 {
		wg.Go(func() {
			if g.Reserve(t.Context(), fmt.Sprintf("p%d", i), gib) == nil {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 4 {
		t.Errorf("%d reservations of 1 GiB succeeded on a 4 GiB device; want 4", ok.Load())
	}
}
