package pool

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
)

// reader is the pool client's VRAM reader: member i's device as device i,
// each read with the member's listing, so that every model the member
// lists counts on its device. A runner the member's reader does not name
// is stood for by the listing: the model, with Ollama's size_vram.
// A member that does not answer (or whose device cannot be read) shows
// its last reading with no free memory (nothing is presumed free on a
// device not read) and its last listing, so that its models never count
// for another device; a member never read is left out, and the snapshot
// fails when no member answers.
type reader struct{ t *transport }

// Snapshot reads every member that answers, side by side.
func (r *reader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	t := r.t
	devs := make([]*vramguard.DeviceMemory, len(t.members))
	errs := make([]error, len(t.members))
	var wg sync.WaitGroup
	for i, m := range t.members {
		wg.Go(func() {
			if !t.ready(ctx, m) {
				errs[i] = &MemberError{Member: m.name, Err: errDown}
				devs[i] = m.stale()
				return
			}
			actx, cancel := context.WithTimeout(ctx, t.answerTimeout)
			defer cancel()
			listed, err := m.list(actx)
			if err != nil {
				t.failed(m, err)
				errs[i] = &MemberError{Member: m.name, Err: err}
				devs[i] = m.stale()
				return
			}
			d, err := m.device1(actx)
			if err != nil {
				errs[i] = &MemberError{Member: m.name, Err: err}
				devs[i] = m.stale()
				return
			}
			c := *d
			c.Index = i
			c.Processes = append([]vramguard.GPUProcess(nil), d.Processes...)
			label(&c, listed, m.name)
			m.mu.Lock()
			m.lastDev = &c
			m.mu.Unlock()
			devs[i] = &c
		})
	}
	wg.Wait()
	snap := &vramguard.VRAMSnapshot{Source: "pool", Taken: time.Now()}
	read := 0
	for i, d := range devs {
		if d != nil {
			snap.Devices = append(snap.Devices, *d)
		}
		if errs[i] == nil {
			read++
		}
	}
	if read == 0 {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, errors.Join(errs...)
	}
	return snap, nil
}

// label names, on a member's device, the runner of each model the member
// lists and the reader does not name: the listing stands for the reader's
// unnamed runners there (dropped, lest their memory count twice).
func label(d *vramguard.DeviceMemory, listed []api.ProcessModelResponse, member string) {
	named := map[string]bool{}
	for _, p := range d.Processes {
		if p.Role == vramguard.RoleOllamaRunner && p.Model != "" {
			named[vramguard.NormalizeModelName(p.Model)] = true
		}
	}
	var add []vramguard.GPUProcess
	for _, m := range listed {
		if m.SizeVRAM > 0 && !named[vramguard.NormalizeModelName(m.Model)] {
			add = append(add, vramguard.GPUProcess{Role: vramguard.RoleOllamaRunner, Model: m.Model,
				UsedBytes: uint64(m.SizeVRAM), UsedKnown: true, Command: "listed by pool member " + member})
		}
	}
	if len(add) == 0 {
		return
	}
	keep := d.Processes[:0]
	for _, p := range d.Processes {
		if p.Role != vramguard.RoleOllamaRunner || p.Model != "" {
			keep = append(keep, p)
		}
	}
	d.Processes, d.ProcessesKnown = append(keep, add...), true
}

// stale is the member's last reading, with its last listing and no free
// memory: what the snapshot shows of a member it could not read.
func (m *member) stale() *vramguard.DeviceMemory {
	listed := m.lastListing()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastDev == nil {
		return nil
	}
	c := *m.lastDev
	c.Processes = append([]vramguard.GPUProcess(nil), c.Processes...)
	c.Used, c.Free = c.Total, 0
	label(&c, listed, m.name)
	return &c
}
