package pool_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A pool of two servers, each with its own 8 GiB device, and two models
// that do not both fit on one: each goes to a device of its own, and stays
// there. On a GPU box the members are `ollama serve` processes started
// with CUDA_VISIBLE_DEVICES, and VRAM is package gpu's reader.
func ExampleNew() {
	var members []pool.Member
	for _, name := range []string{"gpu0", "gpu1"} {
		s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 8 << 30, Models: []vramguardtest.ModelConfig{
			{Name: "qwen3:8b", SizeVRAM: 5 << 30},
			{Name: "llama3.2", SizeVRAM: 3 << 30},
		}})
		defer s.Close()
		members = append(members, pool.Member{Name: name, Host: s.URL().String(), VRAM: s.GPU()})
	}
	p, err := pool.New(pool.Options{Members: members}, vramguard.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close() // unloads, verified, on every member
	for _, model := range []string{"qwen3:8b", "llama3.2", "qwen3:8b"} {
		ctx, placed := pool.WithPlacements(context.Background())
		gen, err := p.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: model, Prompt: "a castle"},
			vramguard.KeepAliveFor(time.Minute), nil)
		if err != nil {
			log.Fatal(err) // a *pool.NoRoomError names each member's free bytes and holders
		}
		for _, pl := range placed() {
			fmt.Printf("%s on %s (%s), loaded %v\n", model, pl.Member, pl.Reason, gen.Loaded)
		}
	}
	// Output:
	// qwen3:8b on gpu0 (room), loaded true
	// llama3.2 on gpu1 (room), loaded true
	// qwen3:8b on gpu0 (warm), loaded false
}
