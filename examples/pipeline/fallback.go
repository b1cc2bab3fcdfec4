package main

// This file is the example's fallback when no Ollama answers: vramguard's
// test double (package vramguardtest), a fake Ollama server on a fake
// 24 GiB GPU. Like the rest of the example it uses only public packages,
// so you can copy it whole.

import (
	"strings"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Sizes of the simulated setup: a 24 GiB GPU on which the orchestrator
// already holds its UNet, and two models the size of qwen3:8b and llama3.2:3b.
const (
	simGPU   = 24 << 30
	simUNet  = 7 << 30
	simGen   = "qwen3:8b"
	simModel = "llama3.2:3b"
)

// simulated is a running simulator with the UNet already allocated.
type simulated struct{ srv *vramguardtest.Server }

// startSimulator starts the simulator; close it when done.
func startSimulator() (*simulated, error) {
	reply := func(p string) []vramguardtest.Chunk {
		text := "A lone lighthouse on a rugged cliff at dusk, warm beam cutting through sea mist, crashing waves below, " +
			"dramatic orange and violet sky, cinematic wide shot, volumetric light, 35mm film grain, highly detailed"
		if strings.Contains(strings.ToLower(p), "negative") || strings.Contains(strings.ToLower(p), "avoid") {
			text = "blurry, low resolution, oversaturated, watermark, text, deformed structures, extra limbs, jpeg artifacts"
		}
		var cs []vramguardtest.Chunk
		for _, w := range strings.SplitAfter(text, " ") {
			cs = append(cs, vramguardtest.Chunk{Text: w})
		}
		return cs
	}
	srv := vramguardtest.New(vramguardtest.Config{
		TotalVRAM: simGPU,
		Models: []vramguardtest.ModelConfig{
			{Name: simGen, SizeVRAM: 5_900_000_000, LoadLatency: 400 * time.Millisecond, TokenLatency: 4 * time.Millisecond, Respond: reply},
			{Name: simModel, SizeVRAM: 3_400_000_000, LoadLatency: 250 * time.Millisecond, TokenLatency: 3 * time.Millisecond, Respond: reply},
		},
	})
	if err := srv.Reserve("diffusion UNet", simUNet); err != nil {
		srv.Close()
		return nil, err
	}
	return &simulated{srv: srv}, nil
}

func (s *simulated) host() string { return s.srv.URL().String() }

// reader reads the simulated GPU's memory.
func (s *simulated) reader() vramguard.VRAMReader {
	return &vramguardtest.GPU{Server: s.srv, Name: "Simulated GPU"}
}

// allocate takes bytes of the simulated GPU for owner, failing as a CUDA
// allocation would when they are not free.
func (s *simulated) allocate(owner string, bytes uint64) error { return s.srv.Reserve(owner, bytes) }

// free gives owner's memory back.
func (s *simulated) free(owner string) { s.srv.Release(owner) }

func (s *simulated) close() { s.srv.Close() }
