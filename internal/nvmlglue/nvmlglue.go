//go:build linux && cgo

package nvmlglue

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrClosed is returned by Library.Devices after Close.
var ErrClosed = errors.New("nvml library closed")

// symbolMemoryInfoV2 is the C symbol behind Device.GetMemoryInfo_v2, which
// go-nvml calls without checking that the driver exports it.
const symbolMemoryInfoV2 = "nvmlDeviceGetMemoryInfo_v2"

// pidMax is PID_MAX_LIMIT on 64-bit Linux (4194304): no process ID can be
// larger, so a larger one in a process list is garbage.
const pidMax = 1 << 22

// Device is one GPU as NVML reports it.
type Device struct {
	Index int
	Name  string // empty if NVML could not tell
	UUID  string // empty if NVML could not tell
	Total uint64
	Free  uint64
	// Used excludes Reserved when the figures come from GetMemoryInfo_v2;
	// GetMemoryInfo (v1) counts reserved memory as used and Reserved is 0.
	Used     uint64
	Reserved uint64
	// Processes lists the compute and graphics processes holding memory on
	// the device, one entry per PID. It is nil when ProcessesKnown is false
	// (the driver cannot list processes, as under WSL or some vGPUs).
	Processes      []Process
	ProcessesKnown bool
	// Dropped counts process entries discarded as garbage: PID 0, a PID no
	// Linux kernel can assign, memory larger than the device, or a PID
	// already listed in the same list.
	Dropped int
}

// Process is a process holding memory on a device.
type Process struct {
	PID uint32
	// UsedBytes is the process's device memory; 0 when UsedKnown is false.
	UsedBytes uint64
	// UsedKnown is false when the driver reports the memory as not
	// available (math.MaxUint64), as it does in some containers and on WDDM.
	UsedKnown bool
}

// Library is an initialised NVML library.
//
// Its methods are safe for concurrent use; NVML calls are serialised.
type Library struct {
	lib nvml.Interface
	// sem is a one-slot semaphore guarding lib and the fields below; a
	// channel rather than a mutex so that waiting for it honours ctx.
	sem   chan struct{}
	open  bool
	hasV2 bool
}

// Open initialises lib and returns it ready for Devices. When Init fails
// Open makes no other call to lib (not even Shutdown) and returns an error
// wrapping the nvml.Return, for example nvml.ERROR_LIBRARY_NOT_FOUND when no
// driver is installed.
func Open(lib nvml.Interface) (*Library, error) {
	if lib == nil {
		return nil, errors.New("nil nvml interface")
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml init: %w", ret)
	}
	l := &Library{lib: lib, sem: make(chan struct{}, 1), open: true}
	// The library is loaded now, so looking up a symbol is safe.
	l.hasV2 = lib.Extensions().LookupSymbol(symbolMemoryInfoV2) == nil
	return l, nil
}

// HasMemoryInfoV2 reports whether the driver exports
// nvmlDeviceGetMemoryInfo_v2, which Devices then prefers.
func (l *Library) HasMemoryInfoV2() bool { return l.hasV2 }

// Close shuts NVML down. It makes exactly one Shutdown call for the Init
// made by Open; later calls return nil and do nothing. Close waits for a
// Devices call in progress.
func (l *Library) Close() error {
	l.sem <- struct{}{}
	defer func() { <-l.sem }()
	if !l.open {
		return nil
	}
	l.open = false
	if ret := l.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %w", ret)
	}
	return nil
}

// Devices reads every device. NVML calls cannot be interrupted, so ctx is
// checked while waiting for the library and between devices; when it is
// done Devices returns context.Cause(ctx).
//
// A failure to get a device's handle or memory fails the whole call; a
// failure to read its name, UUID or processes leaves those empty (and
// ProcessesKnown false) instead.
func (l *Library) Devices(ctx context.Context) ([]Device, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-l.sem }()
	if !l.open {
		return nil, ErrClosed
	}

	n, ret := l.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %w", ret)
	}
	devs := make([]Device, 0, n)
	for i := range n {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		d, err := l.device(i)
		if err != nil {
			return nil, err
		}
		devs = append(devs, d)
	}
	return devs, nil
}

func (l *Library) device(i int) (Device, error) {
	d := Device{Index: i}
	h, ret := l.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("nvml device %d handle: %w", i, ret)
	}
	if name, ret := h.GetName(); ret == nvml.SUCCESS {
		d.Name = name
	}
	if uuid, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.UUID = uuid
	}
	if err := l.memory(h, &d); err != nil {
		return d, err
	}

	compute, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		// NOT_SUPPORTED under WSL and on some vGPUs; any other failure
		// leaves the list unknown too rather than failing the figures.
		return d, nil
	}
	d.ProcessesKnown = true
	d.Processes = make([]Process, 0, len(compute))
	d.Processes, d.Dropped = appendSane(d.Processes, compute, d.Total)
	// Graphics contexts (a display server, a browser) hold memory too.
	// Failing to list them is not worth failing the device for.
	if graphics, ret := h.GetGraphicsRunningProcesses(); ret == nvml.SUCCESS {
		var dropped int
		d.Processes, dropped = appendSane(d.Processes, graphics, d.Total)
		d.Dropped += dropped
	}
	return d, nil
}

func (l *Library) memory(h nvml.Device, d *Device) error {
	if l.hasV2 {
		m, ret := h.GetMemoryInfo_v2()
		if ret == nvml.SUCCESS {
			d.Total, d.Free, d.Used, d.Reserved = m.Total, m.Free, m.Used, m.Reserved
			return nil
		}
		// Exported but not supported for this device: fall back to v1.
	}
	m, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml device %d memory: %w", d.Index, ret)
	}
	d.Total, d.Free, d.Used = m.Total, m.Free, m.Used
	return nil
}

// appendSane appends the plausible entries of infos to procs and returns how
// many it dropped. An entry whose PID is already in procs from an earlier
// list (a process with both compute and graphics contexts) is merged, not
// dropped; a PID repeated within infos is garbage.
func appendSane(procs []Process, infos []nvml.ProcessInfo, total uint64) ([]Process, int) {
	prior := len(procs)
	dropped := 0
	for _, info := range infos {
		if info.Pid == 0 || info.Pid > pidMax {
			dropped++
			continue
		}
		p := Process{PID: info.Pid}
		if info.UsedGpuMemory != math.MaxUint64 {
			if total > 0 && info.UsedGpuMemory > total {
				dropped++
				continue
			}
			p.UsedBytes, p.UsedKnown = info.UsedGpuMemory, true
		}
		j := indexPID(procs, p.PID)
		switch {
		case j < 0:
			procs = append(procs, p)
		case j >= prior:
			dropped++
		default:
			procs[j] = merge(procs[j], p)
		}
	}
	return procs, dropped
}

// indexPID returns the index of pid in procs, or -1. Lists are short (a
// handful of processes per device), so a scan beats a map.
func indexPID(procs []Process, pid uint32) int {
	for i := range procs {
		if procs[i].PID == pid {
			return i
		}
	}
	return -1
}

// merge combines two reports of one process. NVML reports a process's
// memory, not a context's, in both lists, so the figures are not added.
func merge(a, b Process) Process {
	if !a.UsedKnown || (b.UsedKnown && b.UsedBytes > a.UsedBytes) {
		return b
	}
	return a
}
