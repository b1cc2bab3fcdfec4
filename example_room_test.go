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

// A dry run answers "can I load an 11 GB text encoder now?" without
// unloading anything: what would go, and what stays.
func ExampleOllamaClient_EnsureFree_dryRun() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "llama3.2:3b", SizeVRAM: 3 << 30}, {Name: "qwen3:8b", SizeVRAM: 6 << 30}}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU(), Protected: []string{"qwen3:8b"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, m := range []string{"llama3.2:3b", "qwen3:8b"} {
		if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: m, Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.Reserve("comfyui", 7<<30); err != nil { // 8 GiB free of 24
		log.Fatal(err)
	}

	rep, err := c.EnsureFree(context.Background(), vramguard.EnsureRequest{Bytes: 11 << 30, DryRun: true})
	fmt.Println(err, rep.Plan, rep.Kept[0].Model, rep.Kept[0].Protected, s.Listed("llama3.2:3b"))

	// More than can be made: the refusal names the holders, nothing sent.
	_, err = c.EnsureFree(context.Background(), vramguard.EnsureRequest{Bytes: 16 << 30, DryRun: true})
	var re *vramguard.RoomError
	fmt.Println(errors.As(err, &re), errors.Is(err, vramguard.KindOutOfMemory), errors.Is(err, vramguard.ErrProtected))
	fmt.Println(re)
	// Output:
	// <nil> [llama3.2:3b] qwen3:8b true true
	// true true true
	// device 0 has 8.0 GiB free of 24.0 GiB, needs 16.0 GiB; held by qwen3:8b (ollama runner, pid 40002) 6.0 GiB, llama3.2:3b (ollama runner, pid 40001) 3.0 GiB, "comfyui" (pid 40003) 7.0 GiB; qwen3:8b kept (protected)
}

// A tenant is another holder of the device that can give memory back: a
// diffusion server's model cache here. With First it is asked before any
// Ollama model is unloaded, and its release is checked on the device.
func ExampleOllamaClient_RegisterTenant() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2:3b", SizeVRAM: 3 << 30}}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2:3b", Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
		log.Fatal(err)
	}
	if err := s.Reserve("comfyui", 18<<30); err != nil { // its cached checkpoints: 3 GiB free of 24
		log.Fatal(err)
	}
	unregister, err := c.RegisterTenant(vramguard.Tenant{
		Name: "comfyui", Bytes: 18 << 30, First: true,
		Release: func(context.Context) error { s.Release("comfyui"); return nil }, // ComfyUI's POST /free
	})
	if err != nil {
		log.Fatal(err)
	}
	defer unregister()

	rep, err := c.EnsureFree(context.Background(), vramguard.EnsureRequest{Bytes: 10 << 30})
	if err != nil {
		log.Fatal(err)
	}
	t := rep.Tenants[0]
	fmt.Println(t.Name, t.Verified, t.FreeBefore>>30, t.FreeAfter>>30, len(rep.Evicted), s.Listed("llama3.2:3b"))
	// Output: comfyui true 3 21 0 true
}

// A function that only empties a cache (a CUDA caching allocator's, through
// cgo) is a tenant on no one device (-1): ReleaseVRAM runs it, as do the
// release steps of EnsureFree, Phase.End and a Guard with Release;
// room-making never plans it. Unregistered, nothing runs it.
func ExampleOllamaClient_RegisterTenant_noDevice() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	unregister, err := c.RegisterTenant(vramguard.Tenant{Name: "pool", Device: -1,
		Release: func(context.Context) error { return errors.New("device busy") }})
	if err != nil {
		log.Fatal(err)
	}
	rep, err := c.ReleaseVRAM(context.Background())
	fmt.Println(rep.Ran, errors.Is(err, vramguard.KindInternal))
	unregister()
	rep, err = c.ReleaseVRAM(context.Background())
	fmt.Println(rep.Ran, err)
	// Output:
	// [pool] true
	// [] <nil>
}
