package vramguardtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
	omodel "github.com/ollama/ollama/types/model"

	"github.com/vramguard/vramguard/vramguardtest"
)

// The error texts of Ollama v0.17.4 the simulator reproduces.
const (
	noVision = "Failed to create new sequence: failed to process inputs: this model is missing data required for image input"
	badXML   = `invalid format: "\"xml\""; expected "json" or a valid JSON Schema object`
)

// chatResult is what a Chat call produced.
type chatResult struct {
	lines []api.ChatResponse // every line, the done one included
	err   error
}

func chat(t *testing.T, c *api.Client, req *api.ChatRequest) chatResult {
	t.Helper()
	var res chatResult
	res.err = c.Chat(t.Context(), req, func(r api.ChatResponse) error {
		res.lines = append(res.lines, r)
		return nil
	})
	return res
}

// content joins the message contents of the lines.
func (r chatResult) content() string {
	var b strings.Builder
	for _, l := range r.lines {
		b.WriteString(l.Message.Content)
	}
	return b.String()
}

// toolCalls joins the tool calls of the lines.
func (r chatResult) toolCalls() []api.ToolCall {
	var out []api.ToolCall
	for _, l := range r.lines {
		out = append(out, l.Message.ToolCalls...)
	}
	return out
}

func user(content string) []api.Message { return []api.Message{{Role: "user", Content: content}} }

func TestShowCapabilities(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "plain"},
		{Name: "tools", Tools: true},
		{Name: "vision", Vision: true},
		{Name: "all", Tools: true, Vision: true, Thinking: true},
	}})
	tests := []struct {
		model string
		want  []omodel.Capability
	}{
		{"plain", []omodel.Capability{"completion"}},
		{"tools", []omodel.Capability{"completion", "tools"}},
		{"vision", []omodel.Capability{"completion", "vision"}},
		{"all", []omodel.Capability{"completion", "tools", "vision", "thinking"}},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			resp, err := c.Show(t.Context(), &api.ShowRequest{Model: tt.model})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(resp.Capabilities, tt.want) {
				t.Errorf("capabilities %v, want %v", resp.Capabilities, tt.want)
			}
		})
	}
}

// TestImages: a model without Vision loads, then refuses images with a 500
// before any chunk (a load-only request passes); a Vision model answers,
// and the images reach Calls.
func TestImages(t *testing.T) {
	img := []api.ImageData{[]byte("\x89PNG fake")}
	tests := []struct {
		name     string
		vision   bool
		endpoint string // "generate", "chat", or "load" (generate without prompt)
		images   int
		wantErr  string // "" for a reply
	}{
		{"generate, vision", true, "generate", 1, ""},
		{"chat, vision", true, "chat", 1, ""},
		{"generate, no vision", false, "generate", 1, noVision},
		{"chat, no vision", false, "chat", 1, noVision},
		{"load only, no vision", false, "load", 1, ""},
		{"no images, no vision", false, "chat", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) { m.Vision = tt.vision })}})
			var images []api.ImageData
			if tt.images > 0 {
				images = img
			}
			var err error
			var lines int
			switch tt.endpoint {
			case "chat":
				// The images are in an earlier message: any message counts.
				msgs := []api.Message{{Role: "user", Content: "what is this", Images: images}, {Role: "user", Content: "well?"}}
				res := chat(t, c, &api.ChatRequest{Model: "tiny", Messages: msgs})
				err, lines = res.err, len(res.lines)
			case "generate":
				res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "what is this", Images: images})
				err, lines = res.err, len(res.chunks)
			case "load":
				res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Images: images})
				if err = res.err; err == nil && (res.final == nil || res.final.DoneReason != "load") {
					t.Fatalf("final line %+v, want done_reason load", res.final)
				}
				lines = 1
			}
			if tt.wantErr == "" {
				if err != nil || lines == 0 {
					t.Fatalf("got %d lines, %v; want a reply", lines, err)
				}
			} else {
				se := statusError(t, err)
				if se.StatusCode != 500 || se.ErrorMessage != tt.wantErr || lines != 0 {
					t.Fatalf("got %+v after %d lines, want 500 %q before any", se, lines, tt.wantErr)
				}
			}
			if s.Loads("tiny") != 1 || !s.Listed("tiny") {
				t.Errorf("loads %d, listed %v; want the model loaded", s.Loads("tiny"), s.Listed("tiny"))
			}
			calls := s.Calls("tiny")
			if len(calls) != 1 || calls[0].ImageCount() != tt.images {
				t.Errorf("calls %+v, want one with %d images", calls, tt.images)
			}
		})
	}
}

