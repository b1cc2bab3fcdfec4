package nodes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/vramguard/vramguard"
)

// Limits on style definitions.
const (
	MaxStyleFileBytes = 1 << 20
	maxTemplateBytes  = 64 << 10
	maxStyleName      = 64
)

// Style is a prompt style preset.
type Style struct {
	// Name identifies the style; names are matched without regard to case
	// and surrounding space, and stored in lower case.
	Name string
	// Instructions is a text/template executed with TemplateData; its
	// output is the request PromptGenerator sends to the model, so it must
	// use {{.Description}}.
	Instructions string
	// Avoid lists, comma-separated, what a negative prompt for this style
	// should name; NegativePrompt and DualStreamRefiner use it.
	Avoid string
}

// TemplateData is what a style's Instructions template can use.
type TemplateData struct {
	Description string // the user's description, as given
	Emphasis    string // what to emphasize; may be empty
	Mood        string // the mood; may be empty
	Style       string // the style's name
}

// Format is the syntax of a style file.
type Format string

// The style file formats.
const (
	FormatYAML Format = "yaml"
	FormatJSON Format = "json"
)

// StyleSet is an immutable set of styles with parsed templates. It is safe
// for concurrent use. A nil *StyleSet, like the zero value, holds the
// built-in styles.
type StyleSet struct {
	styles map[string]*compiled
}

type compiled struct {
	Style
	tmpl *template.Template
}

// BuiltinStyles returns the built-in styles: cinematic, anime,
// photorealistic, fantasy, abstract, cyberpunk and sci-fi.
func BuiltinStyles() *StyleSet {
	s := &StyleSet{styles: make(map[string]*compiled)}
	for _, b := range builtins() {
		c, err := compile("builtin styles", b.style())
		if err != nil {
			panic("nodes: built-in style: " + err.Error())
		}
		s.styles[c.Name] = c
	}
	return s
}

func (s *StyleSet) get() *StyleSet {
	if s == nil || s.styles == nil {
		return BuiltinStyles()
	}
	return s
}

// Names returns the style names, sorted.
func (s *StyleSet) Names() []string {
	s = s.get()
	names := make([]string, 0, len(s.styles))
	for n := range s.styles {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Style returns the named style.
func (s *StyleSet) Style(name string) (Style, bool) {
	c, ok := s.get().styles[styleKey(name)]
	if !ok {
		return Style{}, false
	}
	return c.Style, true
}

// With returns a new set: s plus styles. A style named like one in s
// overrides it field by field (an empty Instructions or Avoid keeps s's);
// a new style needs Instructions. Templates are parsed and tried here, so
// a template that fails to parse or to execute, or that ignores
// {{.Description}}, is a KindInvalidInput error naming the style.
func (s *StyleSet) With(styles ...Style) (*StyleSet, error) {
	return s.get().with("style set", styles)
}

func (s *StyleSet) with(op string, styles []Style) (*StyleSet, error) {
	out := &StyleSet{styles: make(map[string]*compiled, len(s.styles)+len(styles))}
	for k, c := range s.styles {
		out.styles[k] = c
	}
	seen := make(map[string]bool, len(styles))
	for _, st := range styles {
		key := styleKey(st.Name)
		if err := validStyleName(op, st.Name); err != nil {
			return nil, err
		}
		if seen[key] {
			return nil, invalid(op, "", "style %q is given twice", key)
		}
		seen[key] = true
		merged := Style{Name: key, Instructions: st.Instructions, Avoid: st.Avoid}
		if base, ok := s.styles[key]; ok {
			if strings.TrimSpace(merged.Instructions) == "" {
				merged.Instructions = base.Instructions
			}
			if strings.TrimSpace(merged.Avoid) == "" {
				merged.Avoid = base.Avoid
			}
		}
		c, err := compile(op, merged)
		if err != nil {
			return nil, err
		}
		out.styles[key] = c
	}
	return out, nil
}

// Render executes the named style's template with data. An unknown style
// is a KindInvalidInput error listing the valid names; so is a template
// that fails or renders nothing.
func (s *StyleSet) Render(name string, data TemplateData) (string, error) {
	return s.get().render("render style", "", name, data)
}

func (s *StyleSet) lookup(op, model, name string) (*compiled, error) {
	s = s.get()
	c, ok := s.styles[styleKey(name)]
	if !ok {
		return nil, invalid(op, model, "unknown style %q; valid styles: %s", name, strings.Join(s.Names(), ", "))
	}
	return c, nil
}

func (s *StyleSet) render(op, model, name string, data TemplateData) (string, error) {
	c, err := s.lookup(op, model, name)
	if err != nil {
		return "", err
	}
	data.Style = c.Name
	out, err := c.execute(data)
	if err != nil {
		return "", invalid(op, model, "style %q: %v", c.Name, err)
	}
	return out, nil
}

func (c *compiled) execute(data TemplateData) (string, error) {
	var b strings.Builder
	if err := c.tmpl.Execute(&b, data); err != nil {
		return "", err
	}
	out := strings.TrimSpace(b.String())
	if out == "" {
		return "", errors.New("template renders nothing")
	}
	return out, nil
}

func styleKey(name string) string { return strings.ToLower(strings.TrimSpace(name)) }

func validStyleName(op, name string) error {
	key := styleKey(name)
	switch {
	case key == "":
		return invalid(op, "", "style name is empty")
	case !utf8.ValidString(key):
		return invalid(op, "", "style name %q is not valid UTF-8", name)
	case len(key) > maxStyleName:
		return invalid(op, "", "style name %q is longer than %d bytes", name, maxStyleName)
	case strings.ContainsFunc(key, unicode.IsControl):
		return invalid(op, "", "style name %q contains control characters", name)
	}
	return nil
}

// compile parses st's template and tries it, so that a broken style fails
// when it is loaded rather than in the middle of a pipeline.
func compile(op string, st Style) (*compiled, error) {
	switch {
	case strings.TrimSpace(st.Instructions) == "":
		return nil, invalid(op, "", "style %q has no instructions", st.Name)
	case len(st.Instructions) > maxTemplateBytes || len(st.Avoid) > maxTemplateBytes:
		return nil, invalid(op, "", "style %q is longer than %d bytes", st.Name, maxTemplateBytes)
	case !utf8.ValidString(st.Instructions) || !utf8.ValidString(st.Avoid):
		return nil, invalid(op, "", "style %q is not valid UTF-8", st.Name)
	}
	t, err := template.New(st.Name).Option("missingkey=error").Parse(st.Instructions)
	if err != nil {
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("style %q: %w", st.Name, err)}
	}
	c := &compiled{Style: st, tmpl: t}
	const marker = "description-7c1e9b42"
	for _, d := range []TemplateData{
		{Description: marker, Emphasis: "emphasis", Mood: "mood", Style: st.Name},
		{Description: marker, Style: st.Name},
	} {
		out, err := c.execute(d)
		if err != nil {
			return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("style %q: %w", st.Name, err)}
		}
		if !strings.Contains(out, marker) {
			return nil, invalid(op, "", "style %q: template does not use {{.Description}}", st.Name)
		}
	}
	return c, nil
}

