package nodes

import (
	"fmt"
	"strings"
	"text/template"

	"github.com/vramguard/vramguard"
)

// fixedData is what the fixed node templates use.
type fixedData struct {
	Description  string
	Prompt       string
	Instructions string
	StyleHint    string
	Pass, Passes int
	JSON         bool   // the dual prompt asks for dualSchema's object
	System       string // the image prompter's system prompt, before Instructions
	Hint         string // the image prompter's hint
}

// The fixed requests of PromptRefiner, NegativePrompt, DualStreamRefiner
// and ImagePrompter.
// Parsed once; templates are safe for concurrent use and never changed.
var (
	refineTemplate = template.Must(template.New("refine").Parse(`Refine the text-to-image prompt below. Keep its subject, style and intent. Make it more specific and vivid: concrete details of the subject, composition, lighting, color and texture. Remove repetition, contradictions and words a diffusion model cannot render.
{{- with .Instructions}}
Also: {{.}}
{{- end}}
{{- if gt .Passes 1}}
This is refinement pass {{.Pass}} of {{.Passes}}.
{{- end}}

Prompt: {{.Prompt}}

Reply with the refined prompt only: one paragraph of comma-separated phrases, no label, no quotes, no explanation.`))

	negativeTemplate = template.Must(template.New("negative").Parse(`Write a negative prompt for the text-to-image prompt below: a comma-separated list of the artifacts and qualities the image must avoid. Include common defects (blurry, low resolution, jpeg artifacts, watermark, signature, text, bad anatomy, deformed hands, extra fingers, cropped, out of frame) and whatever would clash with this image's subject, style and mood. Never list anything the prompt asks for.
{{- with .StyleHint}}
{{.}}
{{- end}}

Prompt: {{.Prompt}}

Reply with the negative prompt only: one line of comma-separated terms, no label, no quotes, no explanation.`))

	dualTemplate = template.Must(template.New("dual").Parse(`Turn the description below into a positive and a negative prompt for a text-to-image diffusion model. The positive prompt expands the description into one detailed paragraph of comma-separated phrases: the subject first, then composition, lighting, color palette, atmosphere and technical qualities. The negative prompt is a comma-separated list of artifacts and qualities to avoid: common defects (blurry, low resolution, watermark, text, bad anatomy, deformed hands) and whatever would clash with the description. It never lists anything the positive prompt asks for.
{{- with .StyleHint}}
{{.}}
{{- end}}

Description: {{.Description}}

{{if .JSON -}}
Reply with a JSON object with two string fields, nothing before or after:
{"positive": "<the positive prompt>", "negative": "<the negative prompt>"}
{{- else -}}
Reply in exactly this format, two lines, nothing before or after:
Positive: <the positive prompt>
Negative: <the negative prompt>
{{- end}}`))

	// imageSystemTemplate frames a style's instructions (Instructions,
	// rendered with imageDescription) for a vision model.
	imageSystemTemplate = template.Must(template.New("image-system").Parse(`{{.System}}

The user attaches an image: a reference photo, a sketch, a painting or a screenshot. Write a text-to-image prompt that recreates what it shows (its subject, pose, composition, setting, colors and light) in the style below. Describe only what you can see, and keep the image's subject even where the style suggests another. In the instructions below, the description is the image.

{{.Instructions}}`))

	imageUserTemplate = template.Must(template.New("image-user").Parse(`Write the prompt for this image.
{{- with .Hint}}
About the image: {{.}}
{{- end}}`))
)

// renderFixed executes one of the fixed templates.
func renderFixed(op, model string, t *template.Template, d fixedData) (string, error) {
	var b strings.Builder
	if err := t.Execute(&b, d); err != nil {
		return "", &vramguard.Error{Op: op, Model: model, Kind: vramguard.KindInternal, Err: fmt.Errorf("template %s: %w", t.Name(), err)}
	}
	return b.String(), nil
}

// styleHint is the line that tunes a negative or dual prompt to a style.
func styleHint(c *compiled) string {
	if strings.TrimSpace(c.Avoid) == "" {
		return fmt.Sprintf("The image is in the %s style.", c.Name)
	}
	return fmt.Sprintf("The image is in the %s style; for this style also avoid: %s.", c.Name, strings.TrimSpace(c.Avoid))
}
