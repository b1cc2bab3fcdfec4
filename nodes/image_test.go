package nodes

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"net/http"
	"strings"
	"testing"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// testImage encodes a small picture as PNG ("png") or JPEG ("jpeg").
func testImage(t testing.TB, format string) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 4, 4))
	img.Set(1, 1, color.RGBA{R: 200, A: 255})
	var b bytes.Buffer
	var err error
	if format == "jpeg" {
		err = jpeg.Encode(&b, img, nil)
	} else {
		err = png.Encode(&b, img)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// respondTo scripts a model that answers every request with parts, one
// chunk each, whatever it was sent.
func respondTo(parts ...string) func(vramguardtest.Call) []vramguardtest.Chunk {
	return func(vramguardtest.Call) []vramguardtest.Chunk { return textChunks(parts...) }
}

// chats returns the chat calls the server received for model.
func chats(s *vramguardtest.Server, model string) []vramguardtest.Call {
	var out []vramguardtest.Call
	for _, c := range s.Calls(model) {
		if c.Endpoint == "chat" {
			out = append(out, c)
		}
	}
	return out
}

func TestImagePrompter(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "eyes", Vision: true, RespondTo: respondTo(words(`<think>a cat</think>**Prompt:** "a cat on a windowsill, anime key visual"`)...)})
	c := newClient(t, s, nil)
	img := testImage(t, "png")
	n := ImagePrompter{Guard: vramguard.Guard{Client: c}, Model: "eyes", MaxTokens: 100}
	res, err := n.Generate(t.Context(), ImageInput{
		Image:    img,
		Hint:     " a pencil sketch of my cat ",
		Style:    " Anime ",
		Emphasis: "the beam of light",
		Mood:     "lonely",
		Sampling: Sampling{Temperature: 0.5, TopP: 0.8, Seed: 7},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "a cat on a windowsill, anime key visual" || res.Reasoning != "" || res.Negative != "" ||
		res.Model != "eyes" || res.DualFormat != 0 || len(res.Generations) != 1 {
		t.Errorf("result %+v", res)
	}
	// The default guard unloads, verified, before Generate returns.
	if resident, err := c.IsResident(t.Context(), "eyes"); err != nil || resident {
		t.Errorf("resident after Generate: %v, %v", resident, err)
	}
	calls := chats(s, "eyes")
	if len(calls) != 1 {
		t.Fatalf("%d chat calls", len(calls))
	}
	call := calls[0]
	if len(call.Messages) != 2 {
		t.Fatalf("messages %+v", call.Messages)
	}
	sys, user := call.Messages[0], call.Messages[1]
	// What was sent is what the golden files hold.
	instructions, err := BuiltinStyles().Render("anime", TemplateData{Description: imageDescription, Emphasis: "the beam of light", Mood: "lonely"})
	if err != nil {
		t.Fatal(err)
	}
	wantSys, _ := renderFixed("", "", imageSystemTemplate, fixedData{System: system, Instructions: instructions})
	wantUser, _ := renderFixed("", "", imageUserTemplate, fixedData{Hint: "a pencil sketch of my cat"})
	if sys.Role != "system" || sys.Content != wantSys || len(sys.Images) != 0 {
		t.Errorf("system message %q with %d images:\n%s", sys.Role, len(sys.Images), sys.Content)
	}
	if user.Role != "user" || user.Content != wantUser || len(user.Images) != 1 || !bytes.Equal(user.Images[0], img) {
		t.Errorf("user message %q %q with %d images", user.Role, user.Content, len(user.Images))
	}
	if call.Think == nil || call.Think.Bool() || len(call.Format) != 0 {
		t.Errorf("think %v, format %s", call.Think, call.Format)
	}
	if call.Options["temperature"] != 0.5 || call.Options["top_p"] != 0.8 || call.Options["seed"] != float64(7) || call.Options["num_predict"] != float64(100) {
		t.Errorf("options %v", call.Options)
	}
	if call.KeepAlive == nil || call.KeepAlive.Duration != 0 {
		t.Errorf("keep-alive %v", call.KeepAlive)
	}
}

func TestImagePrompterDefaults(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "eyes", Vision: true, RespondTo: respondTo("a cat")})
	c := newClient(t, s, nil)
	n := ImagePrompter{Guard: vramguard.Guard{Client: c}, Model: "eyes"}
	if _, err := n.Generate(t.Context(), ImageInput{Image: testImage(t, "jpeg")}); err != nil {
		t.Fatal(err)
	}
	call := chats(s, "eyes")[0]
	if !strings.Contains(call.Messages[0].Content, "in the "+DefaultStyle+" style") {
		t.Errorf("system message does not use the default style:\n%s", call.Messages[0].Content)
	}
	if call.Messages[1].Content != "Write the prompt for this image." {
		t.Errorf("user message %q", call.Messages[1].Content)
	}
	if call.Options["temperature"] != DefaultTemperature || call.Options["top_p"] != DefaultTopP || call.Options["seed"] != float64(0) {
		t.Errorf("options %v", call.Options)
	}
	if _, ok := call.Options["num_predict"]; ok {
		t.Errorf("num_predict sent without MaxTokens: %v", call.Options)
	}
}