// styleFile is the schema of a style file:
//
//	styles:
//	  watercolor:
//	    instructions: |
//	      Paint {{.Description}} in loose watercolor ...
//	    avoid: hard edges, digital look
type styleFile struct {
	Styles map[string]struct {
		Instructions string `yaml:"instructions" json:"instructions"`
		Avoid        string `yaml:"avoid" json:"avoid"`
	} `yaml:"styles" json:"styles"`
}

// LoadStyles reads styles from r (at most MaxStyleFileBytes) in the given
// format and returns the built-in styles merged with them, as by
// StyleSet.With. Unknown fields, a malformed file or a broken template are
// KindInvalidInput errors; a read failure keeps its cause.
func LoadStyles(r io.Reader, format Format) (*StyleSet, error) {
	const op = "load styles"
	b, err := io.ReadAll(io.LimitReader(r, MaxStyleFileBytes+1))
	if err != nil {
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: err}
	}
	if len(b) > MaxStyleFileBytes {
		return nil, invalid(op, "", "style file is larger than %d bytes", MaxStyleFileBytes)
	}
	var f styleFile
	switch format {
	case FormatJSON:
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		err = dec.Decode(&f)
		if err == nil && dec.More() {
			err = errors.New("data after the JSON object")
		}
	case FormatYAML:
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		err = dec.Decode(&f)
	default:
		return nil, invalid(op, "", "unknown style file format %q; want %q or %q", format, FormatYAML, FormatJSON)
	}
	if errors.Is(err, io.EOF) {
		return nil, invalid(op, "", "style file is empty")
	}
	if err != nil {
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("%s: %w", format, err)}
	}
	names := make([]string, 0, len(f.Styles))
	for n := range f.Styles {
		names = append(names, n)
	}
	slices.Sort(names)
	styles := make([]Style, 0, len(names))
	for _, n := range names {
		st := f.Styles[n]
		styles = append(styles, Style{Name: n, Instructions: st.Instructions, Avoid: st.Avoid})
	}
	return BuiltinStyles().with(op, styles)
}

// LoadStylesFile reads styles from a .yaml, .yml or .json file, as
// LoadStyles does.
func LoadStylesFile(path string) (*StyleSet, error) {
	var format Format
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		format = FormatYAML
	case ".json":
		format = FormatJSON
	default:
		return nil, invalid("load styles", "", "style file %q: want a .yaml, .yml or .json file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		kind := vramguard.KindInvalidInput
		if errors.Is(err, os.ErrNotExist) {
			kind = vramguard.KindNotFound
		}
		return nil, &vramguard.Error{Op: "load styles", Kind: kind, Err: err}
	}
	defer f.Close()
	return LoadStyles(f, format)
}
