package vramguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard/internal/testkit/faultproxy"
	"github.com/vramguard/vramguard/vramguardtest"
)

// testPNG and testJPEG are real 2x2 images.
func testPNG(t testing.TB) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, testImage()); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func testJPEG(t testing.TB) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, testImage(), nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func testImage() image.Image {
	img := image.NewRGBA(image.Rect(0, 0, 2, 2))
	img.Set(0, 0, color.RGBA{R: 255, A: 255})
	return img
}

func TestImageType(t *testing.T) {
	tests := []struct {
		name string
		img  []byte
		want string
	}{
		{"png", testPNG(t), "png"},
		{"jpeg", testJPEG(t), "jpeg"},
		{"webp", []byte("RIFF\x24\x00\x00\x00WEBPVP8 "), "webp"},
		{"gif", []byte("GIF89a\x01\x00\x01\x00"), ""},
		{"png named by nothing but its first byte", []byte("\x89PN"), ""},
		{"riff that is not webp", []byte("RIFF\x24\x00\x00\x00WAVEfmt "), ""},
		{"short riff", []byte("RIFF"), ""},
		{"text", []byte("a photo of a fox"), ""},
		{"empty", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ImageType(tt.img); got != tt.want {
				t.Errorf("ImageType = %q, want %q", got, tt.want)
			}
		})
	}
}

// Every malformed chat, image or format is refused with KindInvalidInput
// before anything reaches the server.
func TestChatInvalidInput(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{})
	ctx := t.Context()
	user := func(text string) []api.Message { return []api.Message{{Role: "user", Content: text}} }
	huge := make([]byte, MaxImageBytes+1)
	copy(huge, testPNG(t))
	big := make([]byte, MaxImageBytes)
	copy(big, testPNG(t))
	badArgs := api.NewToolCallFunctionArguments()
	badArgs.Set("x", math.Inf(1))
	tests := []struct {
		name  string
		chat  *ChatRequest
		gen   *GenerateRequest
		cause error // errors.Is target, optional
	}{
		{name: "nil chat", chat: nil},
		{name: "empty model", chat: &ChatRequest{Messages: user("x")}},
		{name: "no messages (an unload)", chat: &ChatRequest{Model: "tiny"}},
		{name: "unknown role", chat: &ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "narrator", Content: "x"}}}},
		{name: "empty role", chat: &ChatRequest{Model: "tiny", Messages: []api.Message{{Content: "x"}}}},
		{name: "invalid UTF-8 content", chat: &ChatRequest{Model: "tiny", Messages: user("\xff")}},
		{name: "17 MB of messages", chat: &ChatRequest{Model: "tiny", Messages: []api.Message{
			{Role: "system", Content: strings.Repeat("a", 9<<20)}, {Role: "user", Content: strings.Repeat("b", 8<<20)}}}},
		{name: "negative timeout", chat: &ChatRequest{Model: "tiny", Messages: user("x"), Timeouts: Timeouts{Idle: -1}}},
		{name: "NaN option", chat: &ChatRequest{Model: "tiny", Messages: user("x"), Options: map[string]any{"temperature": math.NaN()}}},
		{name: "tool call with an infinite argument", chat: &ChatRequest{Model: "tiny", Messages: []api.Message{
			{Role: "assistant", ToolCalls: []api.ToolCall{{Function: api.ToolCallFunction{Name: "f", Arguments: badArgs}}}}}}},
		{name: "chat image not an image", cause: ErrImageFormat, chat: &ChatRequest{Model: "tiny", Messages: []api.Message{
			{Role: "user", Content: "x", Images: []api.ImageData{[]byte("GIF89a....")}}}}},
		{name: "chat image too large", cause: ErrImageTooLarge, chat: &ChatRequest{Model: "tiny", Messages: []api.Message{
			{Role: "user", Content: "x", Images: []api.ImageData{huge}}}}},
		{name: "chat images too large together", cause: ErrImageTooLarge, chat: &ChatRequest{Model: "tiny", Messages: []api.Message{
			{Role: "user", Content: "x", Images: []api.ImageData{big, big}}, {Role: "user", Content: "y", Images: []api.ImageData{big, big}}}}},
		{name: "chat format xml", chat: &ChatRequest{Model: "tiny", Messages: user("x"), Format: json.RawMessage(`"xml"`)}},
		{name: "chat format number", chat: &ChatRequest{Model: "tiny", Messages: user("x"), Format: json.RawMessage(`42`)}},
		{name: "chat format not JSON", chat: &ChatRequest{Model: "tiny", Messages: user("x"), Format: json.RawMessage(`{"type":`)}},
		{name: "generate image empty", cause: ErrImageFormat, gen: &GenerateRequest{Model: "tiny", Prompt: "x", Images: []api.ImageData{{}}}},
		{name: "generate image text", cause: ErrImageFormat, gen: &GenerateRequest{Model: "tiny", Prompt: "x", Images: []api.ImageData{[]byte("a fox")}}},
		{name: "generate image too large", cause: ErrImageTooLarge, gen: &GenerateRequest{Model: "tiny", Prompt: "x", Images: []api.ImageData{huge}}},
		{name: "generate format array", gen: &GenerateRequest{Model: "tiny", Prompt: "x", Format: json.RawMessage(`["json"]`)}},
		{name: "generate format yaml", gen: &GenerateRequest{Model: "tiny", Prompt: "x", Format: json.RawMessage(`"yaml"`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.gen != nil {
				_, err = c.GenerateStreaming(ctx, tt.gen, KeepAliveUnload, nil)
			} else {
				_, err = c.ChatStreaming(ctx, tt.chat, KeepAliveUnload, nil)
			}
			if !errors.Is(err, KindInvalidInput) {
				t.Fatalf("got %v (kind %v), want invalid input", err, KindOf(err))
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Errorf("error %v does not wrap %v", err, tt.cause)
			}
		})
	}
	if n := s.Requests(""); n != 0 {
		t.Errorf("invalid input reached the server %d times", n)
	}
}