// TestToolsCapability: chat with tools on a model without Tools is refused
// with Ollama's 400 before loading, naming the model in full.
func TestToolsCapability(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		tiny(),
		{Name: "user/foo:q4"},
		{Name: "tooly", Tools: true},
	}})
	tools := api.Tools{{Type: "function", Function: api.ToolFunction{Name: "get_weather"}}}
	tests := []struct {
		model   string
		tools   api.Tools
		wantErr string
	}{
		{"tiny", tools, "registry.ollama.ai/library/tiny:latest does not support tools"},
		{"TINY:latest", tools, "registry.ollama.ai/library/tiny:latest does not support tools"},
		{"user/foo:q4", tools, "registry.ollama.ai/user/foo:q4 does not support tools"},
		{"tiny", api.Tools{}, ""},
		{"tooly", tools, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %d tools", tt.model, len(tt.tools)), func(t *testing.T) {
			loads := s.Loads(tt.model)
			res := chat(t, c, &api.ChatRequest{Model: tt.model, Messages: user("weather?"), Tools: tt.tools})
			if tt.wantErr == "" {
				if res.err != nil || res.content() == "" {
					t.Fatalf("got %q, %v; want a reply", res.content(), res.err)
				}
				return
			}
			if se := statusError(t, res.err); se.StatusCode != 400 || se.ErrorMessage != tt.wantErr {
				t.Errorf("got %+v, want 400 %q", se, tt.wantErr)
			}
			if n := s.Loads(tt.model); n != loads || s.Listed(tt.model) {
				t.Errorf("loads went from %d to %d: the refused request loaded the model", loads, n)
			}
		})
	}
}

// TestFormat: "json" and schemas get valid JSON from the default
// generator, streamed in several chunks or not; a bad format loads the
// model and then gets Ollama's 500.
func TestFormat(t *testing.T) {
	const schema = `{"type":"object","properties":{
		"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},
		"age":{"type":"integer"},"ok":{"type":"boolean"},"note":{"type":["string","null"]},
		"kind":{"enum":["a","b"]},"pair":{"type":"array","minItems":2,"items":{"type":"number"}},
		"owner":{"type":"object","properties":{"email":{"type":"string"}},"required":["email","id"]}
	},"required":["name","tags"]}`
	tests := []struct {
		name    string
		format  string
		want    string // the reply, compacted; "" for plain text
		wantErr string
	}{
		{"json", `"json"`, `{"text":"WORDS"}`, ""},
		{"schema", schema, `{"age":0,"kind":"a","name":"WORDS","note":"WORDS","ok":false,"owner":{"email":"WORDS","id":"WORDS"},"pair":[0,0],"tags":[]}`, ""},
		{"empty schema", `{}`, `{}`, ""},
		{"null is none", `null`, "", ""},
		{"empty string is none", `""`, "", ""},
		{"xml", `"xml"`, "", badXML},
		{"number", `5`, "", `invalid format: "5"; expected "json" or a valid JSON Schema object`},
		{"array", `["json"]`, "", `invalid format: "[\"json\"]"; expected "json" or a valid JSON Schema object`},
	}
	for _, tt := range tests {
		for _, endpoint := range []string{"generate", "chat"} {
			for _, stream := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s %s stream=%v", tt.name, endpoint, stream), func(t *testing.T) {
					s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})
					var text string
					var lines int
					var err error
					if endpoint == "chat" {
						res := chat(t, c, &api.ChatRequest{Model: "tiny", Messages: user("p"), Format: json.RawMessage(tt.format), Stream: &stream})
						text, lines, err = res.content(), len(res.lines), res.err
					} else {
						res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p", Format: json.RawMessage(tt.format), Stream: &stream})
						text, lines, err = textOf(res), len(res.chunks), res.err
					}
					if tt.wantErr != "" {
						se := statusError(t, err)
						if se.StatusCode != 500 || se.ErrorMessage != tt.wantErr || lines != 0 {
							t.Errorf("got %+v after %d lines, want 500 %q before any", se, lines, tt.wantErr)
						}
						if !s.Listed("tiny") {
							t.Error("model not loaded")
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if stream && lines < 2 {
						t.Errorf("%d chunks, want the reply split", lines)
					}
					if tt.want == "" {
						if json.Valid([]byte(text)) {
							t.Errorf("reply %q is JSON, want the plain default", text)
						}
						return
					}
					words := strings.Join(strings.Fields(plainReply(t, c)), " ")
					want := strings.ReplaceAll(tt.want, "WORDS", words)
					if text != want {
						t.Errorf("reply %s\nwant      %s", text, want)
					}
				})
			}
		}
	}
}

