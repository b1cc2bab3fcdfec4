package vramguard_test

import (
	"context"
	"fmt"
	"log"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Estimate what a model needs on the device before loading it, for
// example to decide whether it fits next to what is already loaded.
func ExampleOllamaClient_EstimateModel() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", Size: 1 << 30}}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for _, numCtx := range []int{0, 8192} {
		e, err := c.EstimateModel(context.Background(), "tiny", numCtx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("num_ctx %d: weights %d MiB + KV cache %d MiB + compute %d MiB = %d MiB\n",
			e.NumCtx, e.Weights>>20, e.KVCache>>20, e.Compute>>20, e.Total>>20)
	}
	// Output:
	// num_ctx 4096: weights 1024 MiB + KV cache 128 MiB + compute 280 MiB = 1432 MiB
	// num_ctx 8192: weights 1024 MiB + KV cache 256 MiB + compute 544 MiB = 1824 MiB
}
