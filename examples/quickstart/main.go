// Command quickstart is the README's ten-line program: one guarded
// generation that leaves nothing in VRAM, on a machine with or without a GPU.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
)

func main() {
	ctx := context.Background()
	opts := vramguard.Options{Budget: &vramguard.Budget{Headroom: 4 << 30, OffWithoutGPU: true}}
	if r, err := gpu.NewAutoReader(ctx, gpu.ReaderOptions{}); err == nil {
		defer r.Close()
		opts.VRAM = r // a GPU: loads keep 4 GiB free, unloads are checked on the device
	}
	c, err := vramguard.NewClient(opts) // OLLAMA_HOST, else 127.0.0.1:11434
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	g := vramguard.Guard{Client: c}
	gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "An image prompt: a lighthouse at dusk"}, nil)
	if err != nil {
		log.Fatal(err) // typed: errors.Is(err, vramguard.KindNotFound) means "ollama pull llama3.2"
	}
	fmt.Println(gen.Text) // llama3.2 is unloaded, verified, before Generate returns
}
