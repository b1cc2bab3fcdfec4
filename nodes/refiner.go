package nodes

import (
	"context"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// PromptRefiner rewrites a prompt in one to three passes, each pass
// refining the previous one's output.
//
// All passes run in one Guard.Run, so the guard counts them as one use of
// the model. With the default guard every generation sends keep-alive 0
// and the model is reloaded for each pass; set Guard.Phase (or KeepLoaded)
// to keep it warm between passes. The zero value, with Guard.Client and
// Model set, unloads the model after each call. It is safe for concurrent
// use while its fields are not changed.
type PromptRefiner struct {
	vramguard.Guard
	// Model is the Ollama model; required.
	Model string
	// Timeout bounds each pass's generation (Timeouts.Total); zero means
	// the client's, negative is invalid.
	Timeout time.Duration
	// MaxTokens caps each pass's reply (num_predict); zero means the
	// model's limit.
	MaxTokens int
	// Progress, if set, is called on every streamed chunk, on the calling
	// goroutine; it must not block.
	Progress func(Progress)
}

// RefineInput is what PromptRefiner.Refine works on.
type RefineInput struct {
	// Prompt to refine; required.
	Prompt string
	// Instructions, optional, say what to improve ("more detail on the
	// lighting").
	Instructions string
	// Passes, from 1 to MaxPasses; 0 means DefaultPasses.
	Passes int
	// Sampling applies to every pass; pass p, counted from 0, uses seed
	// Seed+p so that passes differ.
	Sampling
	// IncludeReasoning keeps the model's reasoning, all passes together,
	// in Result.Reasoning.
	IncludeReasoning bool
}

// Refine refines in.Prompt. A pass that returns nothing once cleaned keeps
// the previous text, so the result is never empty; Result.Generations has
// one generation per pass. A failed pass fails the call with its typed
// error and no result. If the passes succeed but the guard's cleanup fails,
// both the result and the error are returned.
func (r *PromptRefiner) Refine(ctx context.Context, in RefineInput) (*Result, error) {
	st := &settings{op: "prompt refiner", guard: &r.Guard, model: r.Model, timeout: r.Timeout, maxTokens: r.MaxTokens, progress: r.Progress}
	if err := st.validate(); err != nil {
		return nil, err
	}
	if err := validInput(st.op, r.Model, "prompt", in.Prompt, "instructions", in.Instructions); err != nil {
		return nil, err
	}
	if err := in.Sampling.validate(st.op, r.Model); err != nil {
		return nil, err
	}
	passes := in.Passes
	if passes == 0 {
		passes = DefaultPasses
	}
	if passes < 1 || passes > MaxPasses {
		return nil, invalid(st.op, r.Model, "%d passes: want 1 to %d", in.Passes, MaxPasses)
	}
	res := &Result{Model: r.Model, Prompt: strings.TrimSpace(in.Prompt)}
	done := false
	var reasoning []string
	err := r.Run(ctx, r.Model, func(ctx context.Context, s *vramguard.Session) error {
		tokens := 0
		for p := 1; p <= passes; p++ {
			prompt, err := renderFixed(st.op, r.Model, refineTemplate, fixedData{
				Prompt:       res.Prompt,
				Instructions: strings.TrimSpace(in.Instructions),
				Pass:         p,
				Passes:       passes,
			})
			if err != nil {
				return err
			}
			gen, text, rs, err := st.generate(ctx, s, pass{prompt: prompt, sampling: in.Sampling, reasoning: in.IncludeReasoning, n: p, of: passes, tokens: &tokens})
			if err != nil {
				return err
			}
			res.Generations = append(res.Generations, gen)
			reasoning = append(reasoning, rs)
			if text != "" {
				res.Prompt = text
			}
		}
		done = true
		return nil
	})
	res.Reasoning = joinNonEmpty(reasoning...)
	return finish(res, done, err)
}
