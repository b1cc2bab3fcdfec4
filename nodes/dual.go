package nodes

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// dualLabelRe finds a "Positive" or "Negative" label at a line start, after
// optional heading, quote, list and emphasis markers. Whether the match is
// a label (a colon, or nothing else on the line) is decided by dualLabels.
var dualLabelRe = regexp.MustCompile(`(?im)^[ \t]*(?:(?:#{1,6}|>)[ \t]*|(?:[-+*]|\d{1,3}[.)])[ \t]+)*[*_]{0,3}[ \t]*` +
	`(positive|negative)(?:[ \t]+prompts?)?[ \t]*[*_]{0,3}[ \t]*(:)?[ \t]*[*_]{0,3}`)

// dualLabel is a label found in a reply.
type dualLabel struct {
	negative   bool
	start, end int // the label's span; its section starts at end
}

// dualLabels returns the labels of text in order. A match counts when it
// has a colon ("Negative: blurry") or is alone on its line ("## Negative"),
// so that "Negative space dominates" in a prompt does not split it.
func dualLabels(text string) []dualLabel {
	var out []dualLabel
	for _, m := range dualLabelRe.FindAllStringSubmatchIndex(text, -1) {
		if m[4] < 0 {
			rest := text[m[1]:]
			if nl := strings.IndexByte(rest, '\n'); nl >= 0 {
				rest = rest[:nl]
			}
			if strings.TrimSpace(rest) != "" {
				continue
			}
		}
		out = append(out, dualLabel{
			negative: strings.EqualFold(text[m[2]:m[3]], "negative"),
			start:    m[0],
			end:      m[1],
		})
	}
	return out
}

// ParseDualStream splits a reply written as "Positive: …" / "Negative: …"
// into its two prompts, each cleaned as by Clean with the zero
// CleanOptions.
//
// Reasoning is removed first. Labels may be in any case, in bold
// ("**Negative Prompt:**"), headings ("## Positive") or list items, but
// only count at the start of a line, so "negative space" inside the
// positive text does not split it. Each section runs to the next label; if
// a label repeats, the first non-empty section wins. With no negative label
// the negative is empty; with no positive label, the positive is the text
// before the negative label, or the whole text when there is no label.
func ParseDualStream(text string) (pos, neg string) {
	body, _ := Clean(text, CleanOptions{KeepLabels: true, KeepQuotes: true})
	labels := dualLabels(body)
	if len(labels) == 0 {
		pos, _ = Clean(body, CleanOptions{})
		return pos, ""
	}
	havePos := false
	for i, l := range labels {
		end := len(body)
		if i+1 < len(labels) {
			end = labels[i+1].start
		}
		havePos = havePos || !l.negative
		section, _ := Clean(body[l.end:end], CleanOptions{})
		switch {
		case l.negative && neg == "":
			neg = section
		case !l.negative && pos == "":
			pos = section
		}
	}
	if !havePos {
		pos, _ = Clean(body[:labels[0].start], CleanOptions{})
	}
	return pos, neg
}

// DualStreamRefiner turns a description into a positive and a negative
// prompt in one generation.
//
// It asks a server that takes a JSON schema as the request's format
// (Ollama v0.5.0 and later, told by /api/version, read once per call) for
// a JSON object {"positive": …, "negative": …}, which the server's grammar
// makes the model follow; an older server, or any with NoSchema set, gets
// the fixed "Positive:" / "Negative:" text format, read back with
// ParseDualStream. A reply to the schema that is not the object asked for
// (a server that ignored the format) is read as text too, without a second
// request: a model that ignores the format once would ignore it again, and
// the text parser reads what such models write. Result.DualFormat says
// which way was taken.
//
// With Guard.Client and Model set, the zero value unloads the model after
// each call (see vramguard.Guard). It is safe for concurrent use while its
// fields are not changed.
type DualStreamRefiner struct {
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
	// Styles resolves DualInput.Style; nil means the built-in styles.
	Styles *StyleSet
	// NoSchema asks for the text format whatever the server's version,
	// and skips the version request.
	NoSchema bool
}

// DualInput is what DualStreamRefiner.Refine works on.
type DualInput struct {
	// Description of the image; required.
	Description string
	// Style, optional, names a style whose name and things to avoid
	// steer both prompts.
	Style string
	Sampling
	// IncludeReasoning keeps the model's reasoning in Result.Reasoning.
	IncludeReasoning bool
}

// Refine writes a positive prompt (Result.Prompt) and a negative prompt
// (Result.Negative) for in, and says in Result.DualFormat how it asked for
// them. A reply with no positive prompt is a KindServer error wrapping
// ErrEmptyOutput; a missing negative prompt is not an error. If the
// generation succeeds but the guard's cleanup fails, both the result and
// the error are returned. The version request runs inside the guard's use,
// so a closed client sends nothing; when ctx ends during it the call
// returns a KindCanceled error and loads nothing.
func (n *DualStreamRefiner) Refine(ctx context.Context, in DualInput) (*Result, error) {
	st := &settings{op: "dual stream refiner", guard: &n.Guard, model: n.Model, timeout: n.Timeout, maxTokens: n.MaxTokens, progress: n.Progress}
	hint, err := st.styledInput(n.Styles, "description", in.Description, in.Style, in.Sampling)
	if err != nil {
		return nil, err
	}
	res := &Result{Model: n.Model}
	done := false
	err = n.Run(ctx, n.Model, func(ctx context.Context, s *vramguard.Session) error {
		schema := false
		if !n.NoSchema {
			var err error
			if schema, err = serverTakesSchema(ctx, st); err != nil {
				return err
			}
		}
		prompt, err := renderFixed(st.op, n.Model, dualTemplate, fixedData{Description: in.Description, StyleHint: hint, JSON: schema})
		if err != nil {
			return err
		}
		p := pass{prompt: prompt, sampling: in.Sampling, reasoning: in.IncludeReasoning, n: 1, of: 1, tokens: new(int)}
		if schema {
			p.format = json.RawMessage(dualSchema)
		}
		gen, _, reasoning, err := st.generate(ctx, s, p)
		if err != nil {
			return err
		}
		res.Generations = append(res.Generations, gen)
		res.Prompt, res.Negative, res.DualFormat = readDual(gen.Text, schema)
		res.Reasoning = reasoning
		if res.Prompt == "" {
			return emptyOutput(st.op, n.Model)
		}
		done = true
		return nil
	})
	return finish(res, done, err)
}

// readDual reads a reply's two prompts: as JSON when the schema was sent
// and the reply is the object it asks for, else as text. The raw reply is
// parsed: Clean would take "Positive:" for a label.
func readDual(text string, schema bool) (pos, neg string, f DualFormat) {
	if !schema {
		pos, neg = ParseDualStream(text)
		return pos, neg, DualText
	}
	if pos, neg, ok := parseDualJSON(text); ok {
		return pos, neg, DualJSON
	}
	pos, neg = ParseDualStream(text)
	return pos, neg, DualJSONAsText
}
