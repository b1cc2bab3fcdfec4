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
		s := newSim(b, vramguardtest.Config{},
			vramguardtest.ModelConfig{Name: "big", SizeVRAM: 8 * gib},
			vramguardtest.ModelConfig{Name: "mid", SizeVRAM: 6 * gib},
			vramguardtest.ModelConfig{Name: "small", SizeVRAM: 2 * gib})
		c := newTestClient(b, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
		loadForever(b, s, "big", "mid", "small")
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
				loadForever(b, s, u.Model)
			}
			b.StartTimer()
		}
		b.ReportMetric(evicted/float64(b.N), "evicted_GiB/op")
	})
	b.Run("case=vain", func(b *testing.B) {
		s := newSim(b, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "chat", SizeVRAM: 2 * gib})
		c := newTestClient(b, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
		if err := s.Reserve("comfyui", 19*gib); err != nil {
			b.Fatal(err)
		}
		var evicted float64
		for b.Loop() {
			b.StopTimer()
			if !s.Listed("chat") {
				loadForever(b, s, "chat")
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
