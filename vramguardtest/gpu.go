package vramguardtest

import (
	"context"
	"time"

	"github.com/vramguard/vramguard"
)

// GPUSource is the Source of the snapshots a [GPU] takes.
const GPUSource = "simulated"

// GPU is a fake GPU whose memory follows a [Server]'s loads: a
// [vramguard.VRAMReader] for [vramguard.Options].VRAM. Each snapshot has one
// device, index 0, whose processes are the server's runners (role
// [vramguard.RoleOllamaRunner], command "ollama runner (<model>)", Model
// the model's name) and the
// reservations made with [Server.Reserve] (role [vramguard.RoleOther],
// command = the owner). Every process is attributed, so
// [vramguard.DeviceMemory].ProcessesKnown is true.
//
// A GPU is safe for concurrent use. Its zero value is not usable: set Server.
type GPU struct {
	Server *Server
	// Name is the device name; empty means "Simulated GPU".
	Name string
}

var _ vramguard.VRAMReader = (*GPU)(nil)

// GPU returns a fake GPU reading s's memory ledger.
func (s *Server) GPU() *GPU { return &GPU{Server: s} }

// Snapshot returns the device as NVML would report it; its UUID is
// "GPU-simulated-<the server's port>", unique on the host as a real GPU's. It fails with
// [vramguard.KindCanceled] when ctx is done, and never otherwise.
func (g *GPU) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, &vramguard.Error{Op: "snapshot", Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	total, used, free := g.Server.Memory()
	name := g.Name
	if name == "" {
		name = "Simulated GPU"
	}
	d := vramguard.DeviceMemory{
		Index: 0, Name: name, UUID: "GPU-simulated-" + g.Server.URL().Port(),
		Total: total, Used: used, Free: free, ProcessesKnown: true,
		Processes: []vramguard.GPUProcess{},
	}
	for _, h := range g.Server.Holders() {
		p := vramguard.GPUProcess{PID: h.PID, UsedBytes: h.Bytes, UsedKnown: true, Command: h.Name, Role: vramguard.RoleOther}
		if h.Runner {
			p.Command, p.Role, p.Model = "ollama runner ("+h.Name+")", vramguard.RoleOllamaRunner, h.Name
		}
		d.Processes = append(d.Processes, p)
	}
	return &vramguard.VRAMSnapshot{Source: GPUSource, Taken: time.Now(), Devices: []vramguard.DeviceMemory{d}}, nil
}
