//go:build linux && cgo

package gpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/nvmlglue/nvmltest"
)

const testGiB = 1 << 30

func TestNVMLReaderNoLibrary(t *testing.T) {
	lib := nvmltest.NoLibrary() // any call but Init panics
	r, err := NewNVMLReaderFrom(lib, ReaderOptions{})
	if r != nil {
		t.Fatal("got a reader")
	}
	if !errors.Is(err, vramguard.KindUnavailable) || !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Fatalf("err = %v, want KindUnavailable wrapping ERROR_LIBRARY_NOT_FOUND", err)
	}
	if n := len(lib.InitCalls()); n != 1 {
		t.Errorf("Init calls = %d, want 1", n)
	}
}

func TestNVMLReaderInitFailure(t *testing.T) {
	lib := nvmltest.Machine{InitRet: nvml.ERROR_NO_PERMISSION}.Interface()
	_, err := NewNVMLReaderFrom(lib, ReaderOptions{})
	if !errors.Is(err, vramguard.KindUnavailable) || !errors.Is(err, nvml.ERROR_NO_PERMISSION) {
		t.Fatalf("err = %v", err)
	}
	if n := len(lib.ShutdownCalls()) + len(lib.ExtensionsCalls()); n != 0 {
		t.Errorf("%d calls after a failed Init", n)
	}
	if _, err := NewNVMLReaderFrom(nil, ReaderOptions{}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("nil interface: %v", err)
	}
}