// textOf joins the responses of every line, the final one included (it
// holds the whole reply when not streaming).
func textOf(r result) string {
	s := text(r)
	if r.final != nil {
		s += r.final.Response
	}
	return s
}

// plainReply is the default reply to prompt "p" without a format.
func plainReply(t *testing.T, c *api.Client) string {
	t.Helper()
	return text(mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"}))
}

// TestFormatRespondWins: a model with Respond answers with its chunks even
// when a format is set.
func TestFormatRespondWins(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
		m.Respond = func(string) []vramguardtest.Chunk { return []vramguardtest.Chunk{{Text: "not json"}} }
	})}})
	res := chat(t, c, &api.ChatRequest{Model: "tiny", Messages: user("p"), Format: json.RawMessage(`"json"`)})
	if res.err != nil || res.content() != "not json" {
		t.Errorf("got %q, %v; want Respond's chunk", res.content(), res.err)
	}
}

// TestCalls: the server records what it received, unloads excepted, the
// last 64 per model, across models in arrival order.
func TestCalls(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		tiny(func(m *vramguardtest.ModelConfig) { m.Tools, m.Vision, m.Thinking = true, true, true }),
		{Name: "other", Vision: true},
	}})
	args := api.NewToolCallFunctionArguments()
	args.Set("city", "Paris")
	msgs := []api.Message{
		{Role: "system", Content: "be brief"},
		{Role: "user", Content: "weather in Paris?", Images: []api.ImageData{[]byte("img")}},
		{Role: "assistant", ToolCalls: []api.ToolCall{{ID: "call_1", Function: api.ToolCallFunction{Name: "get_weather", Arguments: args}}}},
		{Role: "tool", ToolName: "get_weather", ToolCallID: "call_1", Content: "sunny"},
	}
	tools := api.Tools{{Type: "function", Function: api.ToolFunction{Name: "get_weather"}}}
	stream := false
	think := &api.ThinkValue{Value: true}
	chat(t, c, &api.ChatRequest{Model: "tiny", Messages: msgs, Tools: tools, Format: json.RawMessage(`"json"`),
		Think: think, Options: map[string]any{"temperature": 0}, KeepAlive: keepAlive(0), Stream: &stream})
	mustGenerate(t, c, &api.GenerateRequest{Model: "other", Prompt: "hi", System: "sys", Images: []api.ImageData{[]byte("a"), []byte("b")}})
	unload(t, c, "tiny")
	generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "x", Format: json.RawMessage(`"xml"`)})

	calls := s.Calls("tiny")
	if len(calls) != 2 {
		t.Fatalf("got %d calls, want 2 (the unload not recorded): %+v", len(calls), calls)
	}
	ch, gen := calls[0], calls[1]
	m := ch.Messages
	city, _ := m[2].ToolCalls[0].Function.Arguments.Get("city")
	for _, tt := range []struct {
		what string
		ok   bool
	}{
		{"endpoint and model", ch.Endpoint == "chat" && ch.Model == "tiny"},
		{"messages", len(m) == 4 && m[0].Content == "be brief" && string(m[1].Images[0]) == "img"},
		{"tool calls", len(m[2].ToolCalls) == 1 && m[2].ToolCalls[0].Function.Name == "get_weather" && city == "Paris"},
		{"tool result", m[3].Role == "tool" && m[3].ToolName == "get_weather" && m[3].ToolCallID == "call_1"},
		{"tools", len(ch.Tools) == 1 && ch.Tools[0].Function.Name == "get_weather"},
		{"format", string(ch.Format) == `"json"`},
		{"think", ch.Think != nil && ch.Think.Bool()},
		{"options", ch.Options["temperature"] == float64(0)},
		{"keep_alive", ch.KeepAlive != nil && ch.KeepAlive.Duration == 0},
		{"stream", ch.Stream != nil && !*ch.Stream},
		{"chat images", ch.ImageCount() == 1},
		{"refused generate", gen.Endpoint == "generate" && gen.Prompt == "x" && string(gen.Format) == `"xml"`},
	} {
		if !tt.ok {
			t.Errorf("%s: got %+v", tt.what, ch)
		}
	}
	other := s.Calls("other")
	if len(other) != 1 || other[0].System != "sys" || other[0].Prompt != "hi" || other[0].ImageCount() != 2 || other[0].Messages != nil {
		t.Errorf("other: %+v", other)
	}
	var order []string
	for _, c := range s.Calls("") {
		order = append(order, c.Model+" "+c.Endpoint)
	}
	if got, want := strings.Join(order, ", "), "tiny chat, other generate, tiny generate"; got != want {
		t.Errorf("all calls: %s, want %s", got, want)
	}
	if calls := s.Calls("nope"); len(calls) != 0 {
		t.Errorf("unknown model: %d calls", len(calls))
	}

	for i := range 70 {
		mustGenerate(t, c, &api.GenerateRequest{Model: "other", Prompt: fmt.Sprint(i)})
	}
	other = s.Calls("other")
	if len(other) != 64 || other[0].Prompt != "6" || other[63].Prompt != "69" {
		t.Errorf("got %d calls from %q to %q, want the last 64 (6 to 69)", len(other), other[0].Prompt, other[len(other)-1].Prompt)
	}
}

