package vramguard_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// offloadSim starts a simulator with a 10 GiB GPU that splits a model
// that does not fit between GPU and CPU, and one 6 GiB model, "a"; another
// program holds reserve bytes of the GPU.
func offloadSim(t *testing.T, reserve uint64, mods ...func(*vramguardtest.ModelConfig)) *vramguardtest.Server {
	t.Helper()
	// A load takes longer than Options.LoadThreshold.
	m := vramguardtest.ModelConfig{Name: "a", Size: 6 * gib, SizeVRAM: 6 * gib, Chunks: 3, LoadLatency: 20 * time.Millisecond}
	for _, f := range mods {
		f(&m)
	}
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 10 * gib, StrictVRAM: true, Offload: true, Models: []vramguardtest.ModelConfig{m}})
	t.Cleanup(s.Close)
	if reserve > 0 {
		if err := s.Reserve("comfyui", reserve); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// offloadEvent is an offload a call's end reported to Hooks.OnCallEnd: in
// its Generation, or in the error of a generation FailOnOffload refused.
type offloadEvent struct {
	Model          string
	Size, SizeVRAM int64
}

// offloadClient returns a client for s whose calls' offloads, as
// OnCallEnd is told them, are collected, and whose log is written to the
// returned buffer.
func offloadClient(t *testing.T, s *vramguardtest.Server, opts vramguard.Options) (*vramguard.OllamaClient, func() []offloadEvent, *syncBuffer) {
	t.Helper()
	var mu sync.Mutex
	var events []offloadEvent
	opts.Host = s.URL().String()
	opts.PollInterval = 5 * time.Millisecond
	opts.Hooks.OnCallEnd = func(_ context.Context, e vramguard.CallEnd) {
		off := &vramguard.Offload{}
		if e.Generation != nil {
			off = e.Generation.Offload
		} else if !errors.As(e.Err, &off) {
			off = nil
		}
		if off == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		events = append(events, offloadEvent{Model: e.Model, Size: off.Size, SizeVRAM: off.SizeVRAM})
	}
	logs := &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, func() []offloadEvent {
		mu.Lock()
		defer mu.Unlock()
		return append([]offloadEvent(nil), events...)
	}, logs
}

// syncBuffer is a bytes.Buffer safe for concurrent use, for a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// noGPU is a reader on a machine without a GPU: no device.
type noGPU struct{}

func (noGPU) Snapshot(context.Context) (*vramguard.VRAMSnapshot, error) {
	return &vramguard.VRAMSnapshot{Source: vramguard.SourceNone, Taken: time.Now()}, nil
}

// brokenReader is a reader whose snapshots fail.
type brokenReader struct{}

func (brokenReader) Snapshot(context.Context) (*vramguard.VRAMSnapshot, error) {
	return nil, errors.New("driver not loaded")
}

func TestOffloadReported(t *testing.T) {
	tests := []struct {
		name      string
		reserve   uint64
		keepAlive vramguard.KeepAlive
		want      *vramguard.Offload
	}{
		{name: "all on the GPU", reserve: 2 * gib, keepAlive: vramguard.KeepAliveFor(time.Hour)},
		{name: "split, checked after the generation", reserve: 7 * gib, keepAlive: vramguard.KeepAliveFor(time.Hour),
			want: &vramguard.Offload{Size: 6 * gib, SizeVRAM: 3 * gib}},
		{name: "split, unloaded at the end: checked at the first chunk", reserve: 7 * gib, keepAlive: vramguard.KeepAliveUnload,
			want: &vramguard.Offload{Size: 6 * gib, SizeVRAM: 3 * gib}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := offloadSim(t, tt.reserve)
			c, events, logs := offloadClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}})
			req := &vramguard.GenerateRequest{Model: "a", Prompt: "x"}
			gen, err := c.GenerateStreaming(t.Context(), req, tt.keepAlive, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !gen.Loaded {
				t.Fatal("first generation did not load the model")
			}
			if (gen.Offload == nil) != (tt.want == nil) || (tt.want != nil && *gen.Offload != *tt.want) {
				t.Fatalf("Offload = %+v, want %+v", gen.Offload, tt.want)
			}
			if tt.want == nil {
				if len(events()) != 0 || strings.Contains(logs.String(), "partly on the CPU") {
					t.Errorf("a model all on the GPU was flagged: hooks %+v", events())
				}
				return
			}
			if got := gen.Offload.Size - gen.Offload.SizeVRAM; got != 3*gib {
				t.Errorf("Size-SizeVRAM = %d", got)
			}
			if !strings.Contains(logs.String(), `level=WARN msg="model partly on the CPU" model=a size=6442450944 size_vram=3221225472`) {
				t.Errorf("no warning in the log:\n%s", logs)
			}
			// A reuse (or a reload, for KeepAliveUnload) reports again only
			// when it loaded the model.
			gen2, err := c.GenerateStreaming(t.Context(), req, tt.keepAlive, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantEvents := 1
			if gen2.Loaded {
				wantEvents = 2
			} else if gen2.Offload != nil {
				t.Errorf("a reuse reports Offload %+v", gen2.Offload)
			}
			ev := events()
			if len(ev) != wantEvents || ev[0].Model != "a" || ev[0].Size != 6*gib || ev[0].SizeVRAM != 3*gib {
				t.Errorf("offloads OnCallEnd saw %+v, want %d for a", ev, wantEvents)
			}
		})
	}
}

