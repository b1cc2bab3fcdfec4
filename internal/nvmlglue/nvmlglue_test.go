//go:build linux && cgo

package nvmlglue_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vramguard/vramguard/internal/nvmlglue"
	"github.com/vramguard/vramguard/internal/nvmlglue/nvmltest"
)

const gib = 1 << 30

func TestOpenNoLibrary(t *testing.T) {
	lib := nvmltest.NoLibrary() // every func but Init is nil: a second call panics
	l, err := nvmlglue.Open(lib)
	if l != nil {
		t.Fatalf("Open returned a library")
	}
	if !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Fatalf("err = %v, want ERROR_LIBRARY_NOT_FOUND", err)
	}
	if n := len(lib.InitCalls()); n != 1 {
		t.Errorf("Init calls = %d, want 1", n)
	}
}

func TestOpenInitFailure(t *testing.T) {
	lib := nvmltest.Machine{InitRet: nvml.ERROR_DRIVER_NOT_LOADED, GPUs: []nvmltest.GPU{{Total: gib}}}.Interface()
	_, err := nvmlglue.Open(lib)
	if !errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED) {
		t.Fatalf("err = %v, want ERROR_DRIVER_NOT_LOADED", err)
	}
	if n := len(lib.ShutdownCalls()) + len(lib.ExtensionsCalls()) + len(lib.DeviceGetCountCalls()); n != 0 {
		t.Errorf("%d calls after a failed Init, want 0", n)
	}
}

func TestOpenNil(t *testing.T) {
	if _, err := nvmlglue.Open(nil); err == nil {
		t.Fatal("Open(nil) succeeded")
	}
}