// Valid formats and images go out: "json", a schema, null (none), and
// each image type on a vision model, as sent.
func TestChatValidFormatsAndImagesAccepted(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "llava", Vision: true})
	c := newTestClient(t, s, Options{})
	for _, f := range []string{`"json"`, ` {"type":"object","properties":{"a":{"type":"string"}}} `, `null`, ``} {
		if _, err := c.ChatStreaming(t.Context(), &ChatRequest{Model: "llava", Messages: []api.Message{{Role: "USER", Content: "x"}},
			Format: json.RawMessage(f)}, KeepAliveUnload, nil); err != nil {
			t.Errorf("format %q: %v", f, err)
		}
	}
	images := []api.ImageData{testPNG(t), testJPEG(t), []byte("RIFF\x24\x00\x00\x00WEBPVP8 ")}
	if _, err := c.ChatStreaming(t.Context(), &ChatRequest{Model: "llava", Messages: []api.Message{{Role: "user", Content: "x", Images: images}}},
		KeepAliveUnload, nil); err != nil {
		t.Fatalf("PNG, JPEG and WebP: %v", err)
	}
	calls := s.Calls("llava")
	got := calls[len(calls)-1].Messages[0].Images
	if len(got) != 3 || !bytes.Equal(got[2], images[2]) {
		t.Errorf("the server got %d images, want the 3 sent", len(got))
	}
}

