// Package adopter is a user's own program built on vramguard: an image
// studio whose prompts an LLM served by Ollama writes, and whose diffusion
// stage needs the GPU right after. It lives outside the vramguard module
// (scripts/check-copy.sh tests it with the checkout as a replace) and uses
// only public packages; studio_test.go tests it against
// vramguardtest.Server, as a user would.
package adopter

import (
	"context"
	"errors"
	"fmt"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/nodes"
)

// Studio writes prompts with Ollama and hands them, with a GPU Ollama has
// let go of, to Render.
type Studio struct {
	Client      *vramguard.OllamaClient
	Model       string // the text model that writes prompts
	VisionModel string // the model that looks at reference images
	// Render is the diffusion stage. It is called only once the models
	// Studio used are unloaded, verified.
	Render func(ctx context.Context, prompt string) error
}

// One writes a prompt for desc with a PromptGenerator node, which unloads
// the model, verified, before it returns, and renders it.
func (s *Studio) One(ctx context.Context, desc string) (string, error) {
	g := nodes.PromptGenerator{Guard: vramguard.Guard{Client: s.Client}, Model: s.Model}
	res, err := g.Generate(ctx, nodes.GenerateInput{Description: desc})
	if err != nil {
		return "", fmt.Errorf("writing the prompt: %w", err)
	}
	if err := s.Render(ctx, res.Prompt); err != nil {
		return "", fmt.Errorf("rendering: %w", err)
	}
	return res.Prompt, nil
}

// Batch writes a prompt for each description in one phase, so the model
// is loaded once, ends the phase (a verified unload of every model it
// used), and only then renders them.
func (s *Studio) Batch(ctx context.Context, descs []string) ([]string, *vramguard.PhaseReport, error) {
	phase, err := s.Client.StartPhase(ctx, "prompts", vramguard.PhaseOptions{})
	if err != nil {
		return nil, nil, err
	}
	g := phase.Guard()
	var prompts []string
	for _, d := range descs {
		gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: s.Model, Prompt: "Write a diffusion prompt for: " + d}, nil)
		if err != nil {
			_, eerr := phase.End(ctx)
			return nil, nil, errors.Join(err, eerr)
		}
		prompts = append(prompts, gen.Text)
	}
	rep, err := phase.End(ctx)
	if err != nil {
		return nil, rep, err
	}
	for _, p := range prompts {
		if err := s.Render(ctx, p); err != nil {
			return nil, rep, fmt.Errorf("rendering: %w", err)
		}
	}
	return prompts, rep, nil
}

// Caption asks the vision model what img shows, in one guarded chat turn.
func (s *Studio) Caption(ctx context.Context, img []byte) (string, error) {
	g := vramguard.Guard{Client: s.Client}
	gen, err := g.Chat(ctx, &vramguard.ChatRequest{
		Model:    s.VisionModel,
		Messages: []api.Message{{Role: "user", Content: "Describe this picture in one line.", Images: []api.ImageData{img}}},
	}, nil)
	if err != nil {
		return "", err
	}
	return gen.Text, nil
}

// HandOver unloads the text model, whoever loaded it, and returns once
// the library has verified it gone: what the studio calls before a
// diffusion stage that did not go through Studio's own nodes.
func (s *Studio) HandOver(ctx context.Context) (*vramguard.UnloadReport, error) {
	rep, err := s.Client.UnloadModel(ctx, s.Model)
	if err != nil {
		return rep, err
	}
	if !rep.Verified {
		return rep, fmt.Errorf("%s not verified gone", s.Model)
	}
	return rep, nil
}

// Alternate is the studio's render loop with ComfyUI as its diffusion
// stage: for each description it writes a prompt in a phase whose End
// hands the GPU over with need bytes free (verified), renders wf on
// ComfyUI with the prompt in node textNode's "text", and frees ComfyUI
// with a measured receipt before the next prompt. It returns the
// receipts, one per round.
func (s *Studio) Alternate(ctx context.Context, comfy *comfyui.Client, wf comfyui.Workflow, textNode string, need uint64, descs []string) ([]*comfyui.Receipt, error) {
	var receipts []*comfyui.Receipt
	for _, d := range descs {
		phase, err := s.Client.StartPhase(ctx, "prompt", vramguard.PhaseOptions{NeedBytes: need})
		if err != nil {
			return receipts, err
		}
		g := phase.Guard()
		gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: s.Model, Prompt: "Write a diffusion prompt for: " + d}, nil)
		if _, eerr := phase.End(ctx); err != nil || eerr != nil {
			return receipts, errors.Join(err, eerr)
		}
		node := wf[textNode]
		inputs := map[string]any{}
		for k, v := range node.Inputs {
			inputs[k] = v
		}
		inputs["text"] = gen.Text
		node.Inputs = inputs
		wf[textNode] = node
		if _, err := comfy.Run(ctx, wf); err != nil {
			return receipts, fmt.Errorf("rendering: %w", err)
		}
		rc, err := comfy.Free(ctx, comfyui.FreeRequest{Wait: true})
		if err != nil {
			return receipts, fmt.Errorf("freeing ComfyUI: %w", err)
		}
		receipts = append(receipts, rc)
	}
	return receipts, nil
}