func TestImagePrompterCustomStyle(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "eyes", Vision: true, RespondTo: respondTo("a cat")})
	c := newClient(t, s, nil)
	set, err := BuiltinStyles().With(Style{Name: "ink", Instructions: "Ink drawing of {{.Description}}."})
	if err != nil {
		t.Fatal(err)
	}
	n := ImagePrompter{Guard: vramguard.Guard{Client: c}, Model: "eyes", Styles: set}
	if _, err := n.Generate(t.Context(), ImageInput{Image: testImage(t, "png"), Style: "ink"}); err != nil {
		t.Fatal(err)
	}
	if sys := chats(s, "eyes")[0].Messages[0].Content; !strings.HasSuffix(sys, "\n\nInk drawing of the attached image.") {
		t.Errorf("system message:\n%s", sys)
	}
}

func TestImagePrompterReasoningAndProgress(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "eyes", Vision: true, Thinking: true, RespondTo: func(vramguardtest.Call) []vramguardtest.Chunk {
		return []vramguardtest.Chunk{{Thinking: "a cat, "}, {Thinking: "sitting"}, {Text: "a cat "}, {Text: "on a sill"}}
	}})
	c := newClient(t, s, nil)
	var ps []Progress
	n := ImagePrompter{Guard: vramguard.Guard{Client: c}, Model: "eyes", MaxTokens: 4, Progress: func(p Progress) { ps = append(ps, p) }}
	res, err := n.Generate(t.Context(), ImageInput{Image: testImage(t, "png"), IncludeReasoning: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Prompt != "a cat on a sill" || res.Reasoning != "a cat, sitting" {
		t.Errorf("prompt %q, reasoning %q", res.Prompt, res.Reasoning)
	}
	if call := chats(s, "eyes")[0]; call.Think != nil {
		t.Errorf("think %v with IncludeReasoning, want unset", call.Think)
	}
	// One call per chunk plus the done line.
	if len(ps) != 5 {
		t.Fatalf("%d progress calls: %+v", len(ps), ps)
	}
	for i, p := range ps[:4] {
		if p.Pass != 1 || p.Passes != 1 || p.Tokens != i+1 || p.Fraction != float64(i+1)/4 || p.Done {
			t.Errorf("progress %d: %+v", i, p)
		}
	}
	if last := ps[4]; !last.Done || last.Tokens != 4 || last.Fraction != 1 {
		t.Errorf("last progress %+v", last)
	}
}

func TestImagePrompterNoVision(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "blind", RespondTo: respondTo("a cat")})
	c := newClient(t, s, nil)
	n := ImagePrompter{Guard: vramguard.Guard{Client: c}, Model: "blind"}
	res, err := n.Generate(t.Context(), ImageInput{Image: testImage(t, "png")})
	if res != nil || !errors.Is(err, vramguard.ErrNoVision) || !errors.Is(err, vramguard.KindInvalidInput) {
		t.Fatalf("got %+v, %v; want an invalid-input error wrapping ErrNoVision", res, err)
	}
	// The server's capabilities said so: nothing was sent or loaded.
	if n := len(chats(s, "blind")); n != 0 || s.Loads("blind") != 0 {
		t.Errorf("%d chats, %d loads; want none", n, s.Loads("blind"))
	}
	if resident, err := c.IsResident(t.Context(), "blind"); err != nil || resident {
		t.Errorf("resident: %v, %v", resident, err)
	}
}

// showFails is a transport on which /api/show fails, as on a server that
// cannot tell a model's capabilities.
type showFails struct{}

