package nodes

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
)

// Defaults used where a field is zero.
const (
	DefaultTemperature = 0.7
	DefaultTopP        = 0.9
	DefaultStyle       = "cinematic"
	DefaultPasses      = 1
	MaxPasses          = 3
)

// MaxSeed is the largest seed accepted. Seeds stay in 31 bits so that a
// refiner's per-pass seeds never reach llama.cpp's "random seed" value.
const MaxSeed = math.MaxInt32

// MaxInputBytes bounds the text fields of one input together.
const MaxInputBytes = 10 << 20

// system is the system prompt shared by every node.
const system = "You write prompts for text-to-image diffusion models such as Stable Diffusion and Flux. " +
	"You answer with exactly the text asked for: no preamble, no title, no commentary."

// Sampling are the sampling settings of one call. The zero value samples
// with DefaultTemperature, DefaultTopP and seed 0.
type Sampling struct {
	// Temperature in (0, 1]; 0 means DefaultTemperature.
	Temperature float64
	// TopP in (0, 1]; 0 means DefaultTopP.
	TopP float64
	// Seed, from 0 to MaxSeed, is always sent, so the same model, input and
	// seed give the same prompt, as a diffusion seed does.
	Seed int64
}

func (s Sampling) validate(op, model string) error {
	if !unitOrZero(s.Temperature) {
		return invalid(op, model, "temperature %v is outside (0, 1]", s.Temperature)
	}
	if !unitOrZero(s.TopP) {
		return invalid(op, model, "top-p %v is outside (0, 1]", s.TopP)
	}
	if s.Seed < 0 || s.Seed > MaxSeed {
		return invalid(op, model, "seed %d is outside [0, %d]", s.Seed, MaxSeed)
	}
	return nil
}

// unitOrZero reports whether f is 0 (the default) or in (0, 1]; NaN and
// infinities are neither.
func unitOrZero(f float64) bool { return f == 0 || (f > 0 && f <= 1) }

// options returns Ollama's model options for a pass; seedOffset is added to
// the seed so that passes differ.
func (s Sampling) options(seedOffset, maxTokens int) map[string]any {
	t, p := s.Temperature, s.TopP
	if t == 0 {
		t = DefaultTemperature
	}
	if p == 0 {
		p = DefaultTopP
	}
	o := map[string]any{"temperature": t, "top_p": p, "seed": s.Seed + int64(seedOffset)}
	if maxTokens > 0 {
		o["num_predict"] = maxTokens
	}
	return o
}

// Progress reports a node's streaming progress.
type Progress struct {
	// Pass is the pass running, from 1; Passes how many the call runs
	// (always 1 except for PromptRefiner).
	Pass, Passes int
	// Tokens counts the streamed chunks that carried text or reasoning so
	// far in this call, all passes together (Ollama streams about one token
	// per chunk). It never decreases.
	Tokens int
	// Fraction is the share of the call done, from 0 to 1, computed from
	// the chunks of each pass against MaxTokens; -1 when MaxTokens is 0
	// (the length is then unknown).
	Fraction float64
	// Done reports the last chunk of the pass.
	Done bool
}

// Result is what a node produced.
type Result struct {
	// Prompt is the cleaned prompt: the positive prompt for
	// DualStreamRefiner, the negative prompt for NegativePrompt.
	Prompt string
	// Negative is DualStreamRefiner's negative prompt (empty when the
	// model wrote none); empty for the other nodes.
	Negative string
	// Reasoning is the model's reasoning, when the input asked to include
	// it: Ollama's separate thinking text and any reasoning block found in
	// the reply, pass after pass.
	Reasoning string
	// Model is the model that wrote the prompt.
	Model string
	// DualFormat says how DualStreamRefiner asked for the two prompts
	// and read them; zero for the other nodes.
	DualFormat DualFormat
	// Generations are the raw generations, one per pass, for metrics.
	Generations []*vramguard.Generation
}

// settings are the fields every node has.
type settings struct {
	op        string
	guard     *vramguard.Guard
	model     string
	timeout   time.Duration
	maxTokens int
	progress  func(Progress)
}

func (st *settings) validate() error {
	switch {
	case st.guard.Client == nil:
		return invalid(st.op, st.model, "node has no client")
	case strings.TrimSpace(st.model) == "":
		return invalid(st.op, "", "node has no model")
	case st.timeout < 0:
		return invalid(st.op, st.model, "negative timeout %v", st.timeout)
	case st.maxTokens < 0:
		return invalid(st.op, st.model, "negative max tokens %d", st.maxTokens)
	}
	return nil
}

// validText checks one input text field; name is used in the message.
func validText(op, model, name, s string, required bool) error {
	switch {
	case required && strings.TrimSpace(s) == "":
		return invalid(op, model, "%s is empty", name)
	case !utf8.ValidString(s):
		return invalid(op, model, "%s is not valid UTF-8", name)
	case len(s) > MaxInputBytes:
		return invalid(op, model, "%s of %d bytes exceeds %d", name, len(s), MaxInputBytes)
	}
	return nil
}

// validInput checks the text fields of an input (name, value pairs; the
// first is required) and their total size.
func validInput(op, model string, fields ...string) error {
	return validFields(op, model, true, fields...)
}