// TestRespondTo: RespondTo sees the request and wins over Respond.
func TestRespondTo(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
		m.Vision = true
		m.Respond = func(string) []vramguardtest.Chunk { return []vramguardtest.Chunk{{Text: "Respond"}} }
		m.RespondTo = func(r vramguardtest.Call) []vramguardtest.Chunk {
			return []vramguardtest.Chunk{{Text: fmt.Sprintf("%s: %d messages, %d images, format %s", r.Endpoint, len(r.Messages), r.ImageCount(), r.Format)}}
		}
	})}})
	tests := []struct {
		name string
		run  func() (string, error)
		want string
	}{
		{"chat", func() (string, error) {
			msgs := []api.Message{{Role: "user", Content: "a", Images: []api.ImageData{[]byte("i")}}, {Role: "user", Content: "b"}}
			res := chat(t, c, &api.ChatRequest{Model: "tiny", Messages: msgs, Format: json.RawMessage(`{"type":"object"}`)})
			return res.content(), res.err
		}, `chat: 2 messages, 1 images, format {"type":"object"}`},
		{"generate", func() (string, error) {
			res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
			return text(res), res.err
		}, "generate: 0 messages, 0 images, format "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := tt.run(); err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestChatToolCalls: chunks' tool calls reach the chat message, with IDs
// where they had none, streamed or not; generate drops them; every chat
// line is the assistant's.
func TestChatToolCalls(t *testing.T) {
	args := api.NewToolCallFunctionArguments()
	args.Set("city", "Paris")
	chunks := []vramguardtest.Chunk{
		{Thinking: "let me look. "},
		{Text: "Checking."},
		{ToolCalls: []api.ToolCall{{Function: api.ToolCallFunction{Name: "get_weather", Arguments: args}}}},
		{ToolCalls: []api.ToolCall{{ID: "mine", Function: api.ToolCallFunction{Index: 1, Name: "get_time"}}}},
	}
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
		m.Tools, m.Thinking = true, true
		m.Respond = func(string) []vramguardtest.Chunk { return chunks }
	})}})
	tools := api.Tools{{Type: "function", Function: api.ToolFunction{Name: "get_weather"}}}

	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("chat stream=%v", stream), func(t *testing.T) {
			res := chat(t, c, &api.ChatRequest{Model: "tiny", Messages: user("weather?"), Tools: tools, Stream: &stream})
			if res.err != nil {
				t.Fatal(res.err)
			}
			wantLines := len(chunks) + 1 // and done
			if !stream {
				wantLines = 1
			}
			if len(res.lines) != wantLines {
				t.Errorf("%d lines, want %d", len(res.lines), wantLines)
			}
			for i, l := range res.lines {
				if l.Message.Role != "assistant" {
					t.Errorf("line %d: role %q, want assistant", i, l.Message.Role)
				}
			}
			if stream && (res.lines[0].Message.Thinking == "" || res.lines[1].Message.Content != "Checking." || len(res.lines[2].Message.ToolCalls) != 1) {
				t.Errorf("lines %+v: want thinking, content, then a tool call, each in its own", res.lines)
			}
			tcs := res.toolCalls()
			if len(tcs) != 2 {
				t.Fatalf("tool calls %+v, want 2", tcs)
			}
			city, _ := tcs[0].Function.Arguments.Get("city")
			if tcs[0].Function.Name != "get_weather" || city != "Paris" || !strings.HasPrefix(tcs[0].ID, "call_") || len(tcs[0].ID) != len("call_")+8 {
				t.Errorf("first tool call %+v, want get_weather(Paris) with a call_ ID of 8 characters", tcs[0])
			}
			if tcs[1].ID != "mine" || tcs[1].Function.Index != 1 {
				t.Errorf("second tool call %+v, want its own ID and index kept", tcs[1])
			}
			if res.content() != "Checking." {
				t.Errorf("content %q, want Checking.", res.content())
			}
		})
	}
	t.Run("chat think=false", func(t *testing.T) {
		res := chat(t, c, &api.ChatRequest{Model: "tiny", Messages: user("weather?"), Tools: tools, Think: &api.ThinkValue{Value: false}})
		if res.err != nil || len(res.toolCalls()) != 2 || len(res.lines) != len(chunks) {
			t.Errorf("got %d lines, tool calls %+v, %v; want the thinking chunk dropped, the tool calls kept", len(res.lines), res.toolCalls(), res.err)
		}
	})
	if chunks[2].ToolCalls[0].ID != "" {
		t.Error("the server wrote an ID into the test's chunk")
	}
	ids := map[string]bool{}
	for range 2 {
		for _, tc := range chat(t, c, &api.ChatRequest{Model: "tiny", Messages: user("again"), Tools: tools}).toolCalls() {
			if ids[tc.ID] && tc.ID != "mine" {
				t.Errorf("ID %s given twice", tc.ID)
			}
			ids[tc.ID] = true
		}
	}

	t.Run("generate", func(t *testing.T) {
		body := `{"model":"tiny","prompt":"p"}`
		resp, err := http.Post(s.URL().JoinPath("/api/generate").String(), "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		http.DefaultClient.CloseIdleConnections()
		if strings.Contains(string(b), "tool_calls") || strings.Contains(string(b), "get_weather") {
			t.Errorf("generate reply carries tool calls:\n%s", b)
		}
		if !strings.Contains(string(b), `"response":"Checking."`) {
			t.Errorf("generate reply lacks the text:\n%s", b)
		}
	})
}