func TestFailOnOffload(t *testing.T) {
	t.Run("split: fails before any text and unloads", func(t *testing.T) {
		// A reply of 100 chunks, 5 ms apart: the request is canceled long
		// before it ends.
		s := offloadSim(t, 7*gib, func(m *vramguardtest.ModelConfig) { m.Chunks, m.TokenLatency = 100, 5*time.Millisecond })
		c, events, _ := offloadClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}, FailOnOffload: true})
		chunks := 0
		gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"},
			vramguard.KeepAliveFor(time.Hour), func(vramguard.Chunk) error { chunks++; return nil })
		if !errors.Is(err, vramguard.ErrOffloaded) || !errors.Is(err, vramguard.KindOutOfMemory) || gen != nil {
			t.Fatalf("got %+v, %v; want ErrOffloaded, KindOutOfMemory", gen, err)
		}
		if !strings.Contains(err.Error(), "3221225472 of 6442450944 bytes on the GPU, 3221225472 on the CPU") {
			t.Errorf("error does not name the sizes: %v", err)
		}
		if chunks != 0 {
			t.Errorf("fn saw %d chunks", chunks)
		}
		if s.Listed("a") {
			t.Error("offloaded model still listed")
		}
		if ev := events(); len(ev) != 1 || ev[0].SizeVRAM != 3*gib {
			t.Errorf("offloads OnCallEnd saw %+v; want the refused one, from the error", ev)
		}
		if st := s.Stats("a"); st.Completed != 0 || st.Cancelled != 1 {
			t.Errorf("the server finished the request: %+v", st)
		}
	})
	t.Run("all on the GPU: generates", func(t *testing.T) {
		s := offloadSim(t, 2*gib)
		c, events, _ := offloadClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}, FailOnOffload: true})
		gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
		if err != nil || gen.Offload != nil || len(events()) != 0 {
			t.Fatalf("got %+v, %v, events %+v", gen, err, events())
		}
	})
	t.Run("failed unload is joined", func(t *testing.T) {
		// Another program's long request holds the offloaded model: the
		// unload cannot be verified within UnloadTimeout.
		s := offloadSim(t, 7*gib, func(m *vramguardtest.ModelConfig) { m.Chunks, m.TokenLatency = 1000, 5*time.Millisecond })
		c, _, _ := offloadClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}, FailOnOffload: true,
			UnloadTimeout: 300 * time.Millisecond})
		octx, cancel := context.WithCancel(t.Context())
		other := make(chan error, 1)
		go func() {
			other <- s.APIClient().Generate(octx, &api.GenerateRequest{Model: "a", Prompt: "x"}, func(api.GenerateResponse) error { return nil })
		}()
		if err := s.WaitInFlight(t.Context(), "a", 1); err != nil {
			t.Fatal(err)
		}
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
		cancel()
		<-other
		if !errors.Is(err, vramguard.ErrOffloaded) || !errors.Is(err, vramguard.ErrStillResident) {
			t.Fatalf("err = %v; want ErrOffloaded joined with ErrStillResident", err)
		}
		if vramguard.KindOf(err) != vramguard.KindOutOfMemory || errors.Is(err, vramguard.KindTimeout) {
			t.Errorf("err reads as the unload's kind: %v", err)
		}
	})
}

// A server without a GPU lists size_vram 0: that is no offload.
func TestOffloadNeverFlaggedWithoutGPU(t *testing.T) {
	tests := []struct {
		name   string
		reader vramguard.VRAMReader
	}{
		{name: "no reader"},
		{name: "reader with no device", reader: noGPU{}},
		{name: "failing reader", reader: brokenReader{}},
	}
	for _, tt := range tests {
		for _, ka := range []vramguard.KeepAlive{vramguard.KeepAliveFor(time.Hour), vramguard.KeepAliveUnload} {
			t.Run(tt.name+"/"+ka.String(), func(t *testing.T) {
				s := offloadSim(t, 10*gib) // the whole model on the CPU
				c, events, logs := offloadClient(t, s, vramguard.Options{VRAM: tt.reader, FailOnOffload: true})
				gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, ka, nil)
				if err != nil {
					t.Fatal(err)
				}
				if r := s.Running(); len(r) == 1 && r[0].SizeVRAM != 0 {
					t.Fatalf("the simulator put %d bytes on the GPU", r[0].SizeVRAM)
				}
				if gen.Offload != nil || len(events()) != 0 || strings.Contains(logs.String(), "partly on the CPU") {
					t.Errorf("flagged: %+v, events %+v", gen.Offload, events())
				}
				// With a reader, the check saw size_vram < size and asked the GPU.
				if tt.reader != nil && !strings.Contains(logs.String(), "not flagged") {
					t.Errorf("no debug line for the check:\n%s", logs)
				}
			})
		}
	}
}

// A chat refused by FailOnOffload fails like a generation, and says it
// was a chat.
func TestChatFailOnOffload(t *testing.T) {
	s := offloadSim(t, 7*gib, func(m *vramguardtest.ModelConfig) { m.Chunks, m.TokenLatency = 100, 5*time.Millisecond })
	c, _, _ := offloadClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}, FailOnOffload: true})
	_, err := c.ChatStreaming(t.Context(), &vramguard.ChatRequest{Model: "a", Messages: []api.Message{{Role: "user", Content: "x"}}},
		vramguard.KeepAliveFor(time.Hour), nil)
	var e *vramguard.Error
	if !errors.As(err, &e) || !errors.Is(err, vramguard.ErrOffloaded) {
		t.Fatalf("got %v, want ErrOffloaded", err)
	}
	if e.Op != "chat" {
		t.Errorf("Op = %q, want \"chat\" (err: %v)", e.Op, err)
	}
}