func (showFails) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/api/show" {
		return &http.Response{StatusCode: http.StatusInternalServerError, Status: "500 Internal Server Error", Request: req,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody}, nil
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestImagePrompterNoVisionRefused: when the capabilities are unknown, the
// image goes to the server, which loads the model and refuses it; the
// node's guard then unloads the model, verified.
func TestImagePrompterNoVisionRefused(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "blind", RespondTo: respondTo("a cat")})
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), HTTPClient: &http.Client{Transport: showFails{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := ImagePrompter{Guard: vramguard.Guard{Client: c}, Model: "blind"}
	res, err := n.Generate(t.Context(), ImageInput{Image: testImage(t, "png")})
	if res != nil || !errors.Is(err, vramguard.ErrNoVision) || !errors.Is(err, vramguard.KindInvalidInput) {
		t.Fatalf("got %+v, %v; want an invalid-input error wrapping ErrNoVision", res, err)
	}
	if errors.Is(err, vramguard.KindUnverified) {
		t.Errorf("the cleanup failed: %v", err)
	}
	if calls := chats(s, "blind"); len(calls) != 1 || calls[0].ImageCount() != 1 || s.Loads("blind") != 1 {
		t.Errorf("%d chats, %d loads; want the image sent once, one load", len(calls), s.Loads("blind"))
	}
	if resident, err := c.IsResident(t.Context(), "blind"); err != nil || resident {
		t.Errorf("resident after the refusal: %v, %v", resident, err)
	}
	if ms := s.Running(); len(ms) != 0 {
		t.Errorf("running: %+v", ms)
	}
}

func TestImagePrompterInvalidInput(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "eyes", Vision: true, RespondTo: respondTo("a cat")})
	c := newClient(t, s, nil)
	g := vramguard.Guard{Client: c}
	ok := testImage(t, "png")
	tests := []struct {
		name  string
		node  ImagePrompter
		in    ImageInput
		cause error  // wrapped, if set
		want  string // in the message
	}{
		{"nil image", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{}, vramguard.ErrImageFormat, "image is empty"},
		{"empty image", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: []byte{}}, vramguard.ErrImageFormat, "image is empty"},
		{"GIF", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: []byte("GIF89a\x01\x00\x01\x00")}, vramguard.ErrImageFormat, `starts "GIF89a`},
		{"text file", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: []byte("a castle\n")}, vramguard.ErrImageFormat, "not PNG, JPEG or WebP"},
		{"truncated PNG signature", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: ok[:7]}, vramguard.ErrImageFormat, "image"},
		{"too large", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: append(bytes.Clone(ok), make([]byte, vramguard.MaxImageBytes)...)}, vramguard.ErrImageTooLarge, "over"},
		{"no model", ImagePrompter{Guard: g}, ImageInput{Image: ok}, nil, "no model"},
		{"no client", ImagePrompter{Model: "eyes"}, ImageInput{Image: ok}, nil, "no client"},
		{"negative max tokens", ImagePrompter{Guard: g, Model: "eyes", MaxTokens: -1}, ImageInput{Image: ok}, nil, "max tokens"},
		{"invalid UTF-8 hint", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: ok, Hint: "a \xff cat"}, nil, "hint is not valid UTF-8"},
		{"huge hint", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: ok, Hint: strings.Repeat("a", MaxInputBytes+1)}, nil, "hint of"},
		{"huge input", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: ok, Hint: strings.Repeat("a", MaxInputBytes/2+1), Mood: strings.Repeat("a", MaxInputBytes/2)}, nil, "input of"},
		{"unknown style", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: ok, Style: "vaporwave"}, nil, `unknown style "vaporwave"`},
		{"temperature", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: ok, Sampling: Sampling{Temperature: 2}}, nil, "temperature"},
		{"seed", ImagePrompter{Guard: g, Model: "eyes"}, ImageInput{Image: ok, Sampling: Sampling{Seed: -1}}, nil, "seed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := tt.node.Generate(t.Context(), tt.in)
			if res != nil || !errors.Is(err, vramguard.KindInvalidInput) {
				t.Fatalf("got %+v, %v; want invalid input", res, err)
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Errorf("error %v does not wrap %v", err, tt.cause)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
	if n := s.Requests("eyes"); n != 0 {
		t.Errorf("invalid input reached the server: %d requests", n)
	}
	// WebP and JPEG pass the node's check; the simulator does not decode.
	for _, img := range [][]byte{[]byte("RIFF\x00\x00\x00\x00WEBPVP8 "), testImage(t, "jpeg")} {
		if _, err := (&ImagePrompter{Guard: g, Model: "eyes"}).Generate(t.Context(), ImageInput{Image: img}); err != nil {
			t.Errorf("%q: %v", img[:4], err)
		}
	}
}

func FuzzValidImage(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x89PNG\r\n\x1a\n"))
	f.Add([]byte("\xff\xd8\xff\xe0"))
	f.Add([]byte("RIFF\x00\x00\x00\x00WEBP"))
	f.Add([]byte("GIF89a"))
	f.Fuzz(func(t *testing.T, img []byte) {
		err := validImage("fuzz", "m", img)
		typ := vramguard.ImageType(img)
		switch {
		case typ != "" && err != nil:
			t.Fatalf("a %s image refused: %v", typ, err)
		case typ == "" && !errors.Is(err, vramguard.ErrImageFormat):
			t.Fatalf("%q accepted or refused without ErrImageFormat: %v", img, err)
		case err != nil && !errors.Is(err, vramguard.KindInvalidInput):
			t.Fatalf("kind %v", vramguard.KindOf(err))
		}
	})
}
