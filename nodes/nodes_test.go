package nodes

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

const castleReply = "<think>hmm</think>**Prompt:** \"a castle\""

func TestPromptGenerator(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: reply(words(castleReply)...)})
	rec := &recorder{}
	c := newClient(t, s, rec)
	g := PromptGenerator{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := g.Generate(t.Context(), GenerateInput{
		Description: "a castle",
		Style:       " Fantasy ",
		Emphasis:    "the towers",
		Mood:        "serene",
		Sampling:    Sampling{Temperature: 0.5, TopP: 0.8, Seed: 7},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "a castle" || res.Reasoning != "" || res.Negative != "" || res.Model != "writer" || len(res.Generations) != 1 {
		t.Errorf("result %+v", res)
	}
	if res.Generations[0].Text != castleReply {
		t.Errorf("raw text %q", res.Generations[0].Text)
	}
	// The default guard unloads, verified, before Generate returns.
	if s.Listed("writer") {
		t.Error("model resident after Generate with the default guard")
	}
	reqs := rec.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d generate requests", len(reqs))
	}
	r := reqs[0]
	if r.Think == nil || r.Think.Bool() {
		t.Errorf("think %v, want false without IncludeReasoning", r.Think)
	}
	if r.Options["temperature"] != 0.5 || r.Options["top_p"] != 0.8 || r.Options["seed"] != float64(7) {
		t.Errorf("options %v", r.Options)
	}
	if _, ok := r.Options["num_predict"]; ok {
		t.Errorf("num_predict sent without MaxTokens: %v", r.Options)
	}
	for _, want := range []string{"fantasy style", "Description: a castle", "Emphasize: the towers", "Mood: serene"} {
		if !strings.Contains(r.Prompt, want) {
			t.Errorf("prompt lacks %q:\n%s", want, r.Prompt)
		}
	}
	if r.System == "" || r.KeepAlive == nil || r.KeepAlive.Duration != 0 {
		t.Errorf("system %q, keep-alive %v", r.System, r.KeepAlive)
	}
}

func TestPromptGeneratorDefaults(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: reply("a castle")})
	rec := &recorder{}
	c := newClient(t, s, rec)
	g := PromptGenerator{Guard: vramguard.Guard{Client: c}, Model: "writer", MaxTokens: 50, Timeout: time.Minute}
	if _, err := g.Generate(t.Context(), GenerateInput{Description: "a castle"}); err != nil {
		t.Fatal(err)
	}
	r := rec.requests()[0]
	if r.Options["temperature"] != DefaultTemperature || r.Options["top_p"] != DefaultTopP ||
		r.Options["seed"] != float64(0) || r.Options["num_predict"] != float64(50) {
		t.Errorf("options %v", r.Options)
	}
	if !strings.Contains(r.Prompt, "in the "+DefaultStyle+" style") {
		t.Errorf("prompt does not use the default style:\n%s", r.Prompt)
	}
}