// TestNVMLReaderSystem runs against the machine's own NVML: a snapshot on
// a GPU machine, KindUnavailable (and no crash) without a driver.
func TestNVMLReaderSystem(t *testing.T) {
	r, err := NewNVMLReader(ReaderOptions{})
	if err != nil {
		if !errors.Is(err, vramguard.KindUnavailable) {
			t.Fatalf("err = %v, want KindUnavailable", err)
		}
		var ret nvml.Return
		if !errors.As(err, &ret) {
			t.Errorf("err = %v does not hold an nvml.Return", err)
		}
		t.Skipf("no NVML here: %v", err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	snap, err := r.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range snap.Devices {
		if d.Total == 0 || d.Free > d.Total {
			t.Errorf("implausible device: %+v", d)
		}
		t.Logf("device %d %s %s: %d/%d free, %d processes (known %v)", d.Index, d.Name, d.UUID, d.Free, d.Total, len(d.Processes), d.ProcessesKnown)
	}
}

func TestNVMLReaderSnapshot(t *testing.T) {
	proc := writeProc(t, map[uint32]string{
		100: "/usr/local/bin/ollama runner --model /blobs/sha256-1 --port 40001",
		101: "/usr/local/bin/ollama serve",
		102: "/opt/ComfyUI/venv/bin/python main.py",
	}, "")
	unknown := uint64(math.MaxUint64)
	tests := []struct {
		name    string
		machine nvmltest.Machine
		check   func(t *testing.T, s *vramguard.VRAMSnapshot)
	}{
		{
			name: "several GPUs with processes",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Name: "NVIDIA GeForce RTX 4090", UUID: "GPU-a", Total: 24 * testGiB, Free: 6 * testGiB, Used: 18 * testGiB,
					Compute: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 5 * testGiB}, {Pid: 102, UsedGpuMemory: 12 * testGiB}}},
				{Name: "NVIDIA GeForce RTX 3060", UUID: "GPU-b", Total: 12 * testGiB, Free: 12 * testGiB},
			}},
			check: func(t *testing.T, s *vramguard.VRAMSnapshot) {
				if s.Source != SourceNVML || len(s.Devices) != 2 || s.Taken.IsZero() {
					t.Fatalf("snapshot %+v", s)
				}
				d := s.Device(0)
				if d.Name != "NVIDIA GeForce RTX 4090" || d.UUID != "GPU-a" || d.Free != 6*testGiB || !d.ProcessesKnown {
					t.Errorf("device 0 = %+v", d)
				}
				want := []vramguard.GPUProcess{
					{PID: 100, UsedBytes: 5 * testGiB, UsedKnown: true, Command: "/usr/local/bin/ollama runner --model /blobs/sha256-1 --port 40001", Role: vramguard.RoleOllamaRunner},
					{PID: 102, UsedBytes: 12 * testGiB, UsedKnown: true, Command: "/opt/ComfyUI/venv/bin/python main.py", Role: vramguard.RoleOther},
				}
				if fmt.Sprint(d.Processes) != fmt.Sprint(want) {
					t.Errorf("processes =\n%+v\nwant\n%+v", d.Processes, want)
				}
				if p := s.Device(1).Processes; p == nil || len(p) != 0 {
					t.Errorf("device 1 processes = %#v, want empty and non-nil", p)
				}
			},
		},
		{
			name: "unknown per-process memory and invisible process",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: 8 * testGiB, Compute: []nvml.ProcessInfo{{Pid: 101, UsedGpuMemory: unknown}, {Pid: 4242, UsedGpuMemory: testGiB}}},
			}},
			check: func(t *testing.T, s *vramguard.VRAMSnapshot) {
				p := s.Devices[0].Processes
				if len(p) != 2 || p[0].UsedKnown || p[0].UsedBytes != 0 || p[0].Role != vramguard.RoleOllamaServer {
					t.Errorf("unknown memory: %+v", p)
				}
				if p[1].Command != "" || p[1].Role != vramguard.RoleUnknown {
					t.Errorf("invisible process: %+v", p[1])
				}
			},
		},
		{
			name: "v2 reserved counts as used",
			machine: nvmltest.Machine{HasMemoryInfoV2: true, GPUs: []nvmltest.GPU{
				{Total: 24 * testGiB, Free: 20 * testGiB, Used: 3 * testGiB, Reserved: testGiB},
			}},
			check: func(t *testing.T, s *vramguard.VRAMSnapshot) {
				if d := s.Devices[0]; d.Used != 4*testGiB || d.Free != 20*testGiB {
					t.Errorf("device = %+v", d)
				}
			},
		},
		{
			name: "v2 symbol missing",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{ // GetMemoryInfo_v2 would panic
				{Total: 24 * testGiB, Free: 20 * testGiB, Used: 3 * testGiB, Reserved: testGiB},
			}},
			check: func(t *testing.T, s *vramguard.VRAMSnapshot) {
				if d := s.Devices[0]; d.Used != 4*testGiB || d.Free != 20*testGiB {
					t.Errorf("device = %+v", d)
				}
			},
		},
		{
			name: "garbage entries",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{
				{Total: 8 * testGiB, Compute: []nvml.ProcessInfo{
					{Pid: 100, UsedGpuMemory: testGiB}, {Pid: 0, UsedGpuMemory: 77}, {Pid: 3735928559, UsedGpuMemory: 3},
					{Pid: 102, UsedGpuMemory: 1 << 60}, {Pid: 100, UsedGpuMemory: 5},
				}},
			}},
			check: func(t *testing.T, s *vramguard.VRAMSnapshot) {
				if p := s.Devices[0].Processes; len(p) != 1 || p[0].PID != 100 || p[0].UsedBytes != testGiB {
					t.Errorf("processes = %+v", p)
				}
			},
		},
		{
			name:    "processes not supported",
			machine: nvmltest.Machine{GPUs: []nvmltest.GPU{{Total: testGiB, ComputeRet: nvml.ERROR_NOT_SUPPORTED}}},
			check: func(t *testing.T, s *vramguard.VRAMSnapshot) {
				if d := s.Devices[0]; d.ProcessesKnown || d.Processes != nil {
					t.Errorf("device = %+v", d)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib := tt.machine.Interface()
			r, err := NewNVMLReaderFrom(lib, ReaderOptions{ProcRoot: proc})
			if err != nil {
				t.Fatal(err)
			}
			s, err := r.Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, s)
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if n := len(lib.ShutdownCalls()); n != 1 {
				t.Errorf("Shutdown calls = %d, want 1", n)
			}
		})
	}
}

func TestNVMLReaderErrors(t *testing.T) {
	lib := nvmltest.Machine{GPUs: []nvmltest.GPU{{MemoryRet: nvml.ERROR_GPU_IS_LOST}}}.Interface()
	r, err := NewNVMLReaderFrom(lib, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Snapshot(t.Context()); !errors.Is(err, vramguard.KindUnavailable) || !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Errorf("lost GPU: %v", err)
	}
	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	if _, err := r.Snapshot(ctx); !errors.Is(err, vramguard.KindCanceled) || !errors.Is(err, cause) {
		t.Errorf("canceled: %v", err)
	}
}

