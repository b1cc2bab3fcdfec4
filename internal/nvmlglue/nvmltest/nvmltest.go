//go:build linux && cgo

package nvmltest

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// GPU describes one mocked device. Zero Return fields mean nvml.SUCCESS.
type GPU struct {
	Name, UUID                  string
	Total, Free, Used, Reserved uint64
	Compute, Graphics           []nvml.ProcessInfo
	HandleRet, NameRet, UUIDRet nvml.Return
	MemoryRet, MemoryV2Ret      nvml.Return
	ComputeRet, GraphicsRet     nvml.Return
}

// Machine describes a mocked NVML library.
type Machine struct {
	GPUs []GPU
	// HasMemoryInfoV2 makes LookupSymbol find nvmlDeviceGetMemoryInfo_v2.
	// Without it the mocked GetMemoryInfo_v2 panics when called, as calling
	// a missing symbol kills a real process.
	HasMemoryInfoV2 bool
	InitRet         nvml.Return
	CountRet        nvml.Return
	ShutdownRet     nvml.Return
}

// Interface returns a mock of m. Only the functions a reader needs are set;
// any other call panics.
func (m Machine) Interface() *mock.Interface {
	devs := make([]*mock.Device, len(m.GPUs))
	for i, g := range m.GPUs {
		devs[i] = device(g, m.HasMemoryInfoV2)
	}
	return &mock.Interface{
		InitFunc:     func() nvml.Return { return m.InitRet },
		ShutdownFunc: func() nvml.Return { return m.ShutdownRet },
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
				if m.HasMemoryInfoV2 && name == "nvmlDeviceGetMemoryInfo_v2" {
					return nil
				}
				return nvml.ERROR_NOT_FOUND
			}}
		},
		DeviceGetCountFunc: func() (int, nvml.Return) {
			if m.CountRet != nvml.SUCCESS {
				return 0, m.CountRet
			}
			return len(devs), nvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			if r := m.GPUs[i].HandleRet; r != nvml.SUCCESS {
				return nil, r
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

func device(g GPU, hasV2 bool) *mock.Device {
	d := &mock.Device{
		GetNameFunc: func() (string, nvml.Return) { return g.Name, g.NameRet },
		GetUUIDFunc: func() (string, nvml.Return) { return g.UUID, g.UUIDRet },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			// v1 counts reserved memory as used.
			return nvml.Memory{Total: g.Total, Free: g.Free, Used: g.Used + g.Reserved}, g.MemoryRet
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return g.Compute, g.ComputeRet
		},
		GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return g.Graphics, g.GraphicsRet
		},
	}
	if hasV2 {
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			return nvml.Memory_v2{Total: g.Total, Free: g.Free, Used: g.Used, Reserved: g.Reserved}, g.MemoryV2Ret
		}
	}
	return d
}

// NoLibrary returns a mock whose Init fails with ERROR_LIBRARY_NOT_FOUND
// and whose every other function is nil, so that any further call panics.
func NoLibrary() *mock.Interface {
	return &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
}