func TestIncludeReasoning(t *testing.T) {
	thinking := vramguardtest.ModelConfig{Name: "thinker", Thinking: true, Respond: func(string) []vramguardtest.Chunk {
		return []vramguardtest.Chunk{{Thinking: "the user "}, {Thinking: "wants a castle"}, {Text: "<think>inline</think>"}, {Text: "a castle"}}
	}}
	s := newSim(t, thinking)
	rec := &recorder{}
	c := newClient(t, s, rec)
	g := PromptGenerator{Guard: vramguard.Guard{Client: c}, Model: "thinker"}

	res, err := g.Generate(t.Context(), GenerateInput{Description: "a castle", IncludeReasoning: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "a castle" || res.Reasoning != "the user wants a castle\n\ninline" {
		t.Errorf("with reasoning: prompt %q, reasoning %q", res.Prompt, res.Reasoning)
	}
	res, err = g.Generate(t.Context(), GenerateInput{Description: "a castle"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "a castle" || res.Reasoning != "" || res.Generations[0].Thinking != "" {
		t.Errorf("without reasoning: prompt %q, reasoning %q, thinking %q", res.Prompt, res.Reasoning, res.Generations[0].Thinking)
	}
	reqs := rec.requests()
	if reqs[0].Think != nil || reqs[1].Think == nil || reqs[1].Think.Bool() {
		t.Errorf("think values %v, %v; want unset, then false", reqs[0].Think, reqs[1].Think)
	}
}

func TestKeepLoaded(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Vision: true, Respond: reply("a castle")})
	c := newClient(t, s, nil)
	nodes := []struct {
		name string
		run  func(vramguard.Guard) error
	}{
		{"generator", func(g vramguard.Guard) error {
			_, err := (&PromptGenerator{Guard: g, Model: "writer"}).Generate(t.Context(), GenerateInput{Description: "x"})
			return err
		}},
		{"refiner", func(g vramguard.Guard) error {
			_, err := (&PromptRefiner{Guard: g, Model: "writer"}).Refine(t.Context(), RefineInput{Prompt: "x", Passes: 2})
			return err
		}},
		{"negative", func(g vramguard.Guard) error {
			_, err := (&NegativePrompt{Guard: g, Model: "writer"}).Generate(t.Context(), NegativeInput{Prompt: "x"})
			return err
		}},
		{"dual", func(g vramguard.Guard) error {
			_, err := (&DualStreamRefiner{Guard: g, Model: "writer"}).Refine(t.Context(), DualInput{Description: "x"})
			return err
		}},
		{"image", func(g vramguard.Guard) error {
			_, err := (&ImagePrompter{Guard: g, Model: "writer"}).Generate(t.Context(), ImageInput{Image: testImage(t, "png")})
			return err
		}},
	}
	for _, n := range nodes {
		t.Run(n.name, func(t *testing.T) {
			if err := n.run(vramguard.Guard{Client: c, KeepLoaded: true}); err != nil {
				t.Fatal(err)
			}
			if !s.Listed("writer") {
				t.Fatal("KeepLoaded: model not resident")
			}
			if err := n.run(vramguard.Guard{Client: c}); err != nil {
				t.Fatal(err)
			}
			if s.Listed("writer") {
				t.Fatal("default guard: model resident")
			}
		})
	}
}

func TestPromptRefinerPasses(t *testing.T) {
	var mu sync.Mutex
	var prompts []string
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: func(prompt string) []vramguardtest.Chunk {
		mu.Lock()
		defer mu.Unlock()
		prompts = append(prompts, prompt)
		switch {
		case strings.Contains(prompt, "pass 1 of 3"):
			return textChunks("Refined prompt: ", "a castle, towers")
		case strings.Contains(prompt, "pass 2 of 3"):
			// Nothing left once cleaned: the pass keeps the previous text.
			return textChunks("<think>no idea</think>", "\"\"")
		default:
			return textChunks("a castle, towers, ", "moonlight")
		}
	}})
	rec := &recorder{}
	c := newClient(t, s, rec)
	r := PromptRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := r.Refine(t.Context(), RefineInput{Prompt: "a castle", Passes: 3, Sampling: Sampling{Seed: 100}, IncludeReasoning: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "a castle, towers, moonlight" || res.Reasoning != "no idea" || len(res.Generations) != 3 {
		t.Errorf("result %+v", res)
	}
	// Each pass refines the previous pass's text; pass 3 got pass 1's.
	if len(prompts) != 3 || !strings.Contains(prompts[0], "Prompt: a castle\n") ||
		!strings.Contains(prompts[1], "Prompt: a castle, towers\n") || !strings.Contains(prompts[2], "Prompt: a castle, towers\n") {
		t.Errorf("prompts:\n%s", strings.Join(prompts, "\n---\n"))
	}
	// Per-pass seeds, as the server received them.
	reqs := rec.requests()
	var seeds []float64
	for _, q := range reqs {
		seeds = append(seeds, q.Options["seed"].(float64))
	}
	if len(seeds) != 3 || seeds[0] != 100 || seeds[1] != 101 || seeds[2] != 102 {
		t.Errorf("seeds %v, want 100 101 102", seeds)
	}
	// The default guard: every pass sent keep-alive 0, and nothing is left.
	for i, q := range reqs {
		if q.KeepAlive == nil || q.KeepAlive.Duration != 0 {
			t.Errorf("pass %d keep-alive %v", i+1, q.KeepAlive)
		}
	}
	if s.Listed("writer") {
		t.Error("model resident after Refine")
	}
}

func TestPromptRefinerInPhase(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: reply("a castle, towers")})
	c := newClient(t, s, nil)
	phase, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := PromptRefiner{Guard: phase.Guard(), Model: "writer"}
	if _, err := r.Refine(t.Context(), RefineInput{Prompt: "a castle", Passes: 3}); err != nil {
		t.Fatal(err)
	}
	if !s.Listed("writer") || s.Loads("writer") != 1 {
		t.Errorf("in a phase: listed %v, loads %d; want one warm load", s.Listed("writer"), s.Loads("writer"))
	}
	if _, err := phase.End(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s.Listed("writer") {
		t.Error("model resident after the phase ended")
	}
}

func TestNegativePrompt(t *testing.T) {
	var got string
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: func(p string) []vramguardtest.Chunk {
		got = p
		return textChunks("**Negative prompt:** ", "blurry, lowres, daylight")
	}})
	c := newClient(t, s, nil)
	n := NegativePrompt{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := n.Generate(t.Context(), NegativeInput{Prompt: "a neon alley", Style: "cyberpunk"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "blurry, lowres, daylight" || res.Negative != "" {
		t.Errorf("result %+v", res)
	}
	if !strings.Contains(got, "Prompt: a neon alley") || !strings.Contains(got, "cyberpunk style; for this style also avoid: daylight") {
		t.Errorf("request:\n%s", got)
	}
	if s.Listed("writer") {
		t.Error("model resident after Generate")
	}
}

func TestDualStreamRefiner(t *testing.T) {
	const out = "<think>two prompts</think>\n**Positive:** a castle,\nnegative space above\n**Negative Prompt:** blurry, lowres"
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: reply(words(out)...)})
	c := newClient(t, s, nil)
	d := DualStreamRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := d.Refine(t.Context(), DualInput{Description: "a castle", Style: "fantasy", IncludeReasoning: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "a castle,\nnegative space above" || res.Negative != "blurry, lowres" || res.Reasoning != "two prompts" {
		t.Errorf("result %+v", res)
	}
	if s.Listed("writer") {
		t.Error("model resident after Refine")
	}
}

func TestProgress(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: reply(words("a castle on a hill at dusk")...)})
	c := newClient(t, s, nil)
	for _, maxTokens := range []int{0, 4} {
		var ps []Progress
		r := PromptRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer", MaxTokens: maxTokens,
			Progress: func(p Progress) { ps = append(ps, p) }}
		if _, err := r.Refine(t.Context(), RefineInput{Prompt: "a castle", Passes: 2}); err != nil {
			t.Fatal(err)
		}
		perPass := 7 // words
		if maxTokens > 0 {
			perPass = maxTokens
		}
		// One call per chunk plus the done line, per pass.
		if len(ps) != 2*(perPass+1) {
			t.Fatalf("max tokens %d: %d progress calls: %+v", maxTokens, len(ps), ps)
		}
		for i, p := range ps {
			if p.Passes != 2 || p.Pass != 1+i/(perPass+1) {
				t.Errorf("call %d: pass %d of %d", i, p.Pass, p.Passes)
			}
			if i > 0 && (p.Tokens < ps[i-1].Tokens || (!p.Done && p.Tokens != ps[i-1].Tokens+1)) {
				t.Errorf("call %d: tokens %d after %d", i, p.Tokens, ps[i-1].Tokens)
			}
			if maxTokens == 0 && p.Fraction != -1 {
				t.Errorf("call %d: fraction %v without MaxTokens", i, p.Fraction)
			}
			if maxTokens > 0 && i > 0 && p.Fraction < ps[i-1].Fraction {
				t.Errorf("call %d: fraction %v after %v", i, p.Fraction, ps[i-1].Fraction)
			}
		}
		last := ps[len(ps)-1]
		if !last.Done || last.Tokens != 2*perPass || (maxTokens > 0 && last.Fraction != 1) {
			t.Errorf("last progress %+v", last)
		}
		if maxTokens > 0 && ps[0].Fraction != 1.0/8 { // 1 of 4 tokens in pass 1 of 2
			t.Errorf("first fraction %v, want 1/8", ps[0].Fraction)
		}
	}
}

