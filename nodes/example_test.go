package nodes_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/nodes"
	"github.com/vramguard/vramguard/vramguardtest"
)

// scripted returns a simulated model that answers every prompt with text.
func scripted(name, text string) vramguardtest.ModelConfig {
	return vramguardtest.ModelConfig{Name: name, Respond: func(string) []vramguardtest.Chunk {
		var out []vramguardtest.Chunk
		for _, w := range strings.SplitAfter(text, " ") {
			out = append(out, vramguardtest.Chunk{Text: w})
		}
		return out
	}}
}

// client connects to a simulated Ollama server.
func client(s *vramguardtest.Server) *vramguard.OllamaClient {
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	return c
}

func ExamplePromptGenerator_Generate() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		scripted("writer", `<think>hmm</think>**Prompt:** "a lighthouse on a cliff at dusk, sweeping beam, storm clouds"`),
	}})
	defer s.Close()
	c := client(s)
	defer c.Close()

	g := nodes.PromptGenerator{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := g.Generate(context.Background(), nodes.GenerateInput{
		Description: "a lighthouse",
		Style:       "cinematic",
		Mood:        "lonely",
		Sampling:    nodes.Sampling{Seed: 42},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Prompt)
	// The guard unloaded the model before Generate returned.
	fmt.Println("resident:", s.Listed("writer"))
	// Output:
	// a lighthouse on a cliff at dusk, sweeping beam, storm clouds
	// resident: false
}

func ExamplePromptRefiner_Refine() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "writer", Respond: func(prompt string) []vramguardtest.Chunk {
		// Each pass adds a detail to the prompt it was given.
		_, p, _ := strings.Cut(prompt, "\nPrompt: ")
		p, _, _ = strings.Cut(p, "\n")
		return []vramguardtest.Chunk{{Text: "Refined prompt: " + p + ", more detail"}}
	}}}})
	defer s.Close()
	c := client(s)
	defer c.Close()

	r := nodes.PromptRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer",
		Progress: func(p nodes.Progress) {
			if p.Done {
				fmt.Printf("pass %d of %d done\n", p.Pass, p.Passes)
			}
		}}
	res, err := r.Refine(context.Background(), nodes.RefineInput{Prompt: "a castle", Passes: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Prompt)
	fmt.Println("generations:", len(res.Generations))
	// Output:
	// pass 1 of 2 done
	// pass 2 of 2 done
	// a castle, more detail, more detail
	// generations: 2
}

func ExampleNegativePrompt_Generate() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		scripted("writer", "Negative prompt: blurry, lowres, watermark, daylight"),
	}})
	defer s.Close()
	c := client(s)
	defer c.Close()

	n := nodes.NegativePrompt{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := n.Generate(context.Background(), nodes.NegativeInput{Prompt: "a neon alley in the rain", Style: "cyberpunk"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Prompt)
	// Output:
	// blurry, lowres, watermark, daylight
}

func ExampleDualStreamRefiner_Refine() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		scripted("writer", "**Positive:** a castle at dusk, negative space above the towers\n**Negative Prompt:** blurry, lowres"),
	}})
	defer s.Close()
	c := client(s)
	defer c.Close()

	d := nodes.DualStreamRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := d.Refine(context.Background(), nodes.DualInput{Description: "a castle"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("positive:", res.Prompt)
	fmt.Println("negative:", res.Negative)
	// Output:
	// positive: a castle at dusk, negative space above the towers
	// negative: blurry, lowres
}

func ExampleDualStreamRefiner_Refine_schema() {
	// The simulator reports Ollama 0.17.4, which takes a JSON schema as
	// format: the node sends one and reads the JSON object back.
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "writer", RespondTo: func(c vramguardtest.Call) []vramguardtest.Chunk {
		if len(c.Format) == 0 {
			return []vramguardtest.Chunk{{Text: "Positive: a castle at dusk\nNegative: blurry"}}
		}
		return []vramguardtest.Chunk{{Text: `{"positive": "a castle at dusk, torchlight", `}, {Text: `"negative": "blurry, lowres"}`}}
	}}}})
	defer s.Close()
	c := client(s)
	defer c.Close()

	d := nodes.DualStreamRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer"}
	res, err := d.Refine(context.Background(), nodes.DualInput{Description: "a castle"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: %q / %q\n", res.DualFormat, res.Prompt, res.Negative)

	// NoSchema asks for the text format, as for a server older than v0.5.0.
	d.NoSchema = true
	res, err = d.Refine(context.Background(), nodes.DualInput{Description: "a castle"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: %q / %q\n", res.DualFormat, res.Prompt, res.Negative)
	// Output:
	// json: "a castle at dusk, torchlight" / "blurry, lowres"
	// text: "a castle at dusk" / "blurry"
}

func ExampleImagePrompter_Generate() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "llava", Vision: true, RespondTo: func(vramguardtest.Call) []vramguardtest.Chunk {
			// A real vision model would look at the picture.
			return []vramguardtest.Chunk{{Text: `**Prompt:** "a red fox curled up in fresh snow, anime key visual, cel shading, soft bloom"`}}
		}},
		{Name: "llama3.2"}, // a text model
	}})
	defer s.Close()
	c := client(s)
	defer c.Close()

	// A tiny picture; a program would read a file (os.ReadFile).
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, 8, 8))); err != nil {
		fmt.Println(err)
		return
	}
	p := nodes.ImagePrompter{Guard: vramguard.Guard{Client: c}, Model: "llava"}
	res, err := p.Generate(context.Background(), nodes.ImageInput{Image: buf.Bytes(), Hint: "a sketch of a fox", Style: "anime"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Prompt)
	fmt.Println("resident:", s.Listed("llava"))

	// A text model cannot see the picture; nothing is loaded.
	p.Model = "llama3.2"
	_, err = p.Generate(context.Background(), nodes.ImageInput{Image: buf.Bytes()})
	fmt.Println(errors.Is(err, vramguard.ErrNoVision), errors.Is(err, vramguard.KindInvalidInput), s.Loads("llama3.2"))

	// Neither can the library read a GIF.
	_, err = p.Generate(context.Background(), nodes.ImageInput{Image: []byte("GIF89a...")})
	fmt.Println(errors.Is(err, vramguard.ErrImageFormat))
	// Output:
	// a red fox curled up in fresh snow, anime key visual, cel shading, soft bloom
	// resident: false
	// true true 0
	// true
}

