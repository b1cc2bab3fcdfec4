package vramguard_test

import (
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// BenchmarkEnsureFree: room-making on the simulator, before/after issue
// #34 (BENCHMARKS.md §14). evict: 2 GiB free of 24, big (8), mid (6) and
// small (2 GiB) resident, 6 GiB needed: one model goes (the reload of it
// after each operation is not timed). vain: 3 GiB free, a 2 GiB model
// resident, 10 GiB needed, a 100 ms Timeout: nothing can make the room.
// evicted_GiB/op is what was unloaded.
func BenchmarkEnsureFree(b *testing.B) {
	b.Run("case=evict", func(b *testing.B) {
		s := newSimB(b, vramguardtest.Config{},
			vramguardtest.ModelConfig{Name: "big", SizeVRAM: 8 * gib},
			vramguardtest.ModelConfig{Name: "mid", SizeVRAM: 6 * gib},
			vramguardtest.ModelConfig{Name: "small", SizeVRAM: 2 * gib})
		c := newBenchClient(b, s)
		load(b, s, "big", "mid", "small")
		if err := s.Reserve("comfyui", 6*gib); err != nil {
			b.Fatal(err)
		}
		var evicted float64
		for b.Loop() {
			rep, err := c.EnsureFree(b.Context(), vramguard.EnsureRequest{Bytes: 6 * gib, Timeout: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			for _, u := range rep.Evicted {
				evicted += float64(u.SizeVRAM) / gib
				load(b, s, u.Model)
			}
			b.StartTimer()
		}
		b.ReportMetric(evicted/float64(b.N), "evicted_GiB/op")
	})
	b.Run("case=vain", func(b *testing.B) {
		s := newSimB(b, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "chat", SizeVRAM: 2 * gib})
		c := newBenchClient(b, s)
		if err := s.Reserve("comfyui", 19*gib); err != nil {
			b.Fatal(err)
		}
		var evicted float64
		for b.Loop() {
			b.StopTimer()
			if !s.Listed("chat") {
				load(b, s, "chat")
			}
			b.StartTimer()
			rep, err := c.EnsureFree(b.Context(), vramguard.EnsureRequest{Bytes: 10 * gib, Timeout: 100 * time.Millisecond})
			if err == nil {
				b.Fatal("the room was made")
			}
			for _, u := range rep.Evicted {
				evicted += float64(u.SizeVRAM) / gib
			}
		}
		b.ReportMetric(evicted/float64(b.N), "evicted_GiB/op")
	})
}

func newSimB(b *testing.B, cfg vramguardtest.Config, models ...vramguardtest.ModelConfig) *vramguardtest.Server {
	cfg.Models = models
	s := vramguardtest.New(cfg)
	b.Cleanup(s.Close)
	return s
}

func newBenchClient(b *testing.B, s *vramguardtest.Server) *vramguard.OllamaClient {
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU(), PollInterval: 5 * time.Millisecond, VRAMPollInterval: 10 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// load loads models as another program would, kept forever.
func load(b *testing.B, s *vramguardtest.Server, models ...string) {
	other, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), KeepModelsOnClose: true})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	for _, m := range models {
		if _, err := other.GenerateStreaming(b.Context(), &vramguard.GenerateRequest{Model: m, Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
			b.Fatal(err)
		}
	}
}