func TestNodeFaults(t *testing.T) {
	tests := []struct {
		name    string
		fault   vramguardtest.Fault
		timeout time.Duration
		kind    vramguard.Kind
		cause   error
	}{
		{"crash mid-stream", vramguardtest.CrashAfter(2), 0, vramguard.KindModelCrash, nil},
		{"crash at load", vramguardtest.LoadCrash(), 0, vramguard.KindModelCrash, nil},
		{"out of memory", vramguardtest.OOM(), 0, vramguard.KindOutOfMemory, nil},
		{"stream cut", vramguardtest.CloseAfter(2), 0, vramguard.KindTransient, vramguard.ErrIncompleteStream},
		{"node timeout", vramguardtest.StallAfter(1, 5*time.Second), 150 * time.Millisecond, vramguard.KindTimeout, vramguard.ErrTotalTimeout},
	}
	for _, tt := range tests {
		for _, node := range []string{"generator", "refiner", "negative", "dual", "image"} {
			t.Run(tt.name+"/"+node, func(t *testing.T) {
				s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Vision: true, Respond: reply(words("Positive: a castle on a hill\nNegative: blurry")...)})
				c := newClient(t, s, nil)
				if err := s.FailNext("writer", tt.fault); err != nil {
					t.Fatal(err)
				}
				g := vramguard.Guard{Client: c}
				var res *Result
				var err error
				switch node {
				case "generator":
					res, err = (&PromptGenerator{Guard: g, Model: "writer", Timeout: tt.timeout}).Generate(t.Context(), GenerateInput{Description: "a castle"})
				case "refiner":
					res, err = (&PromptRefiner{Guard: g, Model: "writer", Timeout: tt.timeout}).Refine(t.Context(), RefineInput{Prompt: "a castle", Passes: 2})
				case "negative":
					res, err = (&NegativePrompt{Guard: g, Model: "writer", Timeout: tt.timeout}).Generate(t.Context(), NegativeInput{Prompt: "a castle"})
				case "dual":
					res, err = (&DualStreamRefiner{Guard: g, Model: "writer", Timeout: tt.timeout}).Refine(t.Context(), DualInput{Description: "a castle"})
				case "image":
					res, err = (&ImagePrompter{Guard: g, Model: "writer", Timeout: tt.timeout}).Generate(t.Context(), ImageInput{Image: testImage(t, "png")})
				}
				if res != nil {
					t.Errorf("got a result %+v with error %v", res, err)
				}
				if !errors.Is(err, tt.kind) {
					t.Fatalf("error %v: kind %v, want %v", err, vramguard.KindOf(err), tt.kind)
				}
				if tt.cause != nil && !errors.Is(err, tt.cause) {
					t.Errorf("error %v does not wrap %v", err, tt.cause)
				}
				eventually(t, s, "model gone", func() bool { return !s.Listed("writer") })
			})
		}
	}
}

