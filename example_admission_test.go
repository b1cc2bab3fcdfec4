package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

func ExampleOllamaClient_Shutdown() {
	s, c := startSim()
	defer s.Close()
	if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "x"},
		vramguard.KeepAliveFor(2*time.Minute), nil); err != nil {
		log.Fatal(err)
	}
	// A deadline of the caller's for the whole shutdown, as with net/http:
	// the model left warm is unloaded, verified, within it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	_, err := c.Running(context.Background())
	fmt.Println(s.Listed("llama3.2"), errors.Is(err, vramguard.ErrClosed))
	// Output: false true
}

// A budget for the LLM side: every load must leave 10 GiB free for the
// text encoder that comes next. A diffusion process holds 14 of the 24 GiB,
// so the 5 GiB model is refused, naming who holds the memory, and nothing
// is sent to the server.
func ExampleBudget() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "qwen3:8b", Size: 5 << 30}}})
	defer s.Close()
	if err := s.Reserve("comfyui", 14<<30); err != nil {
		log.Fatal(err)
	}
	c, err := vramguard.NewClient(vramguard.Options{
		Host:   s.URL().String(),
		VRAM:   &vramguardtest.GPU{Server: s},
		Budget: &vramguard.Budget{Headroom: 10 << 30},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	_, err = c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "qwen3:8b", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	var re *vramguard.RoomError
	if errors.As(err, &re) {
		fmt.Println(errors.Is(err, vramguard.KindOutOfMemory), re.Holders[0].Name, s.Requests("qwen3:8b"))
	}
	// Output: true comfyui 0
}

// FailOnOffload: a model Ollama could load only partly on the GPU fails
// the call at its first chunk and is unloaded, instead of generating many
// times slower.
func ExampleOffload() {
	s := vramguardtest.New(vramguardtest.Config{StrictVRAM: true, Offload: true, Models: []vramguardtest.ModelConfig{{Name: "qwen3:8b", Size: 5 << 30}}})
	defer s.Close()
	if err := s.Reserve("comfyui", 21<<30); err != nil { // 3 of 24 GiB left
		log.Fatal(err)
	}
	c, err := vramguard.NewClient(vramguard.Options{
		Host:          s.URL().String(),
		VRAM:          &vramguardtest.GPU{Server: s},
		FailOnOffload: true,
		PollInterval:  5 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	_, err = c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "qwen3:8b", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
	fmt.Println(errors.Is(err, vramguard.ErrOffloaded), errors.Is(err, vramguard.KindOutOfMemory), s.Listed("qwen3:8b"))
	// Output: true true false
}

// One program for a GPU box and a laptop without a GPU: the same budget,
// with OffWithoutGPU, is enforced where the device can be read and turns
// itself off (one INFO line) where it cannot. Here there is no reader, as
// on a machine where gpu.NewAutoReader fails.
func ExampleOllamaClient_BudgetOff() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "qwen3:8b", Size: 5 << 30}}})
	defer s.Close()
	var reader vramguard.VRAMReader // set it from gpu.NewAutoReader when that succeeds
	c, err := vramguard.NewClient(vramguard.Options{
		Host:   s.URL().String(),
		VRAM:   reader,
		Budget: &vramguard.Budget{Headroom: 10 << 30, OffWithoutGPU: true},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	_, err = c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "qwen3:8b", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	fmt.Println(err, c.BudgetOff())
	// Output: <nil> true
}
