package integration_test

import (
	"context"
	"testing"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/nodes"
)

// TestNodes runs each prompt node on a real server, with "unload after use"
// on (the default: nothing resident when the node returns) and off (the
// model stays for the server's keep-alive).
func TestNodes(t *testing.T) {
	type node struct {
		name string
		run  func(ctx context.Context, g vramguard.Guard) (*nodes.Result, error)
	}
	const tokens = 8 // random weights write gibberish; the length is what matters
	ns := []node{
		{"generator", func(ctx context.Context, g vramguard.Guard) (*nodes.Result, error) {
			n := nodes.PromptGenerator{Guard: g, Model: modelA, MaxTokens: tokens}
			return n.Generate(ctx, nodes.GenerateInput{Description: "a castle", Style: "anime"})
		}},
		{"refiner", func(ctx context.Context, g vramguard.Guard) (*nodes.Result, error) {
			n := nodes.PromptRefiner{Guard: g, Model: modelA, MaxTokens: tokens}
			return n.Refine(ctx, nodes.RefineInput{Prompt: "a castle", Passes: 2})
		}},
		{"negative", func(ctx context.Context, g vramguard.Guard) (*nodes.Result, error) {
			n := nodes.NegativePrompt{Guard: g, Model: modelA, MaxTokens: tokens}
			return n.Generate(ctx, nodes.NegativeInput{Prompt: "a castle"})
		}},
		{"dual-stream", func(ctx context.Context, g vramguard.Guard) (*nodes.Result, error) {
			n := nodes.DualStreamRefiner{Guard: g, Model: modelA, MaxTokens: tokens}
			return n.Refine(ctx, nodes.DualInput{Description: "a castle"})
		}},
	}
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		c := newClient(t, s, vramguard.Options{})
		for _, n := range ns {
			t.Run(n.name, func(t *testing.T) {
				res, err := n.run(t.Context(), vramguard.Guard{Client: c})
				if err != nil {
					// Random weights may clean to nothing; that is a typed
					// error, and still nothing may stay resident.
					t.Logf("unload on: %v", err)
				} else if len(res.Generations) == 0 || res.Model != modelA {
					t.Errorf("result %+v", res)
				}
				requireEmpty(t, s, "after the node returned with unload on")

				_, err = n.run(t.Context(), vramguard.Guard{Client: c, KeepLoaded: true})
				if err != nil {
					t.Logf("unload off: %v", err)
				}
				if ms := running(t, s); len(ms) != 1 {
					t.Fatalf("unload off: /api/ps lists %v, want %s", ms, modelA)
				}
				if _, err := c.UnloadModel(t.Context(), modelA); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}