// validFields checks name, value pairs of text fields, the first required
// if firstRequired, and their total size.
func validFields(op, model string, firstRequired bool, fields ...string) error {
	total := 0
	for i := 0; i+1 < len(fields); i += 2 {
		if err := validText(op, model, fields[i], fields[i+1], firstRequired && i == 0); err != nil {
			return err
		}
		total += len(fields[i+1])
	}
	if total > MaxInputBytes {
		return invalid(op, model, "input of %d bytes exceeds %d", total, MaxInputBytes)
	}
	return nil
}

// styledInput validates a node call whose input has one required text
// field and an optional style: the node's settings, the text, the sampling,
// and the style, whose hint for the instructions it returns ("" without a
// style).
func (st *settings) styledInput(styles *StyleSet, field, text, style string, s Sampling) (hint string, err error) {
	if err := st.validate(); err != nil {
		return "", err
	}
	if err := validInput(st.op, st.model, field, text, "style", style); err != nil {
		return "", err
	}
	if err := s.validate(st.op, st.model); err != nil {
		return "", err
	}
	if strings.TrimSpace(style) == "" {
		return "", nil
	}
	c, err := styles.lookup(st.op, st.model, style)
	if err != nil {
		return "", err
	}
	return styleHint(c), nil
}

// pass is one generation of a node call.
type pass struct {
	prompt string // a generation's prompt, sent with the shared system prompt
	// messages, when set, make the pass a chat turn: the conversation,
	// system message included; prompt is then unused.
	messages  []api.Message
	format    json.RawMessage // structured output; nil for free text
	sampling  Sampling
	reasoning bool // keep reasoning: leave thinking to the model's default
	n, of     int  // pass number from 1, and passes in the call
	tokens    *int // chunks so far in the call
}

// generate runs one pass in a guarded session, as a generation or a chat
// turn, and returns the generation and its cleaned text and reasoning.
func (st *settings) generate(ctx context.Context, s *vramguard.Session, p pass) (gen *vramguard.Generation, text, reasoning string, err error) {
	var think *bool
	if !p.reasoning {
		// Thinking off: faster, and nothing to strip. With reasoning
		// wanted, Think stays nil: a thinking model then thinks (Ollama's
		// default) and a model that cannot is not refused with a 400.
		think = new(bool)
	}
	opts := p.sampling.options(p.n-1, st.maxTokens)
	timeouts := vramguard.Timeouts{Total: st.timeout}
	fn := st.chunkFunc(p)
	if p.messages != nil {
		gen, err = s.Chat(ctx, &vramguard.ChatRequest{
			Messages: p.messages,
			Format:   p.format,
			Think:    think,
			Options:  opts,
			Timeouts: timeouts,
		}, fn)
	} else {
		gen, err = s.Generate(ctx, &vramguard.GenerateRequest{
			Prompt:   p.prompt,
			System:   system,
			Format:   p.format,
			Think:    think,
			Options:  opts,
			Timeouts: timeouts,
		}, fn)
	}
	if err != nil {
		return nil, "", "", err
	}
	text, inline := Clean(gen.Text, CleanOptions{})
	if p.reasoning {
		reasoning = joinNonEmpty(strings.TrimSpace(gen.Thinking), inline)
	}
	return gen, text, reasoning, nil
}

// chunkFunc returns the callback that turns a pass's chunks into
// Progress, or nil without a Progress callback.
func (st *settings) chunkFunc(p pass) vramguard.ChunkFunc {
	if st.progress == nil {
		return nil
	}
	passTokens := 0
	return func(ch vramguard.Chunk) error {
		if ch.Text != "" || ch.Thinking != "" {
			passTokens++
			*p.tokens++
		}
		st.progress(Progress{
			Pass:     p.n,
			Passes:   p.of,
			Tokens:   *p.tokens,
			Fraction: fraction(p.n, p.of, passTokens, st.maxTokens, ch.Done),
			Done:     ch.Done,
		})
		return nil
	}
}

// fraction is the share of a call done after tokens chunks of pass n of of.
func fraction(n, of, tokens, maxTokens int, done bool) float64 {
	if maxTokens <= 0 {
		return -1
	}
	f := min(float64(tokens)/float64(maxTokens), 1)
	if done {
		f = 1
	}
	return (float64(n-1) + f) / float64(of)
}

// joinNonEmpty joins the non-empty strings with blank lines.
func joinNonEmpty(parts ...string) string {
	var kept []string
	for _, p := range parts {
		if p != "" {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, "\n\n")
}

// single runs a one-pass node whose output must not be empty; p's pass
// counters are set here.
func single(ctx context.Context, st *settings, p pass) (*Result, error) {
	res := &Result{Model: st.model}
	done := false
	err := st.guard.Run(ctx, st.model, func(ctx context.Context, s *vramguard.Session) error {
		tokens := 0
		p.n, p.of, p.tokens = 1, 1, &tokens
		gen, text, r, err := st.generate(ctx, s, p)
		if err != nil {
			return err
		}
		res.Generations = append(res.Generations, gen)
		res.Prompt, res.Reasoning = text, r
		if text == "" {
			return emptyOutput(st.op, st.model)
		}
		done = true
		return nil
	})
	return finish(res, done, err)
}

// finish returns a node's result: none on failure, unless the work
// succeeded and only the guard's cleanup failed.
func finish(res *Result, done bool, err error) (*Result, error) {
	if !done {
		return nil, err
	}
	return res, err
}
