package integration_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"image"
	"image/png"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/faultproxy"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
	"github.com/vramguard/vramguard/nodes"
)

// What the servers do with chat, format and images on the tiny test
// models (which have no chat template, no vision and no tools), measured
// on each version:
//
//   - chat streams and ends done:true on every version; v0.34.4 sends it
//     to llama-server's /v1/chat/completions with the messages as they
//     are (no rendered prompt).
//   - a format schema is accepted everywhere. The random model does not
//     follow it on v0.6.5 to v0.24.0 (the text is not JSON); v0.34.4
//     forwards it to the runner (chat: response_format json_schema), and
//     the stand-in, like llama-server, answers an instance.
//   - /api/show lists capabilities ["completion"] on every version, so
//     vramguard refuses images (ErrNoVision) before sending. Without that
//     check, v0.6.5 to v0.24.0 load the model and ignore the image (a
//     normal reply), and v0.34.4 loads it and fails: 400 on generate
//     ("does not support multimodal requests"), 500 on chat ("image
//     input is not supported"), the model left resident.

var chatMessages = []api.Message{{Role: "system", Content: "be terse"}, {Role: "user", Content: "a castle at dawn"}}

// runnerRequests returns the requests the stand-in llama-server got at
// path since a time (the package's tests share one server per version).
func runnerRequests(t *testing.T, s *ollamatest.Server, path string, since time.Time) []standin.Event {
	t.Helper()
	evs, err := s.RunnerEvents()
	if err != nil {
		t.Fatal(err)
	}
	var out []standin.Event
	for _, e := range evs {
		if e.Event == standin.EventRequest && e.Path == path && !e.Time.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

// A chat through a guard streams to done and is unloaded, verified, like
// a generation; a chat left warm is unloaded by UnloadModel, verified.
func TestChatStreamsAndUnloads(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		start := time.Now()
		c := newClient(t, s, vramguard.Options{})
		g := vramguard.Guard{Client: c}
		var chunks int
		gen, err := g.Chat(t.Context(), &vramguard.ChatRequest{Model: modelA, Messages: chatMessages, Options: short(8)},
			func(vramguard.Chunk) error { chunks++; return nil })
		if err != nil {
			t.Fatal(err)
		}
		if gen.Metrics.EvalCount != 8 || gen.DoneReason != "length" || chunks != gen.Chunks || !gen.Loaded {
			t.Errorf("eval %d, reason %q, chunks %d/%d, loaded %v", gen.Metrics.EvalCount, gen.DoneReason, chunks, gen.Chunks, gen.Loaded)
		}
		requireEmpty(t, s, "after Guard.Chat returned")

		if ollamatest.UsesLlamaServer(s.Version()) {
			reqs := runnerRequests(t, s, "/v1/chat/completions", start)
			if len(reqs) != 1 {
				t.Fatalf("the runner's chat endpoint got %d requests, want 1", len(reqs))
			}
			var body struct {
				Messages []struct{ Role, Content string } `json:"messages"`
				Stream   bool                             `json:"stream"`
			}
			if err := json.Unmarshal(reqs[0].Body, &body); err != nil {
				t.Fatal(err)
			}
			if len(body.Messages) != 2 || body.Messages[0].Content != "be terse" || body.Messages[1].Content != "a castle at dawn" || !body.Stream {
				t.Errorf("the runner got %s", reqs[0].Body)
			}
		}

		// Warm, then a verified unload.
		if _, err := c.ChatStreaming(t.Context(), &vramguard.ChatRequest{Model: modelA, Messages: chatMessages, Options: short(4)},
			vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		if ms := running(t, s); len(ms) != 1 {
			t.Fatalf("/api/ps lists %v after a warm chat", ms)
		}
		rep, err := c.UnloadModel(t.Context(), modelA)
		if err != nil || !rep.Verified || !rep.WasLoaded {
			t.Fatalf("unload: %+v, %v", rep, err)
		}
		requireEmpty(t, s, "right after UnloadModel returned")
		if pids, err := s.RunnerPIDs(); err != nil || len(pids) != 0 {
			t.Errorf("runners %v (err %v) after a verified unload", pids, err)
		}
	})
}

// A JSON schema in format reaches the server on both endpoints; where the
// runner follows it (v0.34.4's stand-in) the reply is an instance.
func TestFormatSchema(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"positive":{"type":"string"},"negative":{"type":"string"}},"required":["positive","negative"]}`)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		start := time.Now()
		c := newClient(t, s, vramguard.Options{})
		follows := ollamatest.UsesLlamaServer(s.Version())
		for _, ep := range []string{"chat", "generate"} {
			var gen *vramguard.Generation
			var err error
			if ep == "chat" {
				gen, err = c.ChatStreaming(t.Context(), &vramguard.ChatRequest{Model: modelA, Messages: chatMessages, Format: schema, Options: short(24)},
					vramguard.KeepAliveUnload, nil)
			} else {
				gen, err = c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "a castle", Format: schema, Options: short(24)},
					vramguard.KeepAliveUnload, nil)
			}
			if err != nil {
				t.Fatalf("%s: %v", ep, err)
			}
			var pair struct{ Positive, Negative string }
			jerr := json.Unmarshal([]byte(gen.Text), &pair)
			switch {
			case follows && (jerr != nil || pair.Positive == "" || pair.Negative == ""):
				t.Errorf("%s: reply %q is not an instance of the schema: %v", ep, gen.Text, jerr)
			case !follows:
				t.Logf("%s: the random model's reply (%s, %d tokens) parses as the schema: %v", ep, gen.DoneReason, gen.Metrics.EvalCount, jerr == nil)
			}
		}
		waitEmpty(t, s, 2*time.Second)
		if follows {
			chat := runnerRequests(t, s, "/v1/chat/completions", start)
			if len(chat) != 1 || !bytes.Contains(chat[0].Body, []byte(`"json_schema"`)) {
				t.Errorf("the runner's chat requests %d, want one with the schema", len(chat))
			}
			comp := runnerRequests(t, s, "/completion", start)
			if len(comp) != 1 || !bytes.Contains(comp[0].Body, []byte(`"json_schema"`)) {
				t.Errorf("the runner's completion requests %d, want one with the schema", len(comp))
			}
		}
	})
}

// An image for a text model: vramguard refuses it before sending
// (ErrNoVision, nothing loaded). With the capabilities hidden, each
// version does what the file comment says, and a guard still leaves
// nothing resident.
func TestImageForTextModel(t *testing.T) {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, 2, 2))); err != nil {
		t.Fatal(err)
	}
	img := []api.ImageData{b.Bytes()}
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		c := newClient(t, s, vramguard.Options{})
		g := vramguard.Guard{Client: c}
		_, err := g.Chat(t.Context(), &vramguard.ChatRequest{Model: modelA, Messages: []api.Message{{Role: "user", Content: "describe", Images: img}}}, nil)
		if !errors.Is(err, vramguard.ErrNoVision) || !errors.Is(err, vramguard.KindInvalidInput) {
			t.Fatalf("got %v, want KindInvalidInput wrapping ErrNoVision", err)
		}
		requireEmpty(t, s, "after the refusal")
		if pids, _ := s.RunnerPIDs(); len(pids) != 0 {
			t.Errorf("runners %v: the refused request loaded the model", pids)
		}
		// The node that writes a prompt from an image says the same.
		n := nodes.ImagePrompter{Guard: g, Model: modelA, MaxTokens: 8}
		if _, err := n.Generate(t.Context(), nodes.ImageInput{Image: img[0]}); !errors.Is(err, vramguard.ErrNoVision) {
			t.Errorf("ImagePrompter: got %v, want ErrNoVision", err)
		}
		requireEmpty(t, s, "after ImagePrompter's refusal")

		// The server's own verdict, capabilities hidden by a proxy.
		p, err := faultproxy.New(s.URL(), faultproxy.Options{Rule: func(r *faultproxy.Request) faultproxy.Fault {
			if r.Path == "/api/show" {
				return faultproxy.Respond(http.StatusOK, []byte(`{}`))
			}
			return faultproxy.Pass()
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pc, err := vramguard.NewClient(vramguard.Options{Host: p.URL().String(), PollInterval: 25 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		pg := vramguard.Guard{Client: pc}
		refuses := ollamatest.UsesLlamaServer(s.Version())
		for _, ep := range []string{"generate", "chat"} {
			var err error
			if ep == "chat" {
				_, err = pg.Chat(t.Context(), &vramguard.ChatRequest{Model: modelA, Options: short(4),
					Messages: []api.Message{{Role: "user", Content: "describe", Images: img}}}, nil)
			} else {
				_, err = pg.Generate(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "describe", Images: img, Options: short(4)}, nil)
			}
			switch {
			case refuses && (!errors.Is(err, vramguard.ErrNoVision) || !errors.Is(err, vramguard.KindInvalidInput)):
				t.Errorf("%s: got %v, want the server's refusal as KindInvalidInput wrapping ErrNoVision", ep, err)
			case !refuses && err != nil:
				t.Errorf("%s: got %v; this version ignores images on a text model", ep, err)
			}
			if ms := running(t, s); slices.Contains(ms, modelA) || len(ms) > 0 {
				t.Errorf("%s: /api/ps lists %v after the guard", ep, ms)
			}
		}
	})
}

// The dual-stream node on real servers, with /api/version answering the
// release each one is (a module build reports 0.0.0, which the node
// treats as too old for a schema): the schema goes out on every version;
// v0.34.4's runner follows it (DualJSON), and the random model of the
// others does not, so the node reads its reply as text or finds no
// prompt in it (ErrEmptyOutput). Either way nothing stays resident.
func TestDualStreamSchema(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		var formats atomic.Int32
		p, err := faultproxy.New(s.URL(), faultproxy.Options{Rule: func(r *faultproxy.Request) faultproxy.Fault {
			switch {
			case r.Path == "/api/version":
				return faultproxy.Respond(http.StatusOK, []byte(`{"version":"`+s.Version()+`"}`))
			case r.IsGeneration() && bytes.Contains(r.Body, []byte(`"format":{`)):
				formats.Add(1)
			}
			return faultproxy.Pass()
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		c, err := vramguard.NewClient(vramguard.Options{Host: p.URL().String(), PollInterval: 25 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		n := nodes.DualStreamRefiner{Guard: vramguard.Guard{Client: c}, Model: modelA, MaxTokens: 24}
		res, err := n.Refine(t.Context(), nodes.DualInput{Description: "a castle"})
		if formats.Load() != 1 {
			t.Errorf("%d requests carried a schema, want 1", formats.Load())
		}
		switch {
		case ollamatest.UsesLlamaServer(s.Version()):
			if err != nil || res.DualFormat != nodes.DualJSON || res.Prompt == "" || res.Negative == "" {
				t.Errorf("got %+v, %v; want both prompts from the JSON reply", res, err)
			}
		case err != nil && !errors.Is(err, nodes.ErrEmptyOutput):
			t.Errorf("got %v, want a result read as text or ErrEmptyOutput", err)
		case err == nil && res.DualFormat != nodes.DualJSONAsText:
			t.Errorf("format %v, want the text parser's fallback", res.DualFormat)
		}
		requireEmpty(t, s, "after the node returned")
	})
}
