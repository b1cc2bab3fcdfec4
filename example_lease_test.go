package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// sharedHost starts a fake Ollama with one model of size bytes, and a
// lease directory of the example's own (real programs leave
// LeaseOptions.Dir empty: the per-user default, shared by all of them);
// stop removes both.
func sharedHost(model string, size uint64) (*vramguardtest.Server, vramguard.LeaseOptions, func()) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: model, Size: size}}})
	tmp, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	return s, vramguard.LeaseOptions{Dir: filepath.Join(tmp, "leases")}, func() { s.Close(); os.RemoveAll(tmp) }
}

// A chat UI holds its model; an orchestrator on the same host (here in
// the same process, the same in another) cannot unload it until the lease
// ends, and learns who holds it.
func ExampleOllamaClient_HoldModel() {
	s, leases, stop := sharedHost("llama3.2", 2<<30)
	defer stop()
	opts := vramguard.Options{Host: s.URL().String(), Leases: leases}
	chatUI, err := vramguard.NewClient(opts)
	if err != nil {
		log.Fatal(err)
	}
	defer chatUI.Close()
	orchestrator, err := vramguard.NewClient(opts)
	if err != nil {
		log.Fatal(err)
	}
	defer orchestrator.Close()

	ctx := context.Background()
	if _, err := chatUI.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	lease, err := chatUI.HoldModel(ctx, "llama3.2", 10*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	_, err = orchestrator.UnloadModel(ctx, "llama3.2")
	var le *vramguard.LeasedError
	fmt.Println(errors.Is(err, vramguard.ErrLeased), errors.As(err, &le) && le.Leases[0].PID == os.Getpid(), s.Listed("llama3.2"))

	if err := lease.Release(); err != nil {
		log.Fatal(err)
	}
	rep, err := orchestrator.UnloadModel(ctx, "llama3.2")
	fmt.Println(err, rep.Verified, s.Listed("llama3.2"))
	// Output:
	// true true true
	// <nil> true false
}

// Room-making never evicts what another program holds: when the room
// cannot be made without it, nothing is unloaded and the refusal names
// the holder and when the lease ends.
func ExampleRoomError() {
	s, leases, stop := sharedHost("qwen3:8b", 5<<30)
	defer stop()
	other, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Leases: leases})
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU(), Leases: leases})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	if _, err := other.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "qwen3:8b", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	lease, err := other.HoldModel(ctx, "qwen3:8b", time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release()
	_, err = c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 22 << 30}) // of 24 GiB
	var re *vramguard.RoomError
	if errors.As(err, &re) {
		fmt.Println(errors.Is(err, vramguard.ErrLeased), re.Kept[0].Model, re.RetryAfter > 59*time.Minute, s.Listed("qwen3:8b"))
	}
	// Output: true qwen3:8b true true
}

// An operator who must have the memory back overrides another program's
// lease; the report says whose lease it overrode.
func ExampleOllamaClient_ForceUnloadModel() {
	s, leases, stop := sharedHost("llama3.2", 2<<30)
	defer stop()
	opts := vramguard.Options{Host: s.URL().String(), Leases: leases}
	holder, err := vramguard.NewClient(opts)
	if err != nil {
		log.Fatal(err)
	}
	defer holder.Close()
	operator, err := vramguard.NewClient(opts)
	if err != nil {
		log.Fatal(err)
	}
	defer operator.Close()

	ctx := context.Background()
	if _, err := holder.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	if _, err := holder.HoldModel(ctx, "llama3.2", 0); err != nil {
		log.Fatal(err)
	}
	rep, err := operator.ForceUnloadModel(ctx, "llama3.2")
	fmt.Println(err, rep.Verified, len(rep.Leased), s.Listed("llama3.2"))
	// Output: <nil> true 1 false
}

// Options.Protected: a model this client never evicts to make room. A
// room-making call that would need it fails, naming it; asked for by
// name, it is unloaded.
func ExampleOptions_protected() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "embedder", Size: 20 << 30}}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU(), Protected: []string{"embedder"}, Leases: vramguard.LeaseOptions{Off: true}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "embedder", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	_, err = c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 10 << 30})
	fmt.Println(errors.Is(err, vramguard.ErrProtected), s.Listed("embedder"))
	rep, err := c.UnloadModel(ctx, "embedder")
	fmt.Println(err, rep.Verified)
	// Output:
	// true true
	// <nil> true
}