func ExampleClean() {
	clean, reasoning := nodes.Clean("<think>The user wants a castle.</think>\n**Enhanced prompt:** “a castle on a hill”", nodes.CleanOptions{})
	fmt.Println(clean)
	fmt.Println(reasoning)
	// Output:
	// a castle on a hill
	// The user wants a castle.
}

func ExampleParseDualStream() {
	pos, neg := nodes.ParseDualStream("## Positive\na castle,\nnegative space above\n\n## Negative\nblurry")
	fmt.Printf("%q\n%q\n", pos, neg)
	// Output:
	// "a castle,\nnegative space above"
	// "blurry"
}

func ExampleLoadStyles() {
	set, err := nodes.LoadStyles(strings.NewReader(`
styles:
  watercolor:
    instructions: "Paint {{.Description}} as a loose {{.Style}} study{{with .Mood}}, {{.}}{{end}}."
    avoid: hard edges
`), nodes.FormatYAML)
	if err != nil {
		fmt.Println(err)
		return
	}
	out, err := set.Render("watercolor", nodes.TemplateData{Description: "a fox", Mood: "calm"})
	fmt.Println(out, err)
	fmt.Println(set.Names())

	_, err = nodes.LoadStyles(strings.NewReader(`{"styles": {"broken": {"instructions": "{{.Description"}}}`), nodes.FormatJSON)
	fmt.Println(err != nil, strings.Contains(err.Error(), `style "broken"`))
	// Output:
	// Paint a fox as a loose watercolor study, calm. <nil>
	// [abstract anime cinematic cyberpunk fantasy photorealistic sci-fi watercolor]
	// true true
}

func ExampleCatalog_Models() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "qwen3:8b"}, {Name: "sd-prompt-writer"}, {Name: "llama3.2"}}})
	defer s.Close()
	c := client(s)
	defer c.Close()

	cat := &nodes.Catalog{Client: c}
	models, err := cat.Models(context.Background())
	fmt.Println(models, err)
	// Output:
	// [sd-prompt-writer:latest llama3.2:latest qwen3:8b] <nil>
}

func ExampleBuiltinStyles() {
	set := nodes.BuiltinStyles()
	fmt.Println(set.Names())
	st, _ := set.Style("cyberpunk")
	fmt.Println(st.Avoid)
	// Output:
	// [abstract anime cinematic cyberpunk fantasy photorealistic sci-fi]
	// daylight, pastoral scenery, clean utopia, medieval, muted colors, low detail
}

func ExampleStyleSet_With() {
	set, err := nodes.BuiltinStyles().With(
		nodes.Style{Name: "Ink", Instructions: "Ink drawing of {{.Description}}{{with .Emphasis}}, focus on {{.}}{{end}}."},
		nodes.Style{Name: "anime", Avoid: "photo, 3d"}, // keeps the built-in instructions
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	out, _ := set.Render("ink", nodes.TemplateData{Description: "a heron", Emphasis: "the beak"})
	fmt.Println(out)
	anime, _ := set.Style("anime")
	fmt.Println(anime.Avoid)

	_, err = set.With(nodes.Style{Name: "lazy", Instructions: "make it pretty"})
	fmt.Println(errors.Is(err, vramguard.KindInvalidInput))
	// Output:
	// Ink drawing of a heron, focus on the beak.
	// photo, 3d
	// true
}

func ExampleLoadStylesFile() {
	dir, err := os.MkdirTemp("", "styles")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "styles.json")
	if err := os.WriteFile(path, []byte(`{"styles": {"ukiyo-e": {"instructions": "A ukiyo-e woodblock print of {{.Description}}."}}}`), 0o644); err != nil {
		fmt.Println(err)
		return
	}
	set, err := nodes.LoadStylesFile(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	out, err := set.Render("ukiyo-e", nodes.TemplateData{Description: "a wave"})
	fmt.Println(out, err)
	// Output:
	// A ukiyo-e woodblock print of a wave. <nil>
}

func ExampleSortModels() {
	models := []string{"qwen3:8b", "llama3.2:latest", "flux-prompt-enhancer:latest"}
	nodes.SortModels(models)
	fmt.Println(models)
	// Output:
	// [flux-prompt-enhancer:latest llama3.2:latest qwen3:8b]
}
