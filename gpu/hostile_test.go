package gpu_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/internal/testkit/hostile"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Hostile input for every public entry point: each call must return at
// once (or within its own timeouts), never panic, and fail only with an
// *Error of an expected kind. Cases whose kinds list vramguard.KindUnknown
// may also succeed.

type hostileCase struct {
	name  string
	call  func(ctx context.Context) error
	kinds []vramguard.Kind // accepted kinds; KindUnknown: success accepted
}

var (
	invalidOnly  = hostile.InvalidOnly
	canceledOnly = hostile.CanceledOnly
	successOnly  = hostile.SuccessOnly
	unavailable  = hostile.UnavailableOnly
)

// runHostile runs a case and checks the contract (internal/testkit/hostile).
func runHostile(t *testing.T, ctx context.Context, tc hostileCase) {
	t.Helper()
	hostile.Run(t, ctx, hostile.Case{Name: tc.name, Call: tc.call, Kinds: tc.kinds})
}

func hostileSim(t *testing.T) (*vramguardtest.Server, *vramguard.OllamaClient) {
	t.Helper()
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", Chunks: 4}}})
	t.Cleanup(s.Close)
	tr := &http.Transport{}
	c, err := vramguard.NewClient(vramguard.Options{
		Host:          s.URL().String(),
		HTTPClient:    &http.Client{Transport: tr},
		PollInterval:  5 * time.Millisecond,
		UnloadTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		tr.CloseIdleConnections()
	})
	return s, c
}

type funcReader func(context.Context) (*vramguard.VRAMSnapshot, error)

func (f funcReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) { return f(ctx) }

// TestHostileNameRunners covers NameRunners with bad snapshots and a done
// context.
func TestHostileNameRunners(t *testing.T) {
	_, c := hostileSim(t)
	tests := []hostileCase{
		{"name runners of nil", func(ctx context.Context) error { return gpu.NameRunners(ctx, c, nil) }, successOnly},
		{"name runners of garbage", func(ctx context.Context) error {
			snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{
				{PID: 1, Role: vramguard.RoleOllamaRunner, Blob: "\xff\x00"},
				{PID: 2, Role: vramguard.RoleOllamaRunner, Blob: strings.Repeat("b", 1<<16)},
				{PID: 3, Role: vramguard.RoleOllamaDiscovery, Blob: "sha256:00"},
			}}}}
			if err := gpu.NameRunners(ctx, c, snap); err != nil {
				return err
			}
			for _, p := range snap.Devices[0].Processes {
				if p.Model != "" {
					return errors.New("a garbage blob got a name")
				}
			}
			return nil
		}, successOnly},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runHostile(t, t.Context(), tc) })
	}
}

// TestHostileCanceledContext: NameRunners returns KindCanceled, fast, when
// the context is already done.
func TestHostileCanceledContext(t *testing.T) {
	s, c := hostileSim(t)
	cause := errors.New("caller gave up")
	canceled, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel2()
	tests := []hostileCase{
		{"name runners", func(ctx context.Context) error {
			snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{
				{PID: 1, Role: vramguard.RoleOllamaRunner, Blob: "sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"},
			}}}}
			return gpu.NameRunners(ctx, c, snap)
		}, canceledOnly},
	}
	for _, ctx := range []struct {
		name string
		ctx  context.Context
	}{{"canceled", canceled}, {"deadline passed", expired}} {
		for _, tc := range tests {
			t.Run(ctx.name+"/"+tc.name, func(t *testing.T) {
				runHostile(t, ctx.ctx, tc)
			})
		}
	}
	if n := s.Stats("tiny").Loads; n != 0 {
		t.Errorf("a canceled call loaded the model %d times", n)
	}
}

// TestHostileReaders covers the readers' constructors, KillProcess,
// ClassifyCommand and FindOrphans.
func TestHostileReaders(t *testing.T) {
	liar := funcReader(func(context.Context) (*vramguard.VRAMSnapshot, error) {
		return &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Index: 0, Total: 1, Free: math.MaxUint64, Used: math.MaxUint64,
			ProcessesKnown: true, Processes: []vramguard.GPUProcess{{PID: math.MaxUint32, UsedBytes: math.MaxUint64, UsedKnown: true, Command: "\xff"}}}}}, nil
	})
	tests := []hostileCase{
		{"SMI negative timeout", func(context.Context) error {
			_, err := gpu.NewSMIReader(gpu.ReaderOptions{SMITimeout: -1})
			return err
		}, invalidOnly},
		{"SMI missing binary", func(context.Context) error {
			_, err := gpu.NewSMIReader(gpu.ReaderOptions{SMIPath: "/nonexistent/\x00nvidia-smi"})
			return err
		}, unavailable},
		{"reader zero value", func(ctx context.Context) error { _, err := (&gpu.DeviceReader{}).Snapshot(ctx); return err }, unavailable},
		{"SMI garbage output", func(ctx context.Context) error {
			r, err := gpu.NewSMIReader(gpu.ReaderOptions{ProcRoot: "\x00", SMIRun: func(context.Context, string, ...string) ([]byte, error) {
				return []byte("\xff,,\n,,,,,,,,,,,,\n" + strings.Repeat("9", 1<<16)), nil
			}})
			if err != nil {
				return err
			}
			_, err = r.Snapshot(ctx)
			return err
		}, unavailable},
		{"NVML with a bad proc root", func(ctx context.Context) error {
			r, err := gpu.NewNVMLReader(gpu.ReaderOptions{ProcRoot: "\x00\xff"})
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = r.Snapshot(ctx)
			return err
		}, append([]vramguard.Kind{vramguard.KindUnknown}, unavailable...)},
		{"auto reader, nothing there", func(ctx context.Context) error {
			r, err := gpu.NewAutoReader(ctx, gpu.ReaderOptions{SMIPath: "/nonexistent"})
			if err == nil {
				r.Close()
			}
			return err
		}, append([]vramguard.Kind{vramguard.KindUnknown}, unavailable...)},
		{"kill pid 0", func(context.Context) error { return gpu.KillProcess(0) }, invalidOnly},
		{"kill pid 1", func(context.Context) error { return gpu.KillProcess(1) }, invalidOnly},
		{"kill max uint32", func(context.Context) error { return gpu.KillProcess(math.MaxUint32) }, invalidOnly},
		{"classify and orphans of garbage", func(context.Context) error {
			for _, args := range [][]string{nil, {}, {""}, {"\xff"}, {" "}, {"ollama"}, {"/x/ollama runner"}, {"C:\\ollama.exe", "-", "serve"}} {
				_ = gpu.ClassifyCommand(args)
			}
			_ = gpu.FindOrphans(nil, -1)
			snap, _ := liar(context.Background())
			snap.Devices = append(snap.Devices, snap.Devices[0])
			snap.Devices[0].Processes[0].Role = vramguard.RoleOllamaRunner
			snap.Devices[1].Processes = append([]vramguard.GPUProcess(nil), snap.Devices[0].Processes...)
			if o := gpu.FindOrphans(snap, math.MinInt); len(o) != 1 || o[0].UsedBytes != math.MaxUint64 {
				return errors.New("orphans of a lying snapshot not saturated")
			}
			return nil
		}, successOnly},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runHostile(t, t.Context(), tc) })
	}
}
