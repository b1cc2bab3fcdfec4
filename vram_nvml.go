//go:build linux && cgo

package vramguard

import (
	"context"
	"errors"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vramguard/vramguard/internal/nvmlglue"
)

// NVMLOptions configures an NVMLReader. The zero value reads the system's
// NVML library (libnvidia-ml.so.1, opened at NewNVMLReader) and resolves
// process commands under /proc.
type NVMLOptions struct {
	// ProcRoot is where procfs is mounted; "" means /proc. Commands are
	// not resolved when this program runs in a child PID namespace (a
	// container without --pid=host), where NVML's host PIDs name other
	// processes: Command is then empty and Role RoleUnknown.
	ProcRoot string
}

// NVMLReader reads device memory and GPU processes through NVML. It keeps
// NVML initialised from NewNVMLReader to Close. The zero value is not
// usable: its Snapshot returns KindUnavailable.
//
// It is safe for concurrent use; NVML calls are serialised.
type NVMLReader struct {
	lib  *nvmlglue.Library
	proc vramProcFS
}

var _ VRAMReader = (*NVMLReader)(nil)

// NewNVMLReader initialises NVML. Without an NVIDIA driver it returns an
// *Error of KindUnavailable wrapping nvml.ERROR_LIBRARY_NOT_FOUND, and makes
// no further NVML call (one would kill the process). Call Close when done.
//
// This build has cgo on Linux; other builds have a NewNVMLReader that
// always returns KindUnavailable.
func NewNVMLReader(opts NVMLOptions) (*NVMLReader, error) {
	return NewNVMLReaderFrom(nvml.New(), opts)
}

// NewNVMLReaderFrom is NewNVMLReader reading through lib, for example a
// go-nvml mock (github.com/NVIDIA/go-nvml/pkg/nvml/mock) in tests. It calls
// lib.Init and, if that succeeds, lib.Extensions to probe for
// GetMemoryInfo_v2. It exists only in cgo builds on Linux.
func NewNVMLReaderFrom(lib nvml.Interface, opts NVMLOptions) (*NVMLReader, error) {
	const op = "new nvml reader"
	if lib == nil {
		return nil, invalid(op, "", "nil nvml interface")
	}
	l, err := nvmlglue.Open(lib)
	if err != nil {
		return nil, newError(op, "", KindUnavailable, err)
	}
	return &NVMLReader{lib: l, proc: newVRAMProcFS(opts.ProcRoot)}, nil
}

// Snapshot reads every device. NVML calls cannot be interrupted; ctx is
// checked before and between devices, and when it is done Snapshot returns
// an *Error of KindCanceled holding context.Cause(ctx). A failed NVML call
// or a closed reader gives KindUnavailable, wrapping the nvml.Return.
//
// Used counts driver-reserved memory (GetMemoryInfo_v2's Reserved) as used,
// as GetMemoryInfo does, so Free+Used is Total whichever the driver offers.
func (r *NVMLReader) Snapshot(ctx context.Context) (*VRAMSnapshot, error) {
	const op = "nvml snapshot"
	if r.lib == nil {
		return nil, newError(op, "", KindUnavailable, errors.New("reader not made by NewNVMLReader"))
	}
	devs, err := r.lib.Devices(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, newError(op, "", KindCanceled, context.Cause(ctx))
		}
		return nil, newError(op, "", KindUnavailable, err)
	}
	snap := &VRAMSnapshot{Source: SourceNVML, Taken: time.Now(), Devices: make([]DeviceMemory, len(devs))}
	for i, d := range devs {
		dm := DeviceMemory{
			Index:          d.Index,
			Name:           d.Name,
			UUID:           d.UUID,
			Total:          d.Total,
			Free:           d.Free,
			Used:           vramSatAdd(d.Used, d.Reserved),
			ProcessesKnown: d.ProcessesKnown,
		}
		if d.ProcessesKnown {
			dm.Processes = make([]GPUProcess, len(d.Processes))
			for j, p := range d.Processes {
				gp := GPUProcess{PID: p.PID, UsedBytes: p.UsedBytes, UsedKnown: p.UsedKnown}
				r.proc.describe(&gp, "")
				dm.Processes[j] = gp
			}
		}
		snap.Devices[i] = dm
	}
	return snap, nil
}

// Close shuts NVML down; it waits for a Snapshot in progress. Later calls
// do nothing and return nil, and Snapshot then fails with KindUnavailable.
func (r *NVMLReader) Close() error {
	if r.lib == nil {
		return nil
	}
	if err := r.lib.Close(); err != nil {
		return newError("close nvml reader", "", KindUnavailable, err)
	}
	return nil
}
