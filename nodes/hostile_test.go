package nodes_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/hostile"
	"github.com/vramguard/vramguard/nodes"
	"github.com/vramguard/vramguard/vramguardtest"
	"go.uber.org/goleak"
)

// The hostile-input table of the prompt nodes, on the simulator (the root
// package's own table is the root's hostile_test.go). Every call must return
// fast, never panic, and fail only with an *vramguard.Error of an expected
// kind.

type hostileCase struct {
	name  string
	call  func(ctx context.Context) error
	kinds []vramguard.Kind // accepted kinds; KindUnknown: success accepted
}

var (
	invalidOnly = hostile.InvalidOnly
	successOnly = hostile.SuccessOnly
)

// runHostile runs a case and checks the contract (internal/testkit/hostile).
func runHostile(t *testing.T, ctx context.Context, tc hostileCase) {
	t.Helper()
	hostile.Run(t, ctx, hostile.Case{Name: tc.name, Call: tc.call, Kinds: tc.kinds})
}

func nodeSim(t *testing.T) (*vramguardtest.Server, *vramguard.OllamaClient) {
	t.Helper()
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", Chunks: 4}, {Name: "eye", Chunks: 4, Vision: true}}})
	t.Cleanup(s.Close)
	tr := &http.Transport{}
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), HTTPClient: &http.Client{Transport: tr},
		PollInterval: 5 * time.Millisecond, UnloadTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		tr.CloseIdleConnections()
	})
	return s, c
}

