package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/vramguard/vramguard"
)

// An exclusive hand-off: the orchestrator's phase ends by handing 12 GiB
// over to a render, reserved; a chat UI on the same host (here in the same
// process, the same in another) is refused that room, naming the render,
// until the orchestrator releases it once the render has allocated.
func ExampleOllamaClient_Reserve() {
	s, leases, stop := sharedHost("llama3.2", 8<<30)
	defer stop()
	newClient := func() *vramguard.OllamaClient {
		c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU(), Leases: leases})
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	c, chatUI := newClient(), newClient()
	defer c.Close()
	defer chatUI.Close()
	ctx := context.Background()

	// README: from here
	p, err := c.StartPhase(ctx, "prompts", vramguard.PhaseOptions{
		NeedBytes: 20 << 30, // the render's text encoder and UNet
		Reserve:   vramguard.ReserveOptions{For: "render 42"},
	})
	if err != nil {
		log.Fatal(err)
	}
	g := p.Guard()
	if _, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "a prompt"}, nil); err != nil {
		log.Fatal(err)
	}
	rep, err := p.End(ctx) // unloads, verified, and reserves the room for the render
	if err != nil {
		log.Fatal(err)
	}
	res := rep.Handover.Reservation
	fmt.Println("reserved", res.Info().Bytes>>30, "GiB for", res.Info().For)

	// Any other vramguard client on the host: its loads, budgets and
	// room-making count those bytes as taken.
	_, err = chatUI.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 8 << 30, DryRun: true})
	var room *vramguard.RoomError
	if errors.As(err, &room) {
		fmt.Println("chat refused:", room.Reserved[0].For, errors.Is(err, vramguard.ErrLeased))
	}

	// ... the render loads its models here (or give Reserve.PID, and the
	// reservation ends as that process takes the room) ...
	if err := res.Release(); err != nil {
		log.Fatal(err)
	}
	_, err = chatUI.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 8 << 30, DryRun: true})
	fmt.Println("chat after release:", err)
	// README: to here

	// Output:
	// reserved 20 GiB for render 42
	// chat refused: render 42 true
	// chat after release: <nil>
}

// A proxy holds a model for its HTTP client: every vramguard program on
// the host sees the client's name on the lease, and the proxy's own
// unloads keep the model as they keep another program's.
func ExampleOllamaClient_Reserve_holdForAClient() {
	s, leases, stop := sharedHost("llama3.2", 2<<30)
	defer stop()
	opts := vramguard.Options{Host: s.URL().String(), Leases: leases}
	proxy, err := vramguard.NewClient(opts)
	if err != nil {
		log.Fatal(err)
	}
	defer proxy.Close()
	orchestrator, err := vramguard.NewClient(opts)
	if err != nil {
		log.Fatal(err)
	}
	defer orchestrator.Close()
	ctx := context.Background()
	if _, err := proxy.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}

	lease, err := proxy.Reserve(ctx, 0, 0, vramguard.ReserveOptions{Model: "llama3.2", For: "chat-ui", TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	var le *vramguard.LeasedError
	_, err = orchestrator.UnloadModel(ctx, "llama3.2")
	if errors.As(err, &le) {
		fmt.Println("orchestrator refused: held for", le.Leases[0].For)
	}
	_, err = proxy.UnloadModel(ctx, "llama3.2")
	fmt.Println("proxy refused:", errors.Is(err, vramguard.ErrLeased), s.Listed("llama3.2"))

	if err := lease.Release(); err != nil { // or Extend, while the client keeps it
		log.Fatal(err)
	}
	rep, err := proxy.UnloadModel(ctx, "llama3.2")
	fmt.Println(err, rep.Verified)
	// Output:
	// orchestrator refused: held for chat-ui
	// proxy refused: true true
	// <nil> true
}