// A model whose capabilities (/api/show) lack vision fails with
// ErrNoVision before the request is sent, on both endpoints, and is not
// loaded.
func TestNoVisionRefusedBeforeSending(t *testing.T) {
	for _, ep := range endpoints() {
		t.Run(ep.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			c := newTestClient(t, s, Options{})
			_, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "describe", Images: []api.ImageData{testPNG(t)}}, KeepAliveUnload, nil)
			if !errors.Is(err, KindInvalidInput) || !errors.Is(err, ErrNoVision) {
				t.Fatalf("got %v, want KindInvalidInput wrapping ErrNoVision", err)
			}
			if !strings.Contains(err.Error(), "completion") {
				t.Errorf("error %q does not name the model's capabilities", err)
			}
			if n := s.Requests("tiny"); n != 0 || s.Listed("tiny") {
				t.Errorf("%d requests reached the server, listed %v; want none", n, s.Listed("tiny"))
			}
			// A model that does not exist is KindNotFound, from the same check.
			_, err = ep.run(t.Context(), c, &GenerateRequest{Model: "nope", Prompt: "describe", Images: []api.ImageData{testPNG(t)}}, KeepAliveUnload, nil)
			if !errors.Is(err, KindNotFound) {
				t.Errorf("missing model: got %v, want KindNotFound", err)
			}
		})
	}
}

// A server that does not list capabilities lets the request through; its
// own refusal of the images (each version's text) is ErrNoVision too.
func TestNoVisionFromTheServer(t *testing.T) {
	refusals := []string{
		"received image but vision model not loaded",
		"this model is missing data required for image input",
		"image input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
	}
	for _, ep := range endpoints() {
		for _, msg := range refusals {
			t.Run(ep.name+"/"+msg[:20], func(t *testing.T) {
				s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
				p := newProxy(t, s, func(r *faultproxy.Request) faultproxy.Fault {
					switch {
					case r.Path == "/api/show":
						return faultproxy.Respond(http.StatusOK, []byte(`{"modelfile":"FROM x"}`))
					case r.IsGeneration():
						return faultproxy.RespondError(http.StatusInternalServerError, msg)
					}
					return faultproxy.Pass()
				})
				c := newClientAt(t, p.URL().String(), Options{})
				_, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "describe", Images: []api.ImageData{testJPEG(t)}}, KeepAliveUnload, nil)
				if !errors.Is(err, KindInvalidInput) || !errors.Is(err, ErrNoVision) {
					t.Fatalf("got %v, want KindInvalidInput wrapping ErrNoVision", err)
				}
				var se api.StatusError
				if !errors.As(err, &se) || se.StatusCode != http.StatusInternalServerError {
					t.Errorf("the server's own error is not kept: %v", err)
				}
			})
		}
	}
}

// The CLI fallback cannot carry a chat or images: it is not tried, and
// the error says so next to its cause. A format it carries.
func TestFallbackRefusesChatAndImages(t *testing.T) {
	for _, tt := range []struct {
		name string
		run  func(c *OllamaClient) error
	}{
		{"chat", func(c *OllamaClient) error {
			_, err := c.ChatStreaming(t.Context(), &ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "x"}}}, KeepAliveUnload, nil)
			return err
		}},
		{"images", func(c *OllamaClient) error {
			_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x", Images: []api.ImageData{testPNG(t)}}, KeepAliveUnload, nil)
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			cli, argsFile := fakeCLI(t, `cat`)
			c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
			if tt.name == "images" {
				// Capabilities unknown, so the request goes out and fails.
				c = newClientAt(t, newProxy(t, s, nil).URL().String(), Options{Fallback: true, CLIPath: cli})
			}
			if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
				t.Fatal(err)
			}
			err := tt.run(c)
			if !errors.Is(err, KindTransient) || !errors.Is(err, ErrFallbackUnsupported) || !strings.Contains(err.Error(), tt.name) {
				t.Fatalf("got %v, want the busy error (KindTransient) and ErrFallbackUnsupported naming %s", err, tt.name)
			}
			if _, err := os.Stat(argsFile); err == nil {
				t.Error("the CLI ran")
			}
		})
	}
}

