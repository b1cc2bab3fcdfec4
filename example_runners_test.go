package vramguard_test

import (
	"context"
	"fmt"
	"log"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// The weights blobs of the examples' models, as `ollama show --modelfile`
// names them in its FROM line.
const (
	exampleBlobA = "sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	exampleBlobB = "sha256:e8ad13eff07a78d89926e9e8b882317d082ef5bf9768ad7b50fcdbbcd63748de"
)

// startNamingSim starts the simulator with tiny-a loaded and tiny-b
// installed.
func startNamingSim() (*vramguardtest.Server, *vramguard.OllamaClient) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "tiny-a", Blob: exampleBlobA, Size: 5 << 30},
		{Name: "tiny-b", Blob: exampleBlobB, Size: 3 << 30},
	}})
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), KeepModelsOnClose: true})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "tiny-a", Prompt: "hi"},
		vramguard.KeepAliveForever, nil)
	if err != nil {
		log.Fatal(err)
	}
	return s, c
}

func ExampleOllamaClient_ModelBlob() {
	s, c := startNamingSim()
	defer s.Close()
	defer c.Close()

	// Which runner serves tiny-a? The one whose --model names this blob
	// (GPUProcess.Blob), which is not the Digest of /api/tags.
	blob, err := c.ModelBlob(context.Background(), "tiny-a")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(blob)
	// Output:
	// sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa
}