func TestEmptyOutput(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Vision: true, Respond: reply("<think>", "I cannot decide", "</think>", " \"\" ")})
	c := newClient(t, s, nil)
	g := vramguard.Guard{Client: c}
	_, err1 := (&PromptGenerator{Guard: g, Model: "writer"}).Generate(t.Context(), GenerateInput{Description: "a castle"})
	_, err2 := (&NegativePrompt{Guard: g, Model: "writer"}).Generate(t.Context(), NegativeInput{Prompt: "a castle"})
	_, err3 := (&DualStreamRefiner{Guard: g, Model: "writer"}).Refine(t.Context(), DualInput{Description: "a castle"})
	_, err4 := (&ImagePrompter{Guard: g, Model: "writer"}).Generate(t.Context(), ImageInput{Image: testImage(t, "png")})
	for i, err := range []error{err1, err2, err3, err4} {
		if !errors.Is(err, vramguard.KindServer) || !errors.Is(err, ErrEmptyOutput) {
			t.Errorf("node %d: %v, want a server error wrapping ErrEmptyOutput", i+1, err)
		}
	}
	// The refiner keeps the input instead.
	res, err := (&PromptRefiner{Guard: g, Model: "writer"}).Refine(t.Context(), RefineInput{Prompt: " a castle "})
	if err != nil || res.Prompt != "a castle" {
		t.Errorf("refiner: %+v, %v", res, err)
	}
	if s.Listed("writer") {
		t.Error("model resident")
	}
}