// newProxy starts a fault proxy in front of s with rule (nil: a server
// whose /api/show lists no capabilities); it is closed at the end of the
// test.
func newProxy(t *testing.T, s *vramguardtest.Server, rule func(*faultproxy.Request) faultproxy.Fault) *faultproxy.Proxy {
	t.Helper()
	if rule == nil {
		rule = func(r *faultproxy.Request) faultproxy.Fault {
			if r.Path == "/api/show" {
				return faultproxy.Respond(http.StatusOK, []byte(`{}`))
			}
			return faultproxy.Pass()
		}
	}
	p, err := faultproxy.New(s.URL(), faultproxy.Options{Rule: rule})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// showRule stalls or delays /api/show with f and passes the rest.
func showRule(f faultproxy.Fault) func(*faultproxy.Request) faultproxy.Fault {
	return func(r *faultproxy.Request) faultproxy.Fault {
		if r.Path == "/api/show" {
			return f
		}
		return faultproxy.Pass()
	}
}

func TestFallbackCarriesFormat(t *testing.T) {
	for _, tt := range []struct{ format, flag string }{
		{`"json"`, "--format json"},
		{"{\n  \"type\": \"object\"\n}", `--format {"type":"object"}`},
	} {
		t.Run(tt.flag, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			cli, argsFile := fakeCLI(t, `printf '{}'`)
			c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
			if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
				t.Fatal(err)
			}
			gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x", Format: json.RawMessage(tt.format)}, KeepAliveUnload, nil)
			if err != nil || !gen.Fallback {
				t.Fatalf("got %+v, %v; want the fallback's text", gen, err)
			}
			args, _ := os.ReadFile(argsFile)
			if want := "run tiny --nowordwrap --keepalive 0s " + tt.flag + "\n"; !strings.HasPrefix(string(args), want) {
				t.Errorf("cli got %q, want %q", args, want)
			}
		})
	}
}

