package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"

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
