package nodes

import (
	"context"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// NegativePrompt writes the negative prompt for a positive one: the
// artifacts and qualities the image must avoid.
//
// With Guard.Client and Model set, the zero value unloads the model after
// each call (see vramguard.Guard; the Guard's own Generate stays reachable
// as n.Guard.Generate). It is safe for concurrent use while its fields are
// not changed.
type NegativePrompt struct {
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
	// Styles resolves NegativeInput.Style; nil means the built-in styles.
	Styles *StyleSet
}

// NegativeInput is what NegativePrompt.Generate works on.
type NegativeInput struct {
	// Prompt is the positive prompt; required.
	Prompt string
	// Style, optional, names a style whose things to avoid are suggested
	// to the model.
	Style string
	Sampling
	// IncludeReasoning keeps the model's reasoning in Result.Reasoning.
	IncludeReasoning bool
}

// Generate writes the negative prompt for in.Prompt into Result.Prompt.
// Errors are as for PromptGenerator.Generate.
func (n *NegativePrompt) Generate(ctx context.Context, in NegativeInput) (*Result, error) {
	st := &settings{op: "negative prompt", guard: &n.Guard, model: n.Model, timeout: n.Timeout, maxTokens: n.MaxTokens, progress: n.Progress}
	hint, err := st.styledInput(n.Styles, "prompt", in.Prompt, in.Style, in.Sampling)
	if err != nil {
		return nil, err
	}
	prompt, err := renderFixed(st.op, n.Model, negativeTemplate, fixedData{Prompt: strings.TrimSpace(in.Prompt), StyleHint: hint})
	if err != nil {
		return nil, err
	}
	return single(ctx, st, pass{prompt: prompt, sampling: in.Sampling, reasoning: in.IncludeReasoning})
}