// A chat is a use like a generation: the guard unloads its model,
// verified; its session ends with Run; a phase keeps it warm until End.
func TestGuardChat(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{})
	ctx := t.Context()
	msgs := []api.Message{{Role: "user", Content: "a fox"}}

	g := Guard{Client: c}
	gen, err := g.Chat(ctx, &ChatRequest{Model: "tiny", Messages: msgs}, nil)
	if err != nil || gen.Text == "" {
		t.Fatalf("Guard.Chat: %+v, %v", gen, err)
	}
	if s.Listed("tiny") {
		t.Error("model resident after Guard.Chat")
	}

	var kept *Session
	err = g.Run(ctx, "tiny", func(ctx context.Context, s *Session) error {
		kept = s
		if _, err := s.Chat(ctx, &ChatRequest{Model: "other", Messages: msgs}, nil); !errors.Is(err, KindInvalidInput) {
			t.Errorf("chat on another model: %v, want KindInvalidInput", err)
		}
		if _, err := s.Chat(ctx, nil, nil); !errors.Is(err, KindInvalidInput) {
			t.Errorf("nil chat: %v, want KindInvalidInput", err)
		}
		_, err := s.Chat(ctx, &ChatRequest{Messages: msgs}, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	n := s.Requests("tiny")
	if _, err := kept.Chat(ctx, &ChatRequest{Messages: msgs}, nil); !errors.Is(err, ErrSessionEnded) {
		t.Errorf("chat after Run: %v, want ErrSessionEnded", err)
	}
	if s.Requests("tiny") != n {
		t.Error("a session used after Run sent a request")
	}

	p, err := c.StartPhase(ctx, "prompts", PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pg := p.Guard()
	for range 2 {
		if _, err := pg.Chat(ctx, &ChatRequest{Model: "tiny", Messages: msgs}, nil); err != nil {
			t.Fatal(err)
		}
		if !s.Listed("tiny") {
			t.Fatal("a phase's chat did not keep the model warm")
		}
	}
	if s.Loads("tiny") != 3 { // one per guard above, one for the phase
		t.Errorf("%d loads, want 3: the phase reloaded", s.Loads("tiny"))
	}
	rep, err := p.End(ctx)
	if err != nil || s.Listed("tiny") {
		t.Fatalf("End: %+v, %v; listed %v", rep, err, s.Listed("tiny"))
	}
	if _, err := pg.Chat(ctx, &ChatRequest{Model: "tiny", Messages: msgs}, nil); !errors.Is(err, ErrPhaseEnded) {
		t.Errorf("chat after End: %v, want ErrPhaseEnded", err)
	}
}

// An unload of a model a chat is loading cuts the chat, as it cuts a
// generation.
func TestChatUnloadCutsLoad(t *testing.T) {
	const load = 2 * time.Second
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: load})
	c := newTestClient(t, s, Options{})
	SetProcRoot(c, newFakeProcs(t).root)
	done := make(chan error, 1)
	go func() {
		_, err := c.ChatStreaming(context.WithoutCancel(t.Context()), &ChatRequest{Model: "tiny",
			Messages: []api.Message{{Role: "user", Content: "x"}}}, KeepAliveFor(time.Hour), nil)
		done <- err
	}()
	if err := s.WaitFor(t.Context(), func() bool { return InFlight(c, "tiny") == 1 && s.Requests("tiny") == 1 }); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := c.UnloadModel(t.Context(), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= load/2 {
		t.Errorf("the unload took %v: it waited for the load (%v)", took, load)
	}
	if gerr := <-done; !errors.Is(gerr, KindCanceled) || !errors.Is(gerr, ErrUnloadedWhileLoading) {
		t.Errorf("the chat returned %v, want KindCanceled wrapping ErrUnloadedWhileLoading", gerr)
	}
	if !rep.Verified || rep.CanceledLoads != 1 {
		t.Errorf("report %+v, want verified with one canceled load", rep)
	}
}

// Through the caller's api.Client (Options.API) instead of the client's
// own reader, a chat keeps the same rules: text whole, a cut stream an
// error.
func TestChatThroughAPIClient(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 6})
	c, err := NewClient(Options{API: s.APIClient(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := &ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "x"}}}
	var joined strings.Builder
	gen, err := c.ChatStreaming(t.Context(), req, KeepAliveUnload, func(ch Chunk) error { joined.WriteString(ch.Text); return nil })
	if err != nil || gen.Text == "" || gen.Text != joined.String() || gen.Chunks < 6 {
		t.Fatalf("got %+v, %v; streamed %q", gen, err, joined.String())
	}
	if err := s.FailNext("tiny", vramguardtest.CloseAfter(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ChatStreaming(t.Context(), req, KeepAliveUnload, nil); !errors.Is(err, KindTransient) || !errors.Is(err, ErrIncompleteStream) {
		t.Fatalf("cut stream: got %v, want KindTransient wrapping ErrIncompleteStream", err)
	}
}

// The capabilities question is bounded by the call's first-chunk and
// total timeouts, each with its own cause: a server that never answers
// /api/show is a KindTimeout, not a hang, and nothing is sent.
func TestVisionCheckBounded(t *testing.T) {
	for _, tt := range []struct {
		name  string
		to    Timeouts
		cause error
	}{
		// Long enough for the request to reach the proxy on a busy machine
		// (at 100 ms, a total timeout once fired before it had), short
		// beside the minute's stall.
		{"first chunk", Timeouts{FirstChunk: time.Second}, ErrFirstChunkTimeout},
		{"total", Timeouts{FirstChunk: time.Minute, Total: time.Second}, ErrTotalTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			p := newProxy(t, s, showRule(faultproxy.Stall(time.Minute)))
			c := newClientAt(t, p.URL().String(), Options{Timeouts: tt.to})
			_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x", Images: []api.ImageData{testPNG(t)}}, KeepAliveUnload, nil)
			if !errors.Is(err, KindTimeout) || !errors.Is(err, tt.cause) {
				t.Fatalf("got %v, want KindTimeout wrapping %v", err, tt.cause)
			}
			if fired := p.Stats().Fired; fired.IsZero() || time.Since(fired) > 5*time.Second {
				t.Errorf("the stall began at %v: the timeout did not cut it", fired)
			}
			if n := s.Requests("tiny"); n != 0 {
				t.Errorf("%d requests sent after the check timed out", n)
			}
		})
	}
}

// The question's time counts: a slow /api/show and then a slow first
// chunk, each within the limit but together over it, time out.
func TestVisionCheckCountsAgainstTimeouts(t *testing.T) {
	const step = 400 * time.Millisecond
	for _, tt := range []struct {
		name  string
		to    Timeouts
		cause error
	}{
		{"first chunk", Timeouts{FirstChunk: 600 * time.Millisecond}, ErrFirstChunkTimeout},
		{"total", Timeouts{FirstChunk: 10 * time.Second, Total: 600 * time.Millisecond}, ErrTotalTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "llava", Vision: true, Chunks: 2})
			p := newProxy(t, s, showRule(faultproxy.Delay(step)))
			c := newClientAt(t, p.URL().String(), Options{Timeouts: tt.to})
			if err := s.FailNext("llava", vramguardtest.Stall(step)); err != nil {
				t.Fatal(err)
			}
			_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "llava", Prompt: "x", Images: []api.ImageData{testPNG(t)}}, KeepAliveUnload, nil)
			if !errors.Is(err, KindTimeout) || !errors.Is(err, tt.cause) {
				t.Fatalf("got %v, want KindTimeout wrapping %v: the check's time was not counted", err, tt.cause)
			}
		})
	}
}