func TestCanceled(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", TokenLatency: 5 * time.Millisecond, Respond: reply(words(strings.Repeat("word ", 100))...)})
	c := newClient(t, s, nil)
	ctx, cancel := context.WithCancel(t.Context())
	g := PromptGenerator{Guard: vramguard.Guard{Client: c}, Model: "writer", Progress: func(p Progress) {
		if p.Tokens == 3 {
			cancel()
		}
	}}
	res, err := g.Generate(ctx, GenerateInput{Description: "a castle"})
	if res != nil || !errors.Is(err, vramguard.KindCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %+v, %v; want a canceled error", res, err)
	}
	if s.Listed("writer") {
		t.Error("model resident after a canceled call")
	}
}

func TestInvalidInput(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: reply("a castle")})
	c := newClient(t, s, nil)
	g := vramguard.Guard{Client: c}
	ok := GenerateInput{Description: "a castle"}
	gen := func(mod func(*PromptGenerator, *GenerateInput)) func() error {
		return func() error {
			n, in := PromptGenerator{Guard: g, Model: "writer"}, ok
			mod(&n, &in)
			_, err := n.Generate(t.Context(), in)
			return err
		}
	}
	refine := func(mod func(*RefineInput)) func() error {
		return func() error {
			in := RefineInput{Prompt: "a castle"}
			mod(&in)
			_, err := (&PromptRefiner{Guard: g, Model: "writer"}).Refine(t.Context(), in)
			return err
		}
	}
	tests := []struct {
		name string
		run  func() error
		want string // in the message
	}{
		{"no model", gen(func(n *PromptGenerator, _ *GenerateInput) { n.Model = "" }), "no model"},
		{"blank model", gen(func(n *PromptGenerator, _ *GenerateInput) { n.Model = "  " }), "no model"},
		{"no client", gen(func(n *PromptGenerator, _ *GenerateInput) { n.Client = nil }), "no client"},
		{"negative timeout", gen(func(n *PromptGenerator, _ *GenerateInput) { n.Timeout = -time.Second }), "timeout"},
		{"negative max tokens", gen(func(n *PromptGenerator, _ *GenerateInput) { n.MaxTokens = -1 }), "max tokens"},
		{"empty description", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Description = "" }), "description is empty"},
		{"blank description", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Description = " \n\t" }), "description is empty"},
		{"invalid UTF-8 description", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Description = "a \xff castle" }), "UTF-8"},
		{"invalid UTF-8 mood", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Mood = "\xc3" }), "mood is not valid UTF-8"},
		{"huge description", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Description = strings.Repeat("a", MaxInputBytes+1) }), "exceeds"},
		{"huge input", gen(func(_ *PromptGenerator, in *GenerateInput) {
			in.Description, in.Mood = strings.Repeat("a", MaxInputBytes/2+1), strings.Repeat("a", MaxInputBytes/2)
		}), "input of"},
		{"unknown style", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Style = "vaporwave" }),
			`unknown style "vaporwave"; valid styles: abstract, anime, cinematic, cyberpunk, fantasy, photorealistic, sci-fi`},
		{"temperature NaN", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Temperature = math.NaN() }), "temperature"},
		{"temperature +Inf", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Temperature = math.Inf(1) }), "temperature"},
		{"temperature -Inf", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Temperature = math.Inf(-1) }), "temperature"},
		{"temperature above 1", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Temperature = 1.01 }), "temperature"},
		{"temperature negative", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Temperature = -0.1 }), "temperature"},
		{"top-p NaN", gen(func(_ *PromptGenerator, in *GenerateInput) { in.TopP = math.NaN() }), "top-p"},
		{"top-p above 1", gen(func(_ *PromptGenerator, in *GenerateInput) { in.TopP = 2 }), "top-p"},
		{"top-p negative", gen(func(_ *PromptGenerator, in *GenerateInput) { in.TopP = -1 }), "top-p"},
		{"seed negative", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Seed = -1 }), "seed"},
		{"seed too large", gen(func(_ *PromptGenerator, in *GenerateInput) { in.Seed = MaxSeed + 1 }), "seed"},
		{"passes 4", refine(func(in *RefineInput) { in.Passes = 4 }), "4 passes"},
		{"passes negative", refine(func(in *RefineInput) { in.Passes = -1 }), "-1 passes"},
		{"refine empty prompt", refine(func(in *RefineInput) { in.Prompt = "" }), "prompt is empty"},
		{"refine invalid UTF-8 instructions", refine(func(in *RefineInput) { in.Instructions = "\xff" }), "instructions"},
		{"negative empty prompt", func() error {
			_, err := (&NegativePrompt{Guard: g, Model: "writer"}).Generate(t.Context(), NegativeInput{})
			return err
		}, "prompt is empty"},
		{"negative unknown style", func() error {
			_, err := (&NegativePrompt{Guard: g, Model: "writer"}).Generate(t.Context(), NegativeInput{Prompt: "x", Style: "x"})
			return err
		}, "valid styles"},
		{"dual empty description", func() error {
			_, err := (&DualStreamRefiner{Guard: g, Model: "writer"}).Refine(t.Context(), DualInput{})
			return err
		}, "description is empty"},
		{"dual temperature", func() error {
			_, err := (&DualStreamRefiner{Guard: g, Model: "writer"}).Refine(t.Context(), DualInput{Description: "x", Sampling: Sampling{Temperature: 3}})
			return err
		}, "temperature"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run()
			if !errors.Is(err, vramguard.KindInvalidInput) {
				t.Fatalf("got %v, want invalid input", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
	if n := s.Requests("writer"); n != 0 {
		t.Errorf("invalid input reached the server: %d requests", n)
	}
	// The limits themselves are valid.
	for _, in := range []GenerateInput{
		{Description: "x", Sampling: Sampling{Temperature: 1, TopP: 1, Seed: MaxSeed}},
		{Description: "x", Sampling: Sampling{Temperature: math.SmallestNonzeroFloat64, TopP: 0.01}},
	} {
		if _, err := (&PromptGenerator{Guard: g, Model: "writer"}).Generate(t.Context(), in); err != nil {
			t.Errorf("%+v: %v", in.Sampling, err)
		}
	}
}
