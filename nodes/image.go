package nodes

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
)

// imageDescription is the description a style's template gets from
// ImagePrompter: the image stands for it.
const imageDescription = "the attached image"

// ImagePrompter writes a diffusion prompt from an image (a reference
// photo, a sketch) with a vision model, following a style preset. It chats
// with the model: a system message carries the style's instructions, the
// user message the image, as Ollama serves vision models.
//
// With Guard.Client and Model set, the zero value uses the built-in styles
// and unloads the model after each call (see vramguard.Guard). It is safe
// for concurrent use while its fields are not changed.
type ImagePrompter struct {
	vramguard.Guard
	// Model is the Ollama model; required, and it must see images (a
	// vision model such as llava, llama3.2-vision, gemma3 or qwen2.5vl).
	Model string
	// Timeout bounds the chat turn (Timeouts.Total); zero means the
	// client's, negative is invalid.
	Timeout time.Duration
	// MaxTokens caps the reply (num_predict); zero means the model's limit.
	MaxTokens int
	// Progress, if set, is called on every streamed chunk, on the calling
	// goroutine; it must not block.
	Progress func(Progress)
	// Styles are the styles ImageInput.Style names; nil means the
	// built-in ones.
	Styles *StyleSet
}

// ImageInput is what ImagePrompter.Generate works on.
type ImageInput struct {
	// Image is the picture to describe: PNG, JPEG or WebP bytes (told by
	// their first bytes, see vramguard.ImageType), at most
	// vramguard.MaxImageBytes; required. It is sent as it is, not copied.
	Image []byte
	// Hint, optional, tells the model what the image shows or what the
	// prompt should be about ("a pencil sketch of my cat").
	Hint string
	// Style names a style of the node's set; empty means DefaultStyle.
	// Case and surrounding space are ignored.
	Style string
	// Emphasis and Mood, optional, steer the prompt.
	Emphasis, Mood string
	Sampling
	// IncludeReasoning keeps the model's reasoning in Result.Reasoning,
	// as for GenerateInput.
	IncludeReasoning bool
}

// Generate writes a prompt for in.Image into Result.Prompt. Invalid input
// is a KindInvalidInput error sent nowhere: an empty image, or one the
// library would refuse (errors.Is finds vramguard.ErrImageFormat or
// vramguard.ErrImageTooLarge). A model that cannot see images is a
// KindInvalidInput error wrapping vramguard.ErrNoVision, told by the
// server's capabilities before anything is loaded, or by its refusal, after
// which the guard unloads the model as after any use. Other errors are as
// for PromptGenerator.Generate.
func (n *ImagePrompter) Generate(ctx context.Context, in ImageInput) (*Result, error) {
	st := &settings{op: "image prompter", guard: &n.Guard, model: n.Model, timeout: n.Timeout, maxTokens: n.MaxTokens, progress: n.Progress}
	if err := st.validate(); err != nil {
		return nil, err
	}
	if err := validImage(st.op, n.Model, in.Image); err != nil {
		return nil, err
	}
	if err := validFields(st.op, n.Model, false, "hint", in.Hint, "style", in.Style, "emphasis", in.Emphasis, "mood", in.Mood); err != nil {
		return nil, err
	}
	if err := in.Sampling.validate(st.op, n.Model); err != nil {
		return nil, err
	}
	style := in.Style
	if strings.TrimSpace(style) == "" {
		style = DefaultStyle
	}
	instructions, err := n.Styles.render(st.op, n.Model, style, TemplateData{
		Description: imageDescription,
		Emphasis:    strings.TrimSpace(in.Emphasis),
		Mood:        strings.TrimSpace(in.Mood),
	})
	if err != nil {
		return nil, err
	}
	sys, err := renderFixed(st.op, n.Model, imageSystemTemplate, fixedData{System: system, Instructions: instructions})
	if err != nil {
		return nil, err
	}
	user, err := renderFixed(st.op, n.Model, imageUserTemplate, fixedData{Hint: strings.TrimSpace(in.Hint)})
	if err != nil {
		return nil, err
	}
	return single(ctx, st, pass{
		messages: []api.Message{
			{Role: "system", Content: sys},
			{Role: "user", Content: user, Images: []api.ImageData{in.Image}},
		},
		sampling:  in.Sampling,
		reasoning: in.IncludeReasoning,
	})
}

// validImage checks an image with the library's own rules
// (vramguard.CheckImage) before the guard starts, so that a bad file fails
// at once, under the node's name, and loads nothing.
func validImage(op, model string, img []byte) error {
	if err := vramguard.CheckImage(img); err != nil {
		return &vramguard.Error{Op: op, Model: model, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("image: %w", err)}
	}
	return nil
}
