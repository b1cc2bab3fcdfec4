// Package simvram presents the simulator's GPU ledger as a
// vramguard.VRAMReader, so the pipeline example and the tests see "device
// memory" that moves as the simulated Ollama loads and unloads models.
package simvram

import (
	"context"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/sim"
)

// Source is the Source of the snapshots a Reader takes.
const Source = "simulated"

// Reader reads a simulated GPU. It is safe for concurrent use.
type Reader struct {
	S *sim.Server
	// Name is the device name; empty means "Simulated GPU".
	Name string
}

var _ vramguard.VRAMReader = (*Reader)(nil)

// Snapshot returns one device, index 0, with the simulator's holders as
// processes: Ollama runners (command "ollama runner") and reservations
// (command = the owner's name).
func (r *Reader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, &vramguard.Error{Op: "snapshot", Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	total, used, free := r.S.Memory()
	name := r.Name
	if name == "" {
		name = "Simulated GPU"
	}
	d := vramguard.DeviceMemory{
		Index: 0, Name: name, UUID: "GPU-simulated-0",
		Total: total, Used: used, Free: free, ProcessesKnown: true,
		Processes: []vramguard.GPUProcess{},
	}
	for _, h := range r.S.Holders() {
		p := vramguard.GPUProcess{PID: h.PID, UsedBytes: h.Bytes, UsedKnown: true, Command: h.Name, Role: vramguard.RoleOther}
		if h.Runner {
			p.Command, p.Role = "ollama runner ("+h.Name+")", vramguard.RoleOllamaRunner
		}
		d.Processes = append(d.Processes, p)
	}
	return &vramguard.VRAMSnapshot{Source: Source, Taken: time.Now(), Devices: []vramguard.DeviceMemory{d}}, nil
}
