package gpu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
)

// smiRecorded returns a Run that answers the two queries with recorded
// samples from internal/smi/testdata ("" answers with an error).
func smiRecorded(t testing.TB, gpus, apps string) func(ctx context.Context, path string, args ...string) ([]byte, error) {
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("..", "internal", "smi", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var gpuOut, appOut []byte
	if gpus != "" {
		gpuOut = read(gpus)
	}
	if apps != "" {
		appOut = read(apps)
	}
	return func(ctx context.Context, path string, args ...string) ([]byte, error) {
		if len(args) != 2 || args[1] != "--format=csv,noheader,nounits" {
			t.Errorf("args = %q", args)
		}
		out := appOut
		if strings.HasPrefix(args[0], "--query-gpu=") {
			out = gpuOut
		}
		if out == nil {
			return nil, errors.New("exit status 9")
		}
		return out, nil
	}
}

func TestSMIReaderSnapshot(t *testing.T) {
	proc := writeProc(t, map[uint32]string{2345: "/usr/local/bin/ollama runner --model /blobs/sha256-9 --port 41234"}, "")
	r, err := NewSMIReader(ReaderOptions{SMIRun: smiRecorded(t, "gpus_rtx4090.txt", "apps_ollama_comfyui.txt"), ProcRoot: proc})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := r.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s.Source != SourceSMI || len(s.Devices) != 1 {
		t.Fatalf("snapshot = %+v", s)
	}
	d := s.Devices[0]
	if d.Name != "NVIDIA GeForce RTX 4090" || d.Total != 24564<<20 || d.Free != 5879<<20 || d.Used != 18234<<20 || !d.ProcessesKnown {
		t.Errorf("device = %+v", d)
	}
	if len(d.Processes) != 2 {
		t.Fatalf("processes = %+v", d.Processes)
	}
	if p := d.Processes[0]; p.PID != 2345 || p.UsedBytes != 9870<<20 || p.Role != vramguard.RoleOllamaRunner || !strings.Contains(p.Command, "runner") {
		t.Errorf("runner resolved through /proc: %+v", p)
	}
	if p := d.Processes[1]; p.Command != "/home/ada/ComfyUI/venv/bin/python" || p.Role != vramguard.RoleOther {
		t.Errorf("process_name fallback: %+v", p)
	}
}

func TestSMIReaderVariants(t *testing.T) {
	tests := []struct {
		name       string
		gpus, apps string
		check      func(t *testing.T, s *vramguard.VRAMSnapshot)
	}{
		{"apps query fails", "gpus_two_cards.txt", "", func(t *testing.T, s *vramguard.VRAMSnapshot) {
			for _, d := range s.Devices {
				if d.ProcessesKnown || d.Processes != nil {
					t.Errorf("device %+v", d)
				}
			}
		}},
		{"no processes", "gpus_two_cards.txt", "apps_no_processes.txt", func(t *testing.T, s *vramguard.VRAMSnapshot) {
			for _, d := range s.Devices {
				if !d.ProcessesKnown || d.Processes == nil || len(d.Processes) != 0 {
					t.Errorf("device %+v", d)
				}
			}
		}},
		{"old runner binary on the first of two cards", "gpus_two_cards.txt", "apps_old_runner.txt", func(t *testing.T, s *vramguard.VRAMSnapshot) {
			if p := s.Devices[0].Processes; len(p) != 2 || p[0].Role != vramguard.RoleOllamaRunner || p[1].Role != vramguard.RoleOther {
				t.Errorf("processes %+v", p)
			}
			if p := s.Devices[1].Processes; len(p) != 0 {
				t.Errorf("second card %+v", p)
			}
		}},
		{"unknown memory figures", "gpus_placeholders.txt", "apps_empty.txt", func(t *testing.T, s *vramguard.VRAMSnapshot) {
			if d := s.Devices[0]; d.Total != 0 || d.Free != 0 {
				t.Errorf("device %+v", d)
			}
		}},
		{"bare ollama path is unknown", "gpus_rtx4090.txt", "apps_ollama_comfyui.txt", func(t *testing.T, s *vramguard.VRAMSnapshot) {
			if p := s.Devices[0].Processes[0]; p.Role != vramguard.RoleUnknown || p.Command != "/usr/local/bin/ollama" {
				t.Errorf("process %+v", p)
			}
		}},
		{"unknown per-process memory", "gpus_rtx4090.txt", "apps_container_na.txt", func(t *testing.T, s *vramguard.VRAMSnapshot) {
			p := s.Devices[0].Processes
			if len(p) != 2 || p[0].UsedKnown || p[1].Command != "" || p[1].Role != vramguard.RoleUnknown {
				t.Errorf("processes %+v", p)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewSMIReader(ReaderOptions{SMIRun: smiRecorded(t, tt.gpus, tt.apps), ProcRoot: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			s, err := r.Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, s)
		})
	}
}

func TestSMIReaderGarbageApps(t *testing.T) {
	run := func(ctx context.Context, path string, args ...string) ([]byte, error) {
		if strings.HasPrefix(args[0], "--query-gpu=") {
			return []byte("0, G, GPU-a, 8192, 0, 8192\n"), nil
		}
		return []byte("GPU-a, 0, 10, zero\nGPU-a, 7, 10, a\nGPU-a, 7, 20, dup\nGPU-a, 8, 9000, toobig\nGPU-a, 99999999, 1, bigpid\nnonsense\nGPU-b, 9, 1, elsewhere\n"), nil
	}
	r, err := NewSMIReader(ReaderOptions{SMIRun: run, ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Devices[0].Processes; len(p) != 1 || p[0].PID != 7 || p[0].UsedBytes != 10<<20 {
		t.Errorf("processes = %+v", p)
	}
}

func TestSMIReaderErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		gpus string
		kind vramguard.Kind
	}{
		{"driver failed", "", vramguard.KindUnavailable},
		{"unreadable output", "gpus_driver_failed.txt", vramguard.KindUnavailable},
		{"partly garbage", "gpus_garbage.txt", vramguard.KindUnavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewSMIReader(ReaderOptions{SMIRun: smiRecorded(t, tt.gpus, "apps_empty.txt")})
			if err != nil {
				t.Fatal(err)
			}
			if s, err := r.Snapshot(t.Context()); !errors.Is(err, tt.kind) || s != nil {
				t.Errorf("Snapshot = %v, %v; want %v", s, err, tt.kind)
			}
		})
	}
}

func TestSMIReaderTimeout(t *testing.T) {
	var calls atomic.Int32
	hang := func(ctx context.Context, path string, args ...string) ([]byte, error) {
		calls.Add(1)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	r, err := NewSMIReader(ReaderOptions{SMIRun: hang, SMITimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Snapshot(t.Context()); !errors.Is(err, vramguard.KindTimeout) {
		t.Errorf("hung nvidia-smi: %v, want KindTimeout", err)
	}

	cause := errors.New("user stopped")
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(10*time.Millisecond, func() { cancel(cause) })
	r, _ = NewSMIReader(ReaderOptions{SMIRun: hang})
	if _, err := r.Snapshot(ctx); !errors.Is(err, vramguard.KindCanceled) || !errors.Is(err, cause) {
		t.Errorf("canceled: %v", err)
	}
}

func TestSMIReaderRunsBinary(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs /bin/sh")
	}
	dir := t.TempDir()
	script := "#!/bin/sh\ncase \"$1\" in\n--query-gpu=*) echo '0, Fake, GPU-f, 1024, 24, 1000' ;;\n*) echo 'GPU-f, 77, 24, /usr/bin/ollama' ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	r, err := NewSMIReader(ReaderOptions{ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Devices[0]; d.Free != 1000<<20 || len(d.Processes) != 1 || d.Processes[0].PID != 77 {
		t.Errorf("device = %+v", d)
	}
}

func TestNewSMIReaderMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := NewSMIReader(ReaderOptions{}); !errors.Is(err, vramguard.KindUnavailable) {
		t.Errorf("no nvidia-smi on PATH: %v", err)
	}
	if _, err := NewSMIReader(ReaderOptions{SMIPath: filepath.Join(t.TempDir(), "nvidia-smi")}); !errors.Is(err, vramguard.KindUnavailable) {
		t.Errorf("missing Path: %v", err)
	}
	if _, err := NewSMIReader(ReaderOptions{SMITimeout: -1}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("negative timeout: %v", err)
	}
}

func TestSMIAutoReader(t *testing.T) {
	noNVML := func(ReaderOptions) (*DeviceReader, error) { return nil, errors.New("no nvml here") }
	r, err := newAutoReader(t.Context(), ReaderOptions{SMIRun: smiRecorded(t, "gpus_rtx4090.txt", "apps_empty.txt")}, noNVML)
	if err != nil {
		t.Fatal(err)
	}
	if r.Source() != SourceSMI {
		t.Fatalf("Source = %q, want %q", r.Source(), SourceSMI)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	_, err = newAutoReader(t.Context(), ReaderOptions{SMIRun: smiRecorded(t, "", "")}, noNVML)
	if !errors.Is(err, vramguard.KindUnavailable) || !strings.Contains(err.Error(), "nvidia-smi: ") || !strings.Contains(err.Error(), "no nvml here") {
		t.Errorf("neither works: %v", err)
	}
	cause := errors.New("gave up")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	if _, err := newAutoReader(ctx, ReaderOptions{SMIRun: smiRecorded(t, "gpus_rtx4090.txt", "")}, noNVML); !errors.Is(err, vramguard.KindCanceled) || !errors.Is(err, cause) {
		t.Errorf("canceled: %v", err)
	}

	// The public constructor, on this machine: NVML if it works, else
	// nothing (PATH is empty).
	t.Setenv("PATH", t.TempDir())
	r, err = NewAutoReader(t.Context(), ReaderOptions{})
	switch {
	case err == nil:
		defer r.Close()
		if r.Source() != SourceNVML {
			t.Errorf("Source = %q with no nvidia-smi on PATH", r.Source())
		}
	case !errors.Is(err, vramguard.KindUnavailable):
		t.Errorf("nothing installed: %v", err)
	}
}
