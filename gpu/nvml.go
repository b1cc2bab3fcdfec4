//go:build linux && cgo

package gpu

import (
	"context"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/nvmlglue"
)

// nvmlSource reads device memory and GPU processes through NVML, which it
// keeps initialised until close. NVML calls are serialised.
type nvmlSource struct {
	lib  *nvmlglue.Library
	proc procFS
}

// NewNVMLReader initialises NVML and returns a reader that keeps it
// initialised until Close. Without an NVIDIA driver it returns an *Error of
// KindUnavailable wrapping nvml.ERROR_LIBRARY_NOT_FOUND, and makes no
// further NVML call (one would kill the process).
//
// This build has cgo on Linux; other builds have a NewNVMLReader that
// always returns KindUnavailable.
func NewNVMLReader(opts ReaderOptions) (*DeviceReader, error) {
	return NewNVMLReaderFrom(nvml.New(), opts)
}

// NewNVMLReaderFrom is NewNVMLReader reading through lib, for example a
// go-nvml mock (github.com/NVIDIA/go-nvml/pkg/nvml/mock) in tests. It calls
// lib.Init and, if that succeeds, lib.Extensions to probe for
// GetMemoryInfo_v2; the reader's Close calls lib.Shutdown. It exists only
// in cgo builds on Linux.
func NewNVMLReaderFrom(lib nvml.Interface, opts ReaderOptions) (*DeviceReader, error) {
	const op = "new nvml reader"
	if lib == nil {
		return nil, invalid(op, "", "nil nvml interface")
	}
	if err := opts.validate(op); err != nil {
		return nil, err
	}
	l, err := nvmlglue.Open(lib)
	if err != nil {
		return nil, newError(op, "", vramguard.KindUnavailable, err)
	}
	return &DeviceReader{src: &nvmlSource{lib: l, proc: newProcFS(opts.ProcRoot)}}, nil
}

func (r *nvmlSource) name() string { return SourceNVML }

// snapshot reads every device; see DeviceReader.Snapshot. A failed NVML
// call, or a closed library, gives KindUnavailable wrapping the nvml.Return.
func (r *nvmlSource) snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	const op = "nvml snapshot"
	devs, err := r.lib.Devices(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, newError(op, "", vramguard.KindCanceled, context.Cause(ctx))
		}
		return nil, newError(op, "", vramguard.KindUnavailable, err)
	}
	snap := &vramguard.VRAMSnapshot{Source: SourceNVML, Taken: time.Now(), Devices: make([]vramguard.DeviceMemory, len(devs))}
	for i, d := range devs {
		dm := vramguard.DeviceMemory{
			Index:          d.Index,
			Name:           d.Name,
			UUID:           d.UUID,
			Total:          d.Total,
			Free:           d.Free,
			Used:           satAdd(d.Used, d.Reserved), // as GetMemoryInfo (v1) counts it
			ProcessesKnown: d.ProcessesKnown,
		}
		if d.ProcessesKnown {
			dm.Processes = make([]vramguard.GPUProcess, len(d.Processes))
			for j, p := range d.Processes {
				gp := vramguard.GPUProcess{PID: p.PID, UsedBytes: p.UsedBytes, UsedKnown: p.UsedKnown}
				r.proc.describe(&gp, "")
				dm.Processes[j] = gp
			}
		}
		snap.Devices[i] = dm
	}
	return snap, nil
}

// close shuts NVML down, waiting for a snapshot in progress.
func (r *nvmlSource) close() error {
	if err := r.lib.Close(); err != nil {
		return newError("close nvml reader", "", vramguard.KindUnavailable, err)
	}
	return nil
}