// A blank or null Format is none: it is sent as no format, on both
// endpoints.
func TestBlankFormatIsNone(t *testing.T) {
	for _, ep := range endpoints() {
		t.Run(ep.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			c := newTestClient(t, s, Options{})
			for _, f := range []string{" \n", "null", " null "} {
				if _, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "x", Format: json.RawMessage(f)}, KeepAliveUnload, nil); err != nil {
					t.Fatalf("format %q: %v (kind %v)", f, err, KindOf(err))
				}
			}
			for _, call := range s.Calls("tiny") {
				if call.Format != nil {
					t.Errorf("format %q sent, want none", call.Format)
				}
			}
		})
	}
}

// What the caller sends reaches the server as sent: messages with their
// roles, images, tool calls and tool results; tools; format; think;
// options; the keep-alive. The model's tool calls come back in the
// chunks and the generation.
func TestChatPassesThrough(t *testing.T) {
	args := api.NewToolCallFunctionArguments()
	args.Set("city", "Lyon")
	call := api.ToolCall{ID: "call_1", Function: api.ToolCallFunction{Name: "weather", Arguments: args}}
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "llava", Vision: true, Tools: true, Thinking: true,
		RespondTo: func(r vramguardtest.Call) []vramguardtest.Chunk {
			return []vramguardtest.Chunk{{Text: "let me check"}, {ToolCalls: []api.ToolCall{call}}, {Text: "."}}
		}})
	c := newTestClient(t, s, Options{})
	var tool api.Tool
	if err := json.Unmarshal([]byte(`{"type":"function","function":{"name":"weather","description":"the weather",
		"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`), &tool); err != nil {
		t.Fatal(err)
	}
	img := testPNG(t)
	think := true
	schema := json.RawMessage(`{"type":"object","properties":{"answer":{"type":"string"}}}`)
	req := &ChatRequest{
		Model: "llava",
		Messages: []api.Message{
			{Role: "system", Content: "be brief"},
			{Role: "user", Content: "what is this, and the weather?", Images: []api.ImageData{img}},
			{Role: "assistant", ToolCalls: []api.ToolCall{call}},
			{Role: "tool", Content: "sunny", ToolName: "weather", ToolCallID: "call_1"},
		},
		Tools:   api.Tools{tool},
		Format:  schema,
		Think:   &think,
		Options: map[string]any{"seed": 7, "temperature": 0.2},
	}
	var streamed []api.ToolCall
	gen, err := c.ChatStreaming(t.Context(), req, KeepAliveFor(90*time.Second), func(ch Chunk) error {
		streamed = append(streamed, ch.ToolCalls...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if gen.Text != "let me check." || len(gen.ToolCalls) != 1 || gen.ToolCalls[0].Function.Name != "weather" || len(streamed) != 1 {
		t.Errorf("reply %q, tool calls %+v (streamed %d); want the text and one weather call", gen.Text, gen.ToolCalls, len(streamed))
	}
	if m := gen.Message(); len(m.ToolCalls) != 1 {
		t.Errorf("Message() lost the tool calls: %+v", m)
	}
	calls := s.Calls("llava")
	if len(calls) != 1 {
		t.Fatalf("%d calls reached the server, want 1", len(calls))
	}
	got := calls[0]
	if got.Endpoint != "chat" || len(got.Messages) != 4 {
		t.Fatalf("server got %+v", got)
	}
	for i, want := range req.Messages {
		m := got.Messages[i]
		if m.Role != want.Role || m.Content != want.Content || m.ToolName != want.ToolName || m.ToolCallID != want.ToolCallID ||
			len(m.Images) != len(want.Images) || len(m.ToolCalls) != len(want.ToolCalls) {
			t.Errorf("message %d arrived as %+v, sent %+v", i+1, m, want)
		}
	}
	if !bytes.Equal(got.Messages[1].Images[0], img) {
		t.Error("the image arrived changed")
	}
	if v, _ := got.Messages[2].ToolCalls[0].Function.Arguments.Get("city"); v != "Lyon" {
		t.Errorf("tool call arguments arrived as %v", v)
	}
	if len(got.Tools) != 1 || got.Tools[0].Function.Name != "weather" {
		t.Errorf("tools arrived as %+v", got.Tools)
	}
	if !bytes.Equal(got.Format, schema) || got.Think == nil || !got.Think.Bool() {
		t.Errorf("format %s, think %v", got.Format, got.Think)
	}
	if got.Options["seed"] != float64(7) || got.KeepAlive == nil || got.KeepAlive.Duration != 90*time.Second {
		t.Errorf("options %v, keep-alive %v", got.Options, got.KeepAlive)
	}
}

// A generation's images and format reach a vision model, and a schema's
// reply parses.
func TestGenerateImagesAndFormat(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "llava", Vision: true})
	c := newTestClient(t, s, Options{})
	schema := json.RawMessage(`{"type":"object","properties":{"positive":{"type":"string"},"negative":{"type":"string"}},"required":["positive","negative"]}`)
	gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "llava", Prompt: "describe",
		Images: []api.ImageData{testPNG(t), testJPEG(t)}, Format: schema}, KeepAliveUnload, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pair struct{ Positive, Negative string }
	if err := json.Unmarshal([]byte(gen.Text), &pair); err != nil || pair.Positive == "" {
		t.Errorf("reply %q does not follow the schema: %v", gen.Text, err)
	}
	got := s.Calls("llava")
	if len(got) != 1 || got[0].ImageCount() != 2 || !bytes.Equal(got[0].Format, schema) {
		t.Fatalf("server got %+v", got)
	}
}

// When the server only refuses the images after loading the model (its
// capabilities unknown), the guard's cleanup still leaves nothing
// resident.
func TestNoVisionAfterLoadLeavesNothing(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newClientAt(t, newProxy(t, s, nil).URL().String(), Options{})
	g := Guard{Client: c}
	_, err := g.Chat(t.Context(), &ChatRequest{Model: "tiny", Messages: []api.Message{
		{Role: "user", Content: "describe", Images: []api.ImageData{testPNG(t)}}}}, nil)
	if !errors.Is(err, ErrNoVision) || !errors.Is(err, KindInvalidInput) {
		t.Fatalf("got %v, want KindInvalidInput wrapping ErrNoVision", err)
	}
	if s.Loads("tiny") != 1 {
		t.Fatalf("%d loads: the refusal was not the server's", s.Loads("tiny"))
	}
	if s.Listed("tiny") {
		t.Error("the model stayed resident after the refusal")
	}
}
