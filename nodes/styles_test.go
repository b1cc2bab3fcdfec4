package nodes

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/vramguard/vramguard"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// golden compares got with testdata/golden/name.txt, or rewrites it with
// -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name+".txt")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (run with -update to accept):\n%s", name, path, got)
	}
}

// goldenData is the input every golden rendering uses.
var goldenData = TemplateData{
	Description: "a lighthouse on a cliff at dusk",
	Emphasis:    "the beam of light",
	Mood:        "lonely",
}

func TestBuiltinStylesGolden(t *testing.T) {
	set := BuiltinStyles()
	want := []string{"abstract", "anime", "cinematic", "cyberpunk", "fantasy", "photorealistic", "sci-fi"}
	if got := set.Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, name := range want {
		t.Run(name, func(t *testing.T) {
			got, err := set.Render(name, goldenData)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, name, got+"\n")
			// Without emphasis and mood their lines disappear.
			plain, err := set.Render(name, TemplateData{Description: goldenData.Description})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(plain, "Emphasize") || strings.Contains(plain, "Mood") || !strings.Contains(plain, goldenData.Description) {
				t.Errorf("plain rendering:\n%s", plain)
			}
		})
	}
}

func TestFixedPromptsGolden(t *testing.T) {
	c, err := BuiltinStyles().lookup("test", "", "cyberpunk")
	if err != nil {
		t.Fatal(err)
	}
	instructions, err := BuiltinStyles().render("test", "", "anime", TemplateData{Description: imageDescription, Emphasis: goldenData.Emphasis, Mood: goldenData.Mood})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		tmpl *template.Template
		data fixedData
	}{
		{"refine", refineTemplate, fixedData{Prompt: "a lighthouse, dusk", Instructions: "more detail on the sky", Pass: 2, Passes: 3}},
		{"refine-single", refineTemplate, fixedData{Prompt: "a lighthouse, dusk", Pass: 1, Passes: 1}},
		{"negative", negativeTemplate, fixedData{Prompt: "a lighthouse, dusk", StyleHint: styleHint(c)}},
		{"dual", dualTemplate, fixedData{Description: goldenData.Description, StyleHint: styleHint(c)}},
		{"dual-json", dualTemplate, fixedData{Description: goldenData.Description, StyleHint: styleHint(c), JSON: true}},
		{"image-system", imageSystemTemplate, fixedData{System: system, Instructions: instructions}},
		{"image-user", imageUserTemplate, fixedData{Hint: "a pencil sketch of my cat"}},
		{"image-user-plain", imageUserTemplate, fixedData{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := renderFixed("test", "", tt.tmpl, tt.data)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tt.name, got+"\n")
		})
	}
}

func TestLoadStyles(t *testing.T) {
	const yamlFile = `
styles:
  Watercolor:
    instructions: |
      Paint {{.Description}} as a loose {{.Style}} study.{{with .Mood}} Mood: {{.}}.{{end}}
    avoid: hard edges, digital look
  anime:
    avoid: photo, 3d
`
	const jsonFile = `{"styles": {
		"watercolor": {"instructions": "Paint {{.Description}} as a loose {{.Style}} study.{{with .Mood}} Mood: {{.}}.{{end}}", "avoid": "hard edges, digital look"},
		"anime": {"avoid": "photo, 3d"}
	}}`
	for _, tt := range []struct {
		name   string
		format Format
		src    string
	}{
		{"yaml", FormatYAML, yamlFile},
		{"json", FormatJSON, jsonFile},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set, err := LoadStyles(strings.NewReader(tt.src), tt.format)
			if err != nil {
				t.Fatal(err)
			}
			if names := set.Names(); len(names) != 8 || !slices.Contains(names, "watercolor") {
				t.Errorf("Names() = %v, want the built-ins and watercolor", names)
			}
			got, err := set.Render("WaterColor ", TemplateData{Description: "a fox", Mood: "calm"})
			if err != nil {
				t.Fatal(err)
			}
			if want := "Paint a fox as a loose watercolor study. Mood: calm."; got != want {
				t.Errorf("Render = %q, want %q", got, want)
			}
			// The override changed anime's avoid list and kept its template.
			anime, _ := set.Style("anime")
			builtin, _ := BuiltinStyles().Style("anime")
			if anime.Avoid != "photo, 3d" || anime.Instructions != builtin.Instructions {
				t.Errorf("anime override: %+v", anime)
			}
		})
	}
}

func TestLoadStylesFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "styles.yml")
	if err := os.WriteFile(path, []byte("styles:\n  ink:\n    instructions: \"Ink drawing of {{.Description}}\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := LoadStylesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := set.Render("ink", TemplateData{Description: "a fox"}); err != nil || got != "Ink drawing of a fox" {
		t.Errorf("Render = %q, %v", got, err)
	}
	if _, err := LoadStylesFile(filepath.Join(dir, "missing.json")); !errors.Is(err, vramguard.KindNotFound) {
		t.Errorf("missing file: %v, want not found", err)
	}
	if _, err := LoadStylesFile(filepath.Join(dir, "styles.toml")); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("unknown extension: %v, want invalid input", err)
	}
}

func TestLoadStylesErrors(t *testing.T) {
	tests := []struct {
		name   string
		format Format
		src    string
		want   string // in the message
	}{
		{"template does not parse", FormatYAML, "styles:\n  broken:\n    instructions: \"{{.Description\"\n", `style "broken"`},
		{"template does not execute", FormatYAML, "styles:\n  bad:\n    instructions: \"{{.Description}} {{.Nope}}\"\n", `style "bad"`},
		{"template fails on index", FormatYAML, "styles:\n  idx:\n    instructions: \"{{.Description}} {{index .Mood 3}}\"\n", `style "idx"`},
		{"template ignores the description", FormatYAML, "styles:\n  lazy:\n    instructions: \"Make it pretty\"\n", `style "lazy": template does not use`},
		{"new style without instructions", FormatYAML, "styles:\n  empty:\n    avoid: x\n", `style "empty" has no instructions`},
		{"names differing in case", FormatYAML, "styles:\n  Ink:\n    instructions: \"{{.Description}}\"\n  ink:\n    instructions: \"{{.Description}}\"\n", `"ink" is given twice`},
		{"unknown field", FormatYAML, "styles:\n  ink:\n    instruction: \"{{.Description}}\"\n", "instruction"},
		{"unknown field json", FormatJSON, `{"styles": {"ink": {"template": "x"}}}`, "template"},
		{"malformed json", FormatJSON, `{"styles": `, "json"},
		{"trailing json", FormatJSON, `{"styles": {}} {}`, "after the JSON"},
		{"malformed yaml", FormatYAML, "styles: [", "yaml"},
		{"empty file", FormatYAML, "", "empty"},
		{"unknown format", "toml", "styles = {}", "unknown style file format"},
		{"empty name", FormatJSON, `{"styles": {" ": {"instructions": "{{.Description}}"}}}`, "style name is empty"},
		{"too large", FormatYAML, strings.Repeat("#", MaxStyleFileBytes+1), "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadStyles(strings.NewReader(tt.src), tt.format)
			if !errors.Is(err, vramguard.KindInvalidInput) {
				t.Fatalf("got %v, want invalid input", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	set := BuiltinStyles()
	_, err := set.Render("vaporwave", goldenData)
	if !errors.Is(err, vramguard.KindInvalidInput) {
		t.Fatalf("unknown style: %v", err)
	}
	want := "valid styles: abstract, anime, cinematic, cyberpunk, fantasy, photorealistic, sci-fi"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not list the styles (%s)", err, want)
	}
	// A template that passes the load-time trial can still fail on real
	// data; the error names the style.
	set, err = set.With(Style{Name: "third", Instructions: "{{.Description}}{{if .Mood}} {{slice .Mood 2}}{{end}}"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = set.Render("third", TemplateData{Description: "x", Mood: "a"})
	if !errors.Is(err, vramguard.KindInvalidInput) || !strings.Contains(err.Error(), `style "third"`) {
		t.Errorf("failing template: %v", err)
	}
	// nil and the zero value hold the built-ins.
	var none *StyleSet
	if len(none.Names()) != 7 || len((&StyleSet{}).Names()) != 7 {
		t.Error("nil or zero StyleSet is not the built-ins")
	}
}