func TestHostileNodeInputs(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	s, c := nodeSim(t)
	guard := vramguard.Guard{Client: c}
	genr := func(g nodes.PromptGenerator, in nodes.GenerateInput) func(context.Context) error {
		return func(ctx context.Context) error { _, err := g.Generate(ctx, in); return err }
	}
	ok := nodes.PromptGenerator{Guard: guard, Model: "tiny", MaxTokens: 4}
	desc := nodes.GenerateInput{Description: "a castle at dawn"}
	withSampling := func(sm nodes.Sampling) nodes.GenerateInput { in := desc; in.Sampling = sm; return in }
	over := strings.Repeat("a", nodes.MaxInputBytes+1)
	refine := func(in nodes.RefineInput) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := (&nodes.PromptRefiner{Guard: guard, Model: "tiny", MaxTokens: 4}).Refine(ctx, in)
			return err
		}
	}
	negative := func(in nodes.NegativeInput) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := (&nodes.NegativePrompt{Guard: guard, Model: "tiny", MaxTokens: 4}).Generate(ctx, in)
			return err
		}
	}
	dual := func(in nodes.DualInput) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := (&nodes.DualStreamRefiner{Guard: guard, Model: "tiny", MaxTokens: 4}).Refine(ctx, in)
			return err
		}
	}
	img := func(n nodes.ImagePrompter, in nodes.ImageInput) func(context.Context) error {
		return func(ctx context.Context) error { _, err := n.Generate(ctx, in); return err }
	}
	eye := nodes.ImagePrompter{Guard: guard, Model: "eye", MaxTokens: 4}
	pngSig := []byte("\x89PNG\r\n\x1a\n")
	withImage := func(in nodes.ImageInput) nodes.ImageInput { in.Image = pngSig; return in }
	tests := []hostileCase{
		// Node settings
		{"no client", genr(nodes.PromptGenerator{Model: "tiny"}, desc), invalidOnly},
		{"no model", genr(nodes.PromptGenerator{Guard: guard}, desc), invalidOnly},
		{"blank model", genr(nodes.PromptGenerator{Guard: guard, Model: " \t"}, desc), invalidOnly},
		{"invalid UTF-8 model", genr(nodes.PromptGenerator{Guard: guard, Model: "\xff"}, desc), invalidOnly},
		{"unknown model", genr(nodes.PromptGenerator{Guard: guard, Model: "nope"}, desc), []vramguard.Kind{vramguard.KindNotFound}},
		{"negative timeout", genr(nodes.PromptGenerator{Guard: guard, Model: "tiny", Timeout: math.MinInt64}, desc), invalidOnly},
		{"negative max tokens", genr(nodes.PromptGenerator{Guard: guard, Model: "tiny", MaxTokens: math.MinInt}, desc), invalidOnly},
		{"1ns timeout", genr(nodes.PromptGenerator{Guard: guard, Model: "tiny", Timeout: 1}, desc), []vramguard.Kind{vramguard.KindTimeout}},

		// Generator input
		{"empty description", genr(ok, nodes.GenerateInput{}), invalidOnly},
		{"whitespace description", genr(ok, nodes.GenerateInput{Description: " \n\t\u3000"}), invalidOnly},
		{"invalid UTF-8 description", genr(ok, nodes.GenerateInput{Description: "a\xc3("}), invalidOnly},
		{"invalid UTF-8 mood", genr(ok, nodes.GenerateInput{Description: "x", Mood: "\xed\xa0\x80"}), invalidOnly},
		{"description over MaxInputBytes", genr(ok, nodes.GenerateInput{Description: over}), invalidOnly},
		{"fields together over MaxInputBytes", genr(ok, nodes.GenerateInput{Description: over[:nodes.MaxInputBytes/2+1], Emphasis: over[:nodes.MaxInputBytes/2+1]}), invalidOnly},
		{"unknown style", genr(ok, nodes.GenerateInput{Description: "x", Style: "nope"}), invalidOnly},
		{"style with controls", genr(ok, nodes.GenerateInput{Description: "x", Style: "\x00\x1b"}), invalidOnly},
		{"template syntax in description", genr(ok, nodes.GenerateInput{Description: "{{.Description}}{{template \"x\"}}"}), successOnly},
		{"NaN temperature", genr(ok, withSampling(nodes.Sampling{Temperature: math.NaN()})), invalidOnly},
		{"+Inf temperature", genr(ok, withSampling(nodes.Sampling{Temperature: math.Inf(1)})), invalidOnly},
		{"-Inf top-p", genr(ok, withSampling(nodes.Sampling{TopP: math.Inf(-1)})), invalidOnly},
		{"negative temperature", genr(ok, withSampling(nodes.Sampling{Temperature: -0.5})), invalidOnly},
		{"temperature above 1", genr(ok, withSampling(nodes.Sampling{Temperature: 1.0000001})), invalidOnly},
		{"smallest positive temperature", genr(ok, withSampling(nodes.Sampling{Temperature: math.SmallestNonzeroFloat64})), successOnly},
		{"negative seed", genr(ok, withSampling(nodes.Sampling{Seed: -1})), invalidOnly},
		{"seed above MaxSeed", genr(ok, withSampling(nodes.Sampling{Seed: nodes.MaxSeed + 1})), invalidOnly},
		{"max seed", genr(ok, withSampling(nodes.Sampling{Seed: nodes.MaxSeed})), successOnly},

		// Refiner, negative, dual
		{"refine empty prompt", refine(nodes.RefineInput{}), invalidOnly},
		{"refine -1 passes", refine(nodes.RefineInput{Prompt: "x", Passes: -1}), invalidOnly},
		{"refine 4 passes", refine(nodes.RefineInput{Prompt: "x", Passes: nodes.MaxPasses + 1}), invalidOnly},
		{"refine max int passes", refine(nodes.RefineInput{Prompt: "x", Passes: math.MaxInt}), invalidOnly},
		{"refine invalid UTF-8 instructions", refine(nodes.RefineInput{Prompt: "x", Instructions: "\xff"}), invalidOnly},
		{"refine NaN top-p", refine(nodes.RefineInput{Prompt: "x", Sampling: nodes.Sampling{TopP: math.NaN()}}), invalidOnly},
		{"refine max seed, 3 passes", refine(nodes.RefineInput{Prompt: "x", Passes: 3, Sampling: nodes.Sampling{Seed: nodes.MaxSeed}}), successOnly},
		{"negative empty prompt", negative(nodes.NegativeInput{Prompt: "\u00a0"}), invalidOnly},
		{"negative unknown style", negative(nodes.NegativeInput{Prompt: "x", Style: "nope"}), invalidOnly},
		{"negative over MaxInputBytes", negative(nodes.NegativeInput{Prompt: over}), invalidOnly},
		{"dual empty description", dual(nodes.DualInput{}), invalidOnly},
		{"dual unknown style", dual(nodes.DualInput{Description: "x", Style: "\xff"}), invalidOnly},
		{"dual +Inf temperature", dual(nodes.DualInput{Description: "x", Sampling: nodes.Sampling{Temperature: math.Inf(1)}}), invalidOnly},

		// Image prompter
		{"image nil", img(eye, nodes.ImageInput{}), invalidOnly},
		{"image one byte", img(eye, nodes.ImageInput{Image: []byte{0x89}}), invalidOnly},
		{"image GIF", img(eye, nodes.ImageInput{Image: []byte("GIF89a\x01\x00\x01\x00\x00\xff")}), invalidOnly},
		{"image NULs", img(eye, nodes.ImageInput{Image: make([]byte, 1<<10)}), invalidOnly},
		{"image text with a PNG name", img(eye, nodes.ImageInput{Image: []byte("fox.png")}), invalidOnly},
		{"image over MaxImageBytes", img(eye, nodes.ImageInput{Image: append(bytes.Clone(pngSig), make([]byte, vramguard.MaxImageBytes)...)}), invalidOnly},
		{"image signature only", img(eye, withImage(nodes.ImageInput{})), successOnly},
		{"image to a text model", img(nodes.ImagePrompter{Guard: guard, Model: "tiny"}, withImage(nodes.ImageInput{})), invalidOnly},
		{"image unknown model", img(nodes.ImagePrompter{Guard: guard, Model: "nope"}, withImage(nodes.ImageInput{})), []vramguard.Kind{vramguard.KindNotFound}},
		{"image no client", img(nodes.ImagePrompter{Model: "eye"}, withImage(nodes.ImageInput{})), invalidOnly},
		{"image invalid UTF-8 hint", img(eye, withImage(nodes.ImageInput{Hint: "\xed\xa0\x80"})), invalidOnly},
		{"image hint over MaxInputBytes", img(eye, withImage(nodes.ImageInput{Hint: over})), invalidOnly},
		{"image template syntax in hint", img(eye, withImage(nodes.ImageInput{Hint: "{{.System}}{{template \"x\"}}"})), successOnly},
		{"image style with controls", img(eye, withImage(nodes.ImageInput{Style: "\x00\x1b"})), invalidOnly},
		{"image NaN top-p", img(eye, withImage(nodes.ImageInput{Sampling: nodes.Sampling{TopP: math.NaN()}})), invalidOnly},
		{"image 1ns timeout", img(nodes.ImagePrompter{Guard: guard, Model: "eye", Timeout: 1}, withImage(nodes.ImageInput{})), []vramguard.Kind{vramguard.KindTimeout}},

		// Catalog and styles
		{"catalog without client", func(ctx context.Context) error { _, err := (&nodes.Catalog{}).Models(ctx); return err }, invalidOnly},
		{"catalog negative TTL", func(ctx context.Context) error {
			_, err := (&nodes.Catalog{Client: c, TTL: math.MinInt64}).Models(ctx)
			return err
		}, invalidOnly},
		{"catalog clock at zero", func(ctx context.Context) error {
			_, err := (&nodes.Catalog{Client: c, Now: func() time.Time { return time.Time{} }}).Models(ctx)
			return err
		}, successOnly},
		{"styles from a failing reader", func(context.Context) error {
			_, err := nodes.LoadStyles(iotest.ErrReader(errors.New("disk on fire")), nodes.FormatYAML)
			return err
		}, invalidOnly},
		{"styles unknown format", func(context.Context) error {
			_, err := nodes.LoadStyles(strings.NewReader("{}"), "toml")
			return err
		}, invalidOnly},
		{"styles garbage JSON", func(context.Context) error {
			_, err := nodes.LoadStyles(strings.NewReader("\x00\xff{]"), nodes.FormatJSON)
			return err
		}, invalidOnly},
		{"styles over the size limit", func(context.Context) error {
			_, err := nodes.LoadStyles(strings.NewReader(strings.Repeat(" ", nodes.MaxStyleFileBytes+1)), nodes.FormatYAML)
			return err
		}, invalidOnly},
		{"styles YAML alias bomb", func(context.Context) error {
			_, err := nodes.LoadStyles(strings.NewReader(yamlBomb), nodes.FormatYAML)
			return err
		}, invalidOnly},
		{"styles recursive template", func(context.Context) error {
			_, err := nodes.BuiltinStyles().With(nodes.Style{Name: "loop",
				Instructions: `{{define "r"}}{{template "r" .}}{{end}}{{.Description}}{{template "r" .}}`})
			return err
		}, invalidOnly},
		{"styles template without description", func(context.Context) error {
			_, err := nodes.BuiltinStyles().With(nodes.Style{Name: "x", Instructions: "static"})
			return err
		}, invalidOnly},
		{"styles blank name", func(context.Context) error {
			_, err := nodes.BuiltinStyles().With(nodes.Style{Name: " ", Instructions: "{{.Description}}"})
			return err
		}, invalidOnly},
		{"render unknown style", func(context.Context) error {
			_, err := nodes.BuiltinStyles().Render("nope", nodes.TemplateData{})
			return err
		}, invalidOnly},
		{"style file missing", func(context.Context) error { _, err := nodes.LoadStylesFile("/nonexistent/s.yaml"); return err },
			[]vramguard.Kind{vramguard.KindNotFound}},
		{"style file bad extension", func(context.Context) error { _, err := nodes.LoadStylesFile("\x00.toml"); return err }, invalidOnly},
		{"clean and parse garbage", func(context.Context) error {
			for _, s := range []string{"", "\xff", "<think>", "</think>" + strings.Repeat("<think>", 1000), "Positive:\nNegative:", strings.Repeat("\"", 1<<16)} {
				nodes.Clean(s, nodes.CleanOptions{})
				nodes.ParseDualStream(s)
			}
			return nil
		}, successOnly},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runHostile(t, t.Context(), tc) })
	}

	// A canceled context: every node returns KindCanceled and loads nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	loads := s.Loads("")
	for name, call := range map[string]func(context.Context) error{
		"generator": genr(ok, desc),
		"refiner":   refine(nodes.RefineInput{Prompt: "x", Passes: 3}),
		"negative":  negative(nodes.NegativeInput{Prompt: "x"}),
		"dual":      dual(nodes.DualInput{Description: "x"}),
		"image":     img(eye, withImage(nodes.ImageInput{})),
		"catalog":   func(ctx context.Context) error { _, err := (&nodes.Catalog{Client: c}).Models(ctx); return err },
	} {
		t.Run("canceled/"+name, func(t *testing.T) {
			runHostile(t, ctx, hostileCase{name, call, []vramguard.Kind{vramguard.KindCanceled}})
		})
	}
	if n := s.Loads("") - loads; n != 0 {
		t.Errorf("canceled calls loaded a model %d times", n)
	}
	if ms := s.Running(); len(ms) != 0 {
		t.Errorf("models left by the hostile calls: %+v", ms)
	}
}

// TestHostileNodeProgressPanics: a Progress callback that panics (the
// caller's bug) reaches the caller as a panic, promptly: the node's guard
// cleans up on the way without waiting for the dead generation, and the
// model is not left resident.
func TestHostileNodeProgressPanics(t *testing.T) {
	s, c := nodeSim(t)
	g := nodes.PromptGenerator{Guard: vramguard.Guard{Client: c}, Model: "tiny",
		Progress: func(nodes.Progress) { panic("progress bar exploded") }}
	start := time.Now()
	func() {
		defer func() {
			if r := recover(); r != "progress bar exploded" {
				t.Errorf("recovered %v, want the callback's panic", r)
			}
		}()
		_, _ = g.Generate(t.Context(), nodes.GenerateInput{Description: "x"})
	}()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the panic reached the caller after %v: the guard's cleanup waited for the dead generation", d)
	}
	if s.Listed("tiny") {
		t.Error("model resident after the panic")
	}
}

// yamlBomb is the "billion laughs" alias expansion.
const yamlBomb = `a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
styles: *i
`