func TestDevices(t *testing.T) {
	unknown := uint64(math.MaxUint64)
	tests := []struct {
		name    string
		machine nvmltest.Machine
		want    []nvmlglue.Device
	}{
		{
			name:    "no devices",
			machine: nvmltest.Machine{},
			want:    []nvmlglue.Device{},
		},
		{
			name: "several GPUs",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Name: "A", UUID: "GPU-a", Total: 24 * gib, Free: 20 * gib, Used: 4 * gib,
					Compute: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 3 * gib}}},
				{Name: "B", UUID: "GPU-b", Total: 16 * gib, Free: 16 * gib},
			}},
			want: []nvmlglue.Device{
				{Index: 0, Name: "A", UUID: "GPU-a", Total: 24 * gib, Free: 20 * gib, Used: 4 * gib,
					ProcessesKnown: true, Processes: []nvmlglue.Process{{PID: 100, UsedBytes: 3 * gib, UsedKnown: true}}},
				{Index: 1, Name: "B", UUID: "GPU-b", Total: 16 * gib, Free: 16 * gib,
					ProcessesKnown: true, Processes: []nvmlglue.Process{}},
			},
		},
		{
			name: "v1 counts reserved as used when v2 is missing",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: 24 * gib, Free: 20 * gib, Used: 3 * gib, Reserved: gib},
			}},
			want: []nvmlglue.Device{{Total: 24 * gib, Free: 20 * gib, Used: 4 * gib,
				ProcessesKnown: true, Processes: []nvmlglue.Process{}}},
		},
		{
			name: "v2 when the symbol is present",
			machine: nvmltest.Machine{HasMemoryInfoV2: true, GPUs: []nvmltest.GPU{
				{Total: 24 * gib, Free: 20 * gib, Used: 3 * gib, Reserved: gib},
			}},
			want: []nvmlglue.Device{{Total: 24 * gib, Free: 20 * gib, Used: 3 * gib, Reserved: gib,
				ProcessesKnown: true, Processes: []nvmlglue.Process{}}},
		},
		{
			name: "v2 present but not supported falls back to v1",
			machine: nvmltest.Machine{HasMemoryInfoV2: true, GPUs: []nvmltest.GPU{
				{Total: 24 * gib, Free: 20 * gib, Used: 3 * gib, Reserved: gib, MemoryV2Ret: nvml.ERROR_NOT_SUPPORTED},
			}},
			want: []nvmlglue.Device{{Total: 24 * gib, Free: 20 * gib, Used: 4 * gib,
				ProcessesKnown: true, Processes: []nvmlglue.Process{}}},
		},
		{
			name: "name and UUID failures leave them empty",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Name: "x", UUID: "y", NameRet: nvml.ERROR_UNKNOWN, UUIDRet: nvml.ERROR_NOT_SUPPORTED, Total: gib, Free: gib},
			}},
			want: []nvmlglue.Device{{Total: gib, Free: gib, ProcessesKnown: true, Processes: []nvmlglue.Process{}}},
		},
		{
			name: "processes not supported",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: gib, Free: gib, ComputeRet: nvml.ERROR_NOT_SUPPORTED},
			}},
			want: []nvmlglue.Device{{Total: gib, Free: gib}},
		},
		{
			name: "unknown per-process memory",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: 8 * gib, Compute: []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: unknown}, {Pid: 8, UsedGpuMemory: 0}}},
			}},
			want: []nvmlglue.Device{{Total: 8 * gib, ProcessesKnown: true, Processes: []nvmlglue.Process{
				{PID: 7}, {PID: 8, UsedKnown: true},
			}}},
		},
		{
			name: "garbage entries are dropped",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: 8 * gib, Compute: []nvml.ProcessInfo{
					{Pid: 42, UsedGpuMemory: gib},
					{Pid: 0, UsedGpuMemory: gib},                 // PID 0
					{Pid: 0xdeadbeef, UsedGpuMemory: gib},        // beyond PID_MAX_LIMIT
					{Pid: 43, UsedGpuMemory: 0xdeadbeefdeadbeef}, // more than the device
					{Pid: 42, UsedGpuMemory: 2 * gib},            // repeated
					{Pid: 44, UsedGpuMemory: 8 * gib},            // the whole device is fine
				}},
			}},
			want: []nvmlglue.Device{{Total: 8 * gib, ProcessesKnown: true, Dropped: 4, Processes: []nvmlglue.Process{
				{PID: 42, UsedBytes: gib, UsedKnown: true},
				{PID: 44, UsedBytes: 8 * gib, UsedKnown: true},
			}}},
		},
		{
			name: "graphics processes are merged by PID",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: 8 * gib,
					Compute:  []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: unknown}, {Pid: 11, UsedGpuMemory: gib}},
					Graphics: []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: gib}, {Pid: 12, UsedGpuMemory: 2 * gib}, {Pid: 12, UsedGpuMemory: 2 * gib}},
				},
			}},
			want: []nvmlglue.Device{{Total: 8 * gib, ProcessesKnown: true, Dropped: 1, Processes: []nvmlglue.Process{
				{PID: 10, UsedBytes: gib, UsedKnown: true},
				{PID: 11, UsedBytes: gib, UsedKnown: true},
				{PID: 12, UsedBytes: 2 * gib, UsedKnown: true},
			}}},
		},
		{
			name: "graphics failure keeps compute",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: 8 * gib, Compute: []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: gib}}, GraphicsRet: nvml.ERROR_UNKNOWN},
			}},
			want: []nvmlglue.Device{{Total: 8 * gib, ProcessesKnown: true, Processes: []nvmlglue.Process{
				{PID: 10, UsedBytes: gib, UsedKnown: true},
			}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := nvmlglue.Open(tt.machine.Interface())
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got, err := l.Devices(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tt.want, equalDevice) {
				t.Errorf("Devices =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func equalDevice(a, b nvmlglue.Device) bool {
	return a.Index == b.Index && a.Name == b.Name && a.UUID == b.UUID &&
		a.Total == b.Total && a.Free == b.Free && a.Used == b.Used && a.Reserved == b.Reserved &&
		a.ProcessesKnown == b.ProcessesKnown && a.Dropped == b.Dropped &&
		(a.Processes == nil) == (b.Processes == nil) && slices.Equal(a.Processes, b.Processes)
}

func TestDevicesErrors(t *testing.T) {
	tests := []struct {
		name    string
		machine nvmltest.Machine
		want    nvml.Return
	}{
		{"count", nvmltest.Machine{CountRet: nvml.ERROR_UNKNOWN}, nvml.ERROR_UNKNOWN},
		{"handle", nvmltest.Machine{GPUs: []nvmltest.GPU{{}, {HandleRet: nvml.ERROR_GPU_IS_LOST}}}, nvml.ERROR_GPU_IS_LOST},
		{"memory", nvmltest.Machine{GPUs: []nvmltest.GPU{{MemoryRet: nvml.ERROR_NO_PERMISSION}}}, nvml.ERROR_NO_PERMISSION},
		{"memory v2 and v1", nvmltest.Machine{HasMemoryInfoV2: true, GPUs: []nvmltest.GPU{
			{MemoryV2Ret: nvml.ERROR_NOT_SUPPORTED, MemoryRet: nvml.ERROR_GPU_IS_LOST},
		}}, nvml.ERROR_GPU_IS_LOST},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := nvmlglue.Open(tt.machine.Interface())
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			devs, err := l.Devices(t.Context())
			if !errors.Is(err, tt.want) || devs != nil {
				t.Fatalf("Devices = %v, %v; want nil, %v", devs, err, tt.want)
			}
		})
	}
}

func TestMemoryInfoV2Symbol(t *testing.T) {
	for _, has := range []bool{false, true} {
		lib := nvmltest.Machine{HasMemoryInfoV2: has}.Interface()
		l, err := nvmlglue.Open(lib)
		if err != nil {
			t.Fatal(err)
		}
		if l.HasMemoryInfoV2() != has {
			t.Errorf("HasMemoryInfoV2 = %v, want %v", l.HasMemoryInfoV2(), has)
		}
		l.Close()
	}
}

func TestClose(t *testing.T) {
	lib := nvmltest.Machine{GPUs: []nvmltest.GPU{{Total: gib}}}.Interface()
	l, err := nvmlglue.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown calls = %d, want 1", n)
	}
	if _, err := l.Devices(t.Context()); !errors.Is(err, nvmlglue.ErrClosed) {
		t.Errorf("Devices after Close: %v, want ErrClosed", err)
	}
	if n := len(lib.DeviceGetCountCalls()); n != 0 {
		t.Errorf("DeviceGetCount calls after Close = %d", n)
	}
}

func TestCloseShutdownFailure(t *testing.T) {
	l, err := nvmlglue.Open(nvmltest.Machine{ShutdownRet: nvml.ERROR_UNKNOWN}.Interface())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("Close = %v, want ERROR_UNKNOWN", err)
	}
}

func TestDevicesCanceled(t *testing.T) {
	lib := nvmltest.Machine{GPUs: []nvmltest.GPU{{Total: gib}}}.Interface()
	l, err := nvmlglue.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cause := errors.New("caller gave up")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	if _, err := l.Devices(ctx); !errors.Is(err, cause) {
		t.Fatalf("Devices = %v, want the cause", err)
	}
	if n := len(lib.DeviceGetCountCalls()); n != 0 {
		t.Errorf("DeviceGetCount calls = %d, want 0", n)
	}
}

func TestDevicesConcurrent(t *testing.T) {
	lib := nvmltest.Machine{GPUs: []nvmltest.GPU{{Total: gib, Compute: []nvml.ProcessInfo{{Pid: 5, UsedGpuMemory: 1}}}}}.Interface()
	l, err := nvmlglue.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.Devices(t.Context()); err != nil && !errors.Is(err, nvmlglue.ErrClosed) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
