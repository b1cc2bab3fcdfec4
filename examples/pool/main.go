// Command pool generates through a pool of two Ollama servers, one per GPU
// (started with CUDA_VISIBLE_DEVICES=0 and 1 on ports 11434 and 11435), and
// prints where each call went and why. The README shows its middle part.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/pool"
)

func main() {
	model := flag.String("model", "llama3.2", "the model to generate with")
	flag.Parse()
	ctx := context.Background()
	req := &vramguard.GenerateRequest{Model: *model, Prompt: "a castle at dawn, in one line"}

	// README: from here
	reader, err := gpu.NewAutoReader(ctx, gpu.ReaderOptions{}) // one reader, both devices
	if err != nil {
		log.Fatal(err)
	}
	p, err := pool.New(pool.Options{Members: []pool.Member{
		{Name: "gpu0", Host: "127.0.0.1:11434", VRAM: reader, Device: 0},
		{Name: "gpu1", Host: "127.0.0.1:11435", VRAM: reader, Device: 1},
	}}, vramguard.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close() // unloads, verified, on every member
	ctx, placed := pool.WithPlacements(ctx)
	gen, err := p.GenerateStreaming(ctx, req, vramguard.KeepAliveFor(time.Minute), nil)
	if err != nil {
		log.Fatal(err) // a *pool.NoRoomError names each member's free bytes and holders
	}
	for _, pl := range placed() {
		fmt.Printf("%s on %s (%s), loaded %v\n", gen.Model, pl.Member, pl.Reason, gen.Loaded)
	}
	// README: to here
}
