package vramguard_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A model that loads again says why it had left: here another program
// unloaded it while the keep-alive this client sent still ran.
func ExampleReloadEvent() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "llama3.2", LoadLatency: 30 * time.Millisecond},
	}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	generate := func() *vramguard.Generation {
		gen, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "a castle"},
			vramguard.KeepAliveFor(time.Hour), nil)
		if err != nil {
			log.Fatal(err)
		}
		return gen
	}
	generate()
	// Another program unloads the model (keep_alive 0, empty prompt).
	_ = s.APIClient().Generate(ctx, &api.GenerateRequest{Model: "llama3.2", KeepAlive: &api.Duration{}},
		func(api.GenerateResponse) error { return nil })
	_ = s.WaitFor(ctx, func() bool { return !s.Listed("llama3.2") })

	if r := generate().Reload; r != nil {
		fmt.Println(r.Cause)
		fmt.Println(r.Evidence)
	}
	// Output:
	// unloaded or evicted by another program
	// keep-alive 1h0m0s sent with the last request; still running when the model left
}

// JoinHooks lets a tracing adapter, a metrics adapter and a program's own
// hooks watch one client; each end hook sees the context its own start
// hook returned.
func ExampleJoinHooks() {
	s, _ := startSim()
	defer s.Close()
	type spanKey struct{}
	tracing := vramguard.Hooks{
		OnCallStart: func(ctx context.Context, ev vramguard.CallStart) context.Context {
			return context.WithValue(ctx, spanKey{}, ev.Op+" "+ev.Model)
		},
		OnCallEnd: func(ctx context.Context, ev vramguard.CallEnd) {
			// Generation is nil when the call failed (ev.Err).
			fmt.Println("span ended:", ctx.Value(spanKey{}), "loaded:", ev.Generation != nil && ev.Generation.Loaded)
		},
	}
	loads := 0
	mine := vramguard.Hooks{OnCallEnd: func(_ context.Context, ev vramguard.CallEnd) {
		if ev.Generation != nil && ev.Generation.Loaded {
			loads++
		}
	}}
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Hooks: vramguard.JoinHooks(tracing, mine)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "a castle"},
		vramguard.KeepAliveUnload, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println("loads:", loads)
	// Output:
	// span ended: generate llama3.2 loaded: true
	// loads: 1
}

// Holders splits a device's memory by who holds it: what a dashboard
// shows, and what a refused load names.
func ExampleDeviceMemory_Holders() {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 << 30, Models: []vramguardtest.ModelConfig{
		{Name: "llama3.2", SizeVRAM: 3 << 30},
	}})
	defer s.Close()
	_ = s.Reserve("comfyui", 12<<30)
	_ = s.APIClient().Generate(context.Background(), &api.GenerateRequest{Model: "llama3.2", KeepAlive: &api.Duration{Duration: -1}, Prompt: "x"},
		func(api.GenerateResponse) error { return nil })

	snap, err := s.GPU().Snapshot(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range snap.Devices[0].Holders() {
		fmt.Printf("%-7s %-16s %2d GiB\n", h.Kind, h.Name, h.Bytes>>30)
	}
	// Output:
	// runner  llama3.2:latest   3 GiB
	// other   comfyui          12 GiB
	// free                      9 GiB
}
