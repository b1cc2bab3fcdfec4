package vramguardtest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

const gib = 1 << 30

func TestVRAMLedger(t *testing.T) {
	s, c := start(t, vramguardtest.Config{
		TotalVRAM: 10 * gib,
		Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
			m.SizeVRAM = 4 * gib
			m.LoadLatency = 80 * time.Millisecond
		})},
	})
	if total, used, free := s.Memory(); total != 10*gib || used != 0 || free != 10*gib {
		t.Fatalf("Memory = %d, %d, %d", total, used, free)
	}

	// Memory is held from the start of the load, before /api/ps lists it.
	done := make(chan result, 1)
	go func() {
		done <- generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p", KeepAlive: keepAlive(time.Hour)})
	}()
	waitFor(t, s, time.Second, "loading", func() bool { r, ok := runner(s, "tiny:latest"); return ok && r.Loading })
	if _, used, _ := s.Memory(); used != 4*gib {
		t.Errorf("used while loading = %d, want 4 GiB", used)
	}
	<-done

	hs := s.Holders()
	if len(hs) != 1 || hs[0].Name != "tiny:latest" || !hs[0].Runner || hs[0].Bytes != 4*gib || hs[0].PID == 0 {
		t.Fatalf("Holders = %+v", hs)
	}

	// Another process wants 7 GiB: only 6 are free.
	err := s.Reserve("text-encoder", 7*gib)
	var ve *vramguardtest.VRAMError
	if !errors.As(err, &ve) || err.Error() != "VRAM grow failed: 7516192768 bytes" || ve.Free != 6*gib {
		t.Fatalf("Reserve = %v", err)
	}
	unload(t, c, "tiny")
	waitFor(t, s, time.Second, "unload", func() bool { _, used, _ := s.Memory(); return used == 0 })
	if err := s.Reserve("text-encoder", 7*gib); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve("text-encoder", 1*gib); err != nil {
		t.Fatal(err)
	}
	if hs := s.Holders(); len(hs) != 1 || hs[0].Runner || hs[0].Bytes != 8*gib || hs[0].PID == 0 {
		t.Errorf("Holders = %+v", hs)
	}
	s.Release("text-encoder")
	if _, used, _ := s.Memory(); used != 0 {
		t.Errorf("used after Release = %d", used)
	}
}

func TestStrictVRAM(t *testing.T) {
	big := func(name string) vramguardtest.ModelConfig {
		return vramguardtest.ModelConfig{Name: name, SizeVRAM: 6 * gib, Chunks: 1}
	}
	t.Run("external allocation blocks the load", func(t *testing.T) {
		s, c := start(t, vramguardtest.Config{TotalVRAM: 10 * gib, StrictVRAM: true, Models: []vramguardtest.ModelConfig{big("a")}})
		if err := s.Reserve("orchestrator", 8*gib); err != nil {
			t.Fatal(err)
		}
		res := generate(t.Context(), c, &api.GenerateRequest{Model: "a", Prompt: "p"})
		se := statusError(t, res.err)
		if se.StatusCode != 500 || se.ErrorMessage != "model requires more system memory (6.0 GiB) than is available (2.0 GiB)" {
			t.Errorf("got %+v", se)
		}
		if st := s.Stats("a"); st.LoadFailures != 1 || st.Loads != 0 {
			t.Errorf("Stats = %+v", st)
		}
	})
	t.Run("idle model is evicted", func(t *testing.T) {
		s, c := start(t, vramguardtest.Config{TotalVRAM: 10 * gib, StrictVRAM: true, Models: []vramguardtest.ModelConfig{big("a"), big("b")}})
		mustGenerate(t, c, &api.GenerateRequest{Model: "a", Prompt: "p"})
		mustGenerate(t, c, &api.GenerateRequest{Model: "b", Prompt: "p"})
		if s.Listed("a") || !s.Listed("b") || s.Stats("a").Evictions != 1 {
			t.Errorf("after loading b: a listed %v, b listed %v, stats %+v", s.Listed("a"), s.Listed("b"), s.Stats("a"))
		}
		if _, used, _ := s.Memory(); used != 6*gib {
			t.Errorf("used = %d, want 6 GiB", used)
		}
	})
}

func TestOffload(t *testing.T) {
	big := vramguardtest.ModelConfig{Name: "a", Size: 6 * gib, SizeVRAM: 6 * gib, Chunks: 1}
	ps := func(t *testing.T, c *api.Client) api.ProcessModelResponse {
		t.Helper()
		l, err := c.ListRunning(t.Context())
		if err != nil || len(l.Models) != 1 {
			t.Fatalf("ListRunning = %+v, %v", l, err)
		}
		return l.Models[0]
	}
	tests := []struct {
		name     string
		reserve  uint64 // held by another program
		sizeVRAM uint64 // want, in /api/ps and on the GPU
	}{
		{name: "fits", reserve: 2 * gib, sizeVRAM: 6 * gib},
		{name: "split between GPU and CPU", reserve: 7 * gib, sizeVRAM: 3 * gib},
		{name: "all on the CPU", reserve: 10 * gib, sizeVRAM: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := start(t, vramguardtest.Config{TotalVRAM: 10 * gib, StrictVRAM: true, Offload: true, Models: []vramguardtest.ModelConfig{big}})
			if err := s.Reserve("orchestrator", tt.reserve); err != nil {
				t.Fatal(err)
			}
			mustGenerate(t, c, &api.GenerateRequest{Model: "a", Prompt: "p", KeepAlive: keepAlive(time.Hour)})
			if m := ps(t, c); m.Size != 6*gib || m.SizeVRAM != int64(tt.sizeVRAM) {
				t.Errorf("/api/ps size %d, size_vram %d; want %d, %d", m.Size, m.SizeVRAM, 6*gib, tt.sizeVRAM)
			}
			var runners uint64
			n := 0
			for _, h := range s.Holders() {
				if h.Runner {
					runners += h.Bytes
					n++
				}
			}
			if runners != tt.sizeVRAM || (tt.sizeVRAM == 0) != (n == 0) {
				t.Errorf("runners hold %d bytes in %d entries, want %d", runners, n, tt.sizeVRAM)
			}
			if r, _ := runner(s, "a:latest"); r.SizeVRAM != tt.sizeVRAM {
				t.Errorf("Running().SizeVRAM = %d", r.SizeVRAM)
			}
			unload(t, c, "a")
			waitFor(t, s, time.Second, "unload", func() bool { _, used, _ := s.Memory(); return used == tt.reserve })
		})
	}
}

func TestReleaseLag(t *testing.T) {
	s, c := start(t, vramguardtest.Config{ReleaseLag: 150 * time.Millisecond, Models: []vramguardtest.ModelConfig{tiny()}})
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p", KeepAlive: keepAlive(0)})
	waitFor(t, s, time.Second, "unload", func() bool { return !s.Listed("tiny") })
	if _, used, _ := s.Memory(); used != 2*gib {
		t.Errorf("used right after leaving /api/ps = %d, want the lagging 2 GiB", used)
	}
	waitFor(t, s, time.Second, "memory back", func() bool { _, used, _ := s.Memory(); return used == 0 })
}

func TestCrashFreesMemoryButStaysListed(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})
	s.FailNext("tiny", vramguardtest.CrashAfter(1))
	res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
	if res.err == nil || !strings.Contains(res.err.Error(), "unexpected EOF") {
		t.Fatalf("err = %v", res.err)
	}
	if !s.Listed("tiny") {
		t.Error("dead runner not listed")
	}
	if _, used, _ := s.Memory(); used != 0 {
		t.Errorf("dead runner holds %d bytes", used)
	}
}