func TestNVMLReaderClose(t *testing.T) {
	lib := nvmltest.Machine{GPUs: []nvmltest.GPU{{Total: testGiB}}, ShutdownRet: nvml.ERROR_UNKNOWN}.Interface()
	r, err := NewNVMLReaderFrom(lib, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("Close = %v, want ERROR_UNKNOWN", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := r.Snapshot(t.Context()); !errors.Is(err, vramguard.KindUnavailable) || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Snapshot after Close = %v", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown calls = %d, want 1", n)
	}
}

// TestAutoReaderNVMLClose: NewAutoReader prefers NVML, never runs
// nvidia-smi then, and the reader it returns shuts NVML down on Close.
func TestAutoReaderNVMLClose(t *testing.T) {
	lib := nvmltest.Machine{GPUs: []nvmltest.GPU{{Total: testGiB, Free: testGiB}}}.Interface()
	var smiRuns atomic.Int32
	opts := ReaderOptions{ProcRoot: t.TempDir(), SMIRun: func(context.Context, string, ...string) ([]byte, error) {
		smiRuns.Add(1)
		return nil, errors.New("not expected")
	}}
	r, err := newAutoReader(t.Context(), opts, func(o ReaderOptions) (*DeviceReader, error) { return NewNVMLReaderFrom(lib, o) })
	if err != nil {
		t.Fatal(err)
	}
	if r.Source() != SourceNVML || smiRuns.Load() != 0 {
		t.Fatalf("Source = %q after %d nvidia-smi runs; want nvml and none", r.Source(), smiRuns.Load())
	}
	if s, err := r.Snapshot(t.Context()); err != nil || s.Source != SourceNVML || len(s.Devices) != 1 {
		t.Fatalf("Snapshot = %+v, %v", s, err)
	}
	if n := len(lib.ShutdownCalls()); n != 0 {
		t.Fatalf("Shutdown calls before Close = %d", n)
	}
	for range 2 {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown calls = %d, want 1", n)
	}
	if _, err := r.Snapshot(t.Context()); !errors.Is(err, vramguard.KindUnavailable) {
		t.Errorf("Snapshot after Close = %v", err)
	}
	if n := len(lib.DeviceGetCountCalls()); n != 1 {
		t.Errorf("NVML read %d times, want once (none after Close)", n)
	}
}

func TestNVMLReaderConcurrent(t *testing.T) {
	r, err := NewNVMLReaderFrom(bench8GPU().Interface(), ReaderOptions{ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if s, err := r.Snapshot(t.Context()); err != nil || len(s.Devices) != 8 {
					t.Errorf("Snapshot = %v, %v", s, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// bench8GPU is an 8-GPU machine with three processes on each device.
func bench8GPU() nvmltest.Machine {
	var m nvmltest.Machine
	m.HasMemoryInfoV2 = true
	for i := range 8 {
		m.GPUs = append(m.GPUs, nvmltest.GPU{
			Name: "NVIDIA H100 80GB HBM3", UUID: fmt.Sprintf("GPU-%08d", i),
			Total: 80 * testGiB, Free: 40 * testGiB, Used: 39 * testGiB, Reserved: testGiB,
			Compute: []nvml.ProcessInfo{
				{Pid: uint32(1000 + i), UsedGpuMemory: 20 * testGiB},
				{Pid: uint32(2000 + i), UsedGpuMemory: 18 * testGiB},
				{Pid: 3000, UsedGpuMemory: math.MaxUint64},
			},
		})
	}
	return m
}

func BenchmarkNVMLSnapshot8GPU(b *testing.B) {
	cmds := map[uint32]string{3000: "/usr/local/bin/ollama serve"}
	for i := range 8 {
		cmds[uint32(1000+i)] = "/usr/local/bin/ollama runner --model /blobs/sha256-x --port 40000"
		cmds[uint32(2000+i)] = "/opt/ComfyUI/venv/bin/python main.py --listen"
	}
	r, err := NewNVMLReaderFrom(bench8GPU().Interface(), ReaderOptions{ProcRoot: writeProc(b, cmds, "")})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Snapshot(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
