package vramguard_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A pool of two servers, each with its own 8 GiB device, and two models
// that do not both fit on one: each goes to a device of its own, and stays
// there. On a GPU box the members are `ollama serve` processes started
// with CUDA_VISIBLE_DEVICES, and VRAM is package gpu's reader.
func ExampleNewPool() {
	var members []vramguard.PoolMember
	for _, name := range []string{"gpu0", "gpu1"} {
		s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 8 << 30, Models: []vramguardtest.ModelConfig{
			{Name: "qwen3:8b", SizeVRAM: 5 << 30, LoadLatency: 20 * time.Millisecond},
			{Name: "llama3.2", SizeVRAM: 3 << 30, LoadLatency: 20 * time.Millisecond},
		}})
		defer s.Close()
		members = append(members, vramguard.PoolMember{Name: name, Host: s.URL().String(), VRAM: s.GPU()})
	}
	c, err := vramguard.NewPool(vramguard.PoolOptions{Members: members}, vramguard.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, model := range []string{"qwen3:8b", "llama3.2", "qwen3:8b"} {
		gen, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: model, Prompt: "a castle"},
			vramguard.KeepAliveFor(time.Minute), nil)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s on %s (%s), loaded %v\n", model, gen.Placement.Member, gen.Placement.Reason, gen.Loaded)
	}
	// Output:
	// qwen3:8b on gpu0 (room), loaded true
	// llama3.2 on gpu1 (room), loaded true
	// qwen3:8b on gpu0 (warm), loaded false
}
