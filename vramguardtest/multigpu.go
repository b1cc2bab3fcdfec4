package vramguardtest

import (
	"context"
	"fmt"
	"time"

	"github.com/vramguard/vramguard"
)

// MultiGPU is a fake machine of several GPUs over one [Server]'s memory
// ledger, as one `ollama serve` that spans several devices is: each holder
// is on the device On names for it (a runner by its model's name, "big"
// or "big:latest" alike, a reservation by its owner; device 0 when On
// does not name it), and device i has Totals[i] bytes. It is the reader a test
// of device-aware room-making needs: which model a room on device 1 may
// cost, and that nothing on device 0 goes for it. Set [Config.TotalVRAM]
// to the sum of Totals, so that the Server's own ledger has room for all.
//
// With Anonymous, runners are listed without their model, as NVML lists
// them before package gpu's NameRunners names them: a reader of several
// devices that cannot say which device a model is on, which room-making
// refuses to guess about (vramguard.ErrUnattributed).
//
// A MultiGPU is safe for concurrent use as long as On is not changed
// after its first snapshot.
type MultiGPU struct {
	Server *Server
	// Totals are the devices' sizes, one per device; at least one.
	Totals []uint64
	// On places holders on devices by name.
	On map[string]int
	// Anonymous lists runners without their model's name.
	Anonymous bool
}

var _ vramguard.VRAMReader = (*MultiGPU)(nil)

// Snapshot returns every device with the holders On places there. A
// device's Used is the sum of its holders (capped at its total) and Free
// the rest. It fails with vramguard.KindCanceled when ctx is done, and
// with vramguard.KindInvalidInput when Totals is empty or On names a
// device past it.
func (g *MultiGPU) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, &vramguard.Error{Op: "snapshot", Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	if len(g.Totals) == 0 {
		return nil, &vramguard.Error{Op: "snapshot", Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("fake GPUs: no Totals")}
	}
	snap := &vramguard.VRAMSnapshot{Source: GPUSource, Taken: time.Now()}
	for i, total := range g.Totals {
		snap.Devices = append(snap.Devices, vramguard.DeviceMemory{
			Index: i, Name: fmt.Sprintf("Simulated GPU %d", i), UUID: fmt.Sprintf("GPU-simulated-%d", i),
			Total: total, ProcessesKnown: true, Processes: []vramguard.GPUProcess{},
		})
	}
	on := make(map[string]int, len(g.On))
	for name, i := range g.On {
		on[name] = i
		on[vramguard.NormalizeModelName(name)] = i
	}
	used := make([]uint64, len(g.Totals))
	for _, h := range g.Server.Holders() {
		i := on[h.Name]
		if i < 0 || i >= len(g.Totals) {
			return nil, &vramguard.Error{Op: "snapshot", Kind: vramguard.KindInvalidInput,
				Err: fmt.Errorf("fake GPUs: %s is on device %d of %d", h.Name, i, len(g.Totals))}
		}
		p := vramguard.GPUProcess{PID: h.PID, UsedBytes: h.Bytes, UsedKnown: true, Command: h.Name, Role: vramguard.RoleOther}
		if h.Runner {
			p.Command, p.Role = "ollama runner ("+h.Name+")", vramguard.RoleOllamaRunner
			if g.Anonymous {
				p.Command = "ollama runner"
			} else {
				p.Model = h.Name
			}
		}
		d := &snap.Devices[i]
		d.Processes = append(d.Processes, p)
		used[i] += h.Bytes
	}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		d.Used = min(used[i], d.Total)
		d.Free = d.Total - d.Used
	}
	return snap, nil
}
