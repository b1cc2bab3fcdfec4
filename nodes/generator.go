package nodes

import (
	"context"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// PromptGenerator expands a short description into a detailed diffusion
// prompt, following a style preset.
//
// With Guard.Client and Model set, the zero value uses the built-in styles
// and unloads the model after each call (see vramguard.Guard; the Guard's
// own Generate stays reachable as g.Guard.Generate). It is safe for
// concurrent use while its fields are not changed.
type PromptGenerator struct {
	vramguard.Guard
	// Model is the Ollama model; required.
	Model string
	// Timeout bounds the generation (Timeouts.Total); zero means the
	// client's, negative is invalid.
	Timeout time.Duration
	// MaxTokens caps the reply (num_predict); zero means the model's limit.
	MaxTokens int
	// Progress, if set, is called on every streamed chunk, on the calling
	// goroutine; it must not block.
	Progress func(Progress)
	// Styles are the styles Style names; nil means the built-in ones.
	Styles *StyleSet
}

// GenerateInput is what PromptGenerator.Generate works on.
type GenerateInput struct {
	// Description of the image; required.
	Description string
	// Style names a style of the generator's set; empty means
	// DefaultStyle. Case and surrounding space are ignored.
	Style string
	// Emphasis and Mood, optional, steer the prompt.
	Emphasis, Mood string
	Sampling
	// IncludeReasoning keeps the model's reasoning in Result.Reasoning.
	// Without it the request turns thinking off (Think false); with it
	// thinking is left to the model's default, so that a model that
	// cannot think is not refused.
	IncludeReasoning bool
}

// Generate writes a prompt for in. Invalid input is a KindInvalidInput
// error, a reply that cleans to nothing a KindServer error wrapping
// ErrEmptyOutput, and a failed generation its own typed error; none comes
// with a result. If the generation succeeds but the guard's cleanup fails,
// both the result and the error are returned.
func (g *PromptGenerator) Generate(ctx context.Context, in GenerateInput) (*Result, error) {
	st := &settings{op: "prompt generator", guard: &g.Guard, model: g.Model, timeout: g.Timeout, maxTokens: g.MaxTokens, progress: g.Progress}
	if err := st.validate(); err != nil {
		return nil, err
	}
	if err := validInput(st.op, g.Model, "description", in.Description, "style", in.Style, "emphasis", in.Emphasis, "mood", in.Mood); err != nil {
		return nil, err
	}
	if err := in.Sampling.validate(st.op, g.Model); err != nil {
		return nil, err
	}
	style := in.Style
	if strings.TrimSpace(style) == "" {
		style = DefaultStyle
	}
	prompt, err := g.Styles.render(st.op, g.Model, style, TemplateData{
		Description: strings.TrimSpace(in.Description),
		Emphasis:    strings.TrimSpace(in.Emphasis),
		Mood:        strings.TrimSpace(in.Mood),
	})
	if err != nil {
		return nil, err
	}
	return single(ctx, st, pass{prompt: prompt, sampling: in.Sampling, reasoning: in.IncludeReasoning})
}
