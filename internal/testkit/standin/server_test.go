package standin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// fast are knobs without delays, for tests that do not measure time.
var fast = standin.Knobs{LoadMS: -1, TokenMS: -1}

// startLoaded starts a stand-in with a model and waits until it is ready.
func startLoaded(t *testing.T, k standin.Knobs, args ...string) (*proc, env) {
	t.Helper()
	e, _, _ := knobsEnv(t, k)
	p := startProc(t, e, append([]string{"--model", writeModel(t, 4096)}, args...)...)
	waitHealthy(t, p.url, 10*time.Second)
	return p, e
}

func TestHealthLoadingThenReady(t *testing.T) {
	const loadMS = 1000 // leaves a busy machine time for the first GET
	e, _, _ := knobsEnv(t, standin.Knobs{LoadMS: loadMS})
	model := writeModel(t, 4096)
	begin := time.Now()
	p := startProc(t, e, "--model", model)

	code, body := get(t, p.url+"/health")
	if code != http.StatusServiceUnavailable || body != `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`+"\n" {
		t.Fatalf("/health while loading: %d %q", code, body)
	}
	if code, body := post(t, p.url+"/completion", `{"prompt":"x"}`); code != http.StatusServiceUnavailable || !strings.Contains(body, "Loading model") {
		t.Fatalf("/completion while loading: %d %q", code, body)
	}

	waitHealthy(t, p.url, 30*time.Second)
	if elapsed := time.Since(begin); elapsed < loadMS*time.Millisecond {
		t.Fatalf("healthy after %v, before load_ms %dms", elapsed, loadMS)
	}
	if code, body := get(t, p.url+"/health"); code != http.StatusOK || body != `{"status":"ok"}`+"\n" {
		t.Fatalf("/health when ready: %d %q", code, body)
	}
	if !strings.Contains(p.stderr.String(), "main: model loaded") {
		t.Errorf("stderr lacks the loaded line:\n%s", p.stderr)
	}
}

func TestCompletionLength(t *testing.T) {
	p, _ := startLoaded(t, fast)
	for _, tc := range []struct {
		name     string
		nPredict any // nil: absent
		want     int
		stopType string
	}{
		{"one", 1, 1, "limit"},
		{"five", 5, 5, "limit"},
		{"exactly eos_after", standin.DefaultEOSAfter, standin.DefaultEOSAfter, "limit"},
		{"beyond eos_after", 100, standin.DefaultEOSAfter, "eos"},
		{"zero", 0, standin.DefaultEOSAfter, "eos"},
		{"minus one", -1, standin.DefaultEOSAfter, "eos"},
		{"absent", nil, standin.DefaultEOSAfter, "eos"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"prompt": "count", "stream": true}
			if tc.nPredict != nil {
				body["n_predict"] = tc.nPredict
			}
			code, s := readStream(t.Context(), t, p.url+"/completion", body)
			if code != http.StatusOK || s.err != nil {
				t.Fatalf("status %d, err %v", code, s.err)
			}
			toks, final := s.tokens(), s.final(t)
			if len(toks) != tc.want || final["stop_type"] != tc.stopType {
				t.Fatalf("%d tokens, stop_type %v; want %d, %s", len(toks), final["stop_type"], tc.want, tc.stopType)
			}
			timings := final["timings"].(map[string]any)
			if timings["predicted_n"] != float64(tc.want) || timings["prompt_n"] != float64(len("count")+1) {
				t.Fatalf("timings %v", timings)
			}
			for _, tok := range toks {
				if !strings.HasPrefix(tok, " ") || len(tok) < 2 {
					t.Fatalf("token %q is not a space and a word", tok)
				}
			}
			if last := s.events[len(s.events)-1]; last["stop"] != true || last["content"] != "" {
				t.Fatalf("last event %v is not the final one", last)
			}
		})
	}
}

// text runs a streamed completion and returns its tokens joined.
func text(t *testing.T, url string, body map[string]any) string {
	t.Helper()
	body["stream"] = true
	code, s := readStream(t.Context(), t, url+"/completion", body)
	if code != http.StatusOK || s.err != nil {
		t.Fatalf("status %d, err %v", code, s.err)
	}
	return strings.Join(s.tokens(), "")
}

func TestCompletionDeterministic(t *testing.T) {
	p, _ := startLoaded(t, fast)
	a := text(t, p.url, map[string]any{"prompt": "same", "seed": 42, "n_predict": 8})
	b := text(t, p.url, map[string]any{"prompt": "same", "seed": 42, "n_predict": 8})
	c := text(t, p.url, map[string]any{"prompt": "same", "seed": 43, "n_predict": 8})
	d := text(t, p.url, map[string]any{"prompt": "other", "seed": 42, "n_predict": 8})
	if a != b {
		t.Fatalf("same prompt and seed, different text: %q, %q", a, b)
	}
	if a == c || a == d {
		t.Fatalf("seed or prompt does not change the text: %q, %q, %q", a, c, d)
	}
	// The non-streaming answer has the same text.
	code, body := post(t, p.url+"/completion", map[string]any{"prompt": "same", "seed": 42, "n_predict": 8})
	var res struct {
		Content  string `json:"content"`
		Stop     bool   `json:"stop"`
		StopType string `json:"stop_type"`
	}
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusOK || err != nil {
		t.Fatalf("non-streaming: %d %q %v", code, body, err)
	}
	if res.Content != a || !res.Stop || res.StopType != "limit" {
		t.Fatalf("non-streaming %+v, want content %q", res, a)
	}
}

func TestCompletionTokenPrompt(t *testing.T) {
	// Ollama sends a prompt it truncated as token ids.
	p, _ := startLoaded(t, fast)
	ids := []int{1, 3 + 'h', 3 + 'i'}
	code, s := readStream(t.Context(), t, p.url+"/completion", map[string]any{"prompt": ids, "stream": true, "n_predict": 2})
	if code != http.StatusOK || len(s.tokens()) != 2 {
		t.Fatalf("status %d, %d tokens", code, len(s.tokens()))
	}
	if f := s.final(t); f["prompt"] != "<s>hi" || f["tokens_evaluated"] != float64(3) {
		t.Fatalf("final %v", f)
	}
}

func TestStopWord(t *testing.T) {
	p, _ := startLoaded(t, fast)
	full := text(t, p.url, map[string]any{"prompt": "stop", "n_predict": 10})
	words := strings.Fields(full)
	stop := words[3] // stop at the 4th word
	if i := slices.Index(words, stop); i < 3 {
		stop = words[i]
	}
	want := full[:strings.Index(full, stop)]
	code, s := readStream(t.Context(), t, p.url+"/completion", map[string]any{"prompt": "stop", "n_predict": 10, "stream": true, "stop": []string{stop}})
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if got := strings.Join(s.tokens(), ""); got != want {
		t.Fatalf("text %q, want %q (stop %q)", got, want, stop)
	}
	if f := s.final(t); f["stop_type"] != "word" || f["stopping_word"] != stop {
		t.Fatalf("final %v", f)
	}
}

func TestContext(t *testing.T) {
	t.Run("prompt too long", func(t *testing.T) {
		p, _ := startLoaded(t, fast, "-c", "32")
		code, body := post(t, p.url+"/completion", map[string]any{"prompt": strings.Repeat("a", 31), "stream": true})
		want := `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":32,"n_ctx":32}}` + "\n"
		if code != http.StatusBadRequest || body != want {
			t.Fatalf("got %d %q, want 400 %q", code, body, want)
		}
		code, body = post(t, p.url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("a", 32)}}})
		if code != http.StatusBadRequest || !strings.Contains(body, "exceed_context_size_error") {
			t.Fatalf("chat: got %d %q", code, body)
		}
	})
	t.Run("full context ends with limit", func(t *testing.T) {
		// -c 32 shared by 2 slots: 16 per slot; 10 prompt tokens leave 6.
		p, _ := startLoaded(t, fast, "-c", "32", "-np", "2")
		code, s := readStream(t.Context(), t, p.url+"/completion", map[string]any{"prompt": "123456789", "stream": true, "n_predict": 20})
		if code != http.StatusOK || len(s.tokens()) != 6 || s.final(t)["stop_type"] != "limit" {
			t.Fatalf("status %d, %d tokens; want 6 and limit", code, len(s.tokens()))
		}
	})
	t.Run("context shift keeps generating", func(t *testing.T) {
		p, _ := startLoaded(t, fast, "-c", "16", "--context-shift")
		code, s := readStream(t.Context(), t, p.url+"/completion", map[string]any{"prompt": "123456789", "stream": true, "n_predict": 20})
		if code != http.StatusOK || len(s.tokens()) != 20 {
			t.Fatalf("status %d, %d tokens; want 20", code, len(s.tokens()))
		}
	})
}

func TestChatCompletions(t *testing.T) {
	p, _ := startLoaded(t, fast)
	msgs := []map[string]string{{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}}
	code, s := readStream(t.Context(), t, p.url+"/v1/chat/completions", map[string]any{"messages": msgs, "stream": true, "n_predict": 4})
	if code != http.StatusOK || !s.done {
		t.Fatalf("status %d, [DONE] %v, err %v", code, s.done, s.err)
	}
	var content []string
	var finish []any
	for _, e := range s.events {
		c := e["choices"].([]any)[0].(map[string]any)
		if d, _ := c["delta"].(map[string]any)["content"].(string); d != "" {
			content = append(content, d)
		}
		finish = append(finish, c["finish_reason"])
	}
	last := s.events[len(s.events)-1]
	usage, _ := last["usage"].(map[string]any)
	if len(content) != 4 || finish[len(finish)-1] != "length" || usage["completion_tokens"] != float64(4) {
		t.Fatalf("content %q, finish reasons %v, usage %v", content, finish, usage)
	}
	for _, f := range finish[:len(finish)-1] {
		if f != nil {
			t.Fatalf("finish_reason %v before the last chunk", f)
		}
	}

	// The prompt is the ChatML rendering /apply-template returns.
	code, body := post(t, p.url+"/apply-template", map[string]any{"messages": msgs})
	want := "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	var tmpl struct{ Prompt string }
	if err := json.Unmarshal([]byte(body), &tmpl); code != http.StatusOK || err != nil || tmpl.Prompt != want {
		t.Fatalf("apply-template: %d %q", code, body)
	}
	if usage["prompt_tokens"] != float64(len(want)+1) {
		t.Fatalf("prompt_tokens %v, want %d", usage["prompt_tokens"], len(want)+1)
	}

	// Without n_predict the model ends the sequence itself.
	code, body = post(t, p.url+"/v1/chat/completions", map[string]any{"messages": msgs})
	var res struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct{ Content string }
		}
	}
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusOK || err != nil || len(res.Choices) != 1 {
		t.Fatalf("non-streaming chat: %d %q", code, body)
	}
	if c := res.Choices[0]; c.FinishReason != "stop" || len(strings.Fields(c.Message.Content)) != standin.DefaultEOSAfter {
		t.Fatalf("non-streaming chat: %+v", c)
	}
}

// chatContent returns the streamed content of a chat answer and the last
// chunk's finish_reason.
func chatContent(t *testing.T, s stream) (string, any) {
	t.Helper()
	var b strings.Builder
	var finish any
	for _, e := range s.events {
		c := e["choices"].([]any)[0].(map[string]any)
		if d, _ := c["delta"].(map[string]any)["content"].(string); d != "" {
			b.WriteString(d)
		}
		finish = c["finish_reason"]
	}
	return b.String(), finish
}

func TestStructuredOutput(t *testing.T) {
	p, _ := startLoaded(t, fast)
	schema := map[string]any{
		"type":       "object",
		"properties": map[string]any{"positive": map[string]any{"type": "string"}, "negative": map[string]any{"type": "string"}},
		"required":   []string{"positive", "negative"},
	}
	msgs := []map[string]string{{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}}
	// What Ollama v0.34.4 sends for /api/chat with a schema "format".
	responseFormat := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "schema", "schema": schema}}

	wantObject := func(t *testing.T, got string) {
		t.Helper()
		var v map[string]string
		if err := json.Unmarshal([]byte(got), &v); err != nil || len(v) != 2 || v["positive"] == "" || v["negative"] == "" {
			t.Fatalf("answer %q is not an instance of the schema (%v)", got, err)
		}
	}

	t.Run("chat", func(t *testing.T) {
		code, s := readStream(t.Context(), t, p.url+"/v1/chat/completions", map[string]any{"messages": msgs, "stream": true, "n_predict": 64, "response_format": responseFormat})
		got, finish := chatContent(t, s)
		if code != http.StatusOK || !s.done || finish != "stop" {
			t.Fatalf("status %d, [DONE] %v, finish %v, err %v", code, s.done, finish, s.err)
		}
		wantObject(t, got)
		if n := len(s.events) - 2; n < 5 {
			t.Fatalf("%q came in %d content chunks, want it streamed in pieces", got, n)
		}
		_, again := readStream(t.Context(), t, p.url+"/v1/chat/completions", map[string]any{"messages": msgs, "stream": true, "response_format": responseFormat})
		if a, _ := chatContent(t, again); a != got {
			t.Fatalf("same request, different answer: %q then %q", got, a)
		}
	})
	t.Run("chat_json_object", func(t *testing.T) {
		code, s := readStream(t.Context(), t, p.url+"/v1/chat/completions", map[string]any{"messages": msgs, "stream": true, "response_format": map[string]any{"type": "json_object"}})
		if got, finish := chatContent(t, s); code != http.StatusOK || got != "{}" || finish != "stop" {
			t.Fatalf("status %d, answer %q, finish %v", code, got, finish)
		}
	})
	t.Run("chat_cut_by_n_predict", func(t *testing.T) {
		_, s := readStream(t.Context(), t, p.url+"/v1/chat/completions", map[string]any{"messages": msgs, "stream": true, "n_predict": 2, "response_format": responseFormat})
		// Two pieces: "{" and the first key (Go's maps marshal keys in
		// order, so "negative" comes first).
		if got, finish := chatContent(t, s); finish != "length" || got != `{"negative":` {
			t.Fatalf("answer %q, finish %v; want the first 2 pieces and \"length\"", got, finish)
		}
	})
	t.Run("completion", func(t *testing.T) {
		// What Ollama v0.34.4 sends for /api/generate with a schema "format".
		code, s := readStream(t.Context(), t, p.url+"/completion", map[string]any{"prompt": "hi", "stream": true, "n_predict": 64, "json_schema": schema})
		if code != http.StatusOK {
			t.Fatalf("status %d, err %v", code, s.err)
		}
		wantObject(t, strings.Join(s.tokens(), ""))
		if f := s.final(t); f["stop_type"] != "eos" || f["tokens_predicted"] != float64(len(s.tokens())) {
			t.Fatalf("final event %v", f)
		}
	})
	t.Run("unsupported_schema", func(t *testing.T) {
		got := text(t, p.url, map[string]any{"prompt": "hi", "n_predict": 3, "json_schema": map[string]any{"anyOf": []any{}}})
		if len(strings.Fields(got)) != 3 {
			t.Fatalf("got %q, want 3 free words", got)
		}
		waitFor(t, 5*time.Second, "the stand-in to say it ignored the schema", func() bool {
			return strings.Contains(p.stderr.String(), "json schema not followed")
		})
	})
}

func TestMediaRefused(t *testing.T) {
	p, _ := startLoaded(t, fast)
	png := "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAAEElEQVR4nGL6z8AACAAA//8DCQECWLbVUAAAAABJRU5ErkJggg=="
	image := []map[string]any{{"role": "user", "content": []map[string]any{
		{"type": "text", "text": "what is this?"},
		{"type": "image_url", "image_url": map[string]string{"url": "data:image/png;base64," + png}},
	}}}
	audio := []map[string]any{{"role": "user", "content": []map[string]any{
		{"type": "input_audio", "input_audio": map[string]string{"data": "AAAA", "format": "wav"}},
	}}}
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		code       int
		msg        string
	}{
		{"chat_image", "/v1/chat/completions", map[string]any{"messages": image, "stream": true}, 500, "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"},
		{"chat_audio", "/v1/chat/completions", map[string]any{"messages": audio}, 500, "audio input is not supported - hint: if this is unexpected, you may need to provide the mmproj"},
		{"apply_template_image", "/apply-template", map[string]any{"messages": image}, 500, "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"},
		{"completion_multimodal", "/completion", map[string]any{"prompt": map[string]any{"prompt_string": "<m>x", "multimodal_data": []string{png}}, "stream": true}, 400, "Multimodal data provided, but model does not support multimodal requests."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, p.url+tc.path, tc.body)
			var e struct {
				Error struct {
					Code    int
					Message string
				}
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || code != tc.code || e.Error.Code != tc.code || e.Error.Message != tc.msg {
				t.Fatalf("HTTP %d %s; want %d %q", code, body, tc.code, tc.msg)
			}
		})
	}
	// A prompt object without media is still an ordinary prompt.
	if got := text(t, p.url, map[string]any{"prompt": map[string]any{"prompt_string": "x"}, "n_predict": 2}); len(strings.Fields(got)) != 2 {
		t.Fatalf("prompt_string without multimodal_data: %q", got)
	}
}

func TestTokenizeDetokenize(t *testing.T) {
	p, _ := startLoaded(t, fast)
	const s = "héllo <s> wörld"
	code, body := post(t, p.url+"/tokenize", map[string]any{"content": s, "add_special": true})
	var tok struct{ Tokens []int }
	if err := json.Unmarshal([]byte(body), &tok); code != http.StatusOK || err != nil {
		t.Fatalf("tokenize: %d %q", code, body)
	}
	if len(tok.Tokens) != len(s)+1 || tok.Tokens[0] != 1 {
		t.Fatalf("tokens %v: want <s> and one per byte", tok.Tokens)
	}
	code, body = post(t, p.url+"/detokenize", map[string]any{"tokens": tok.Tokens[1:]})
	var detok struct{ Content string }
	if err := json.Unmarshal([]byte(body), &detok); code != http.StatusOK || err != nil || detok.Content != s {
		t.Fatalf("detokenize: %d %q, want %q", code, body, s)
	}
}

func TestEmbeddings(t *testing.T) {
	p, _ := startLoaded(t, fast, "-c", "64")
	code, body := post(t, p.url+"/v1/embeddings", map[string]any{"input": "abc"})
	var res struct {
		Data []struct {
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusOK || err != nil || len(res.Data) != 1 {
		t.Fatalf("embeddings: %d %q", code, body)
	}
	var norm float64
	for _, v := range res.Data[0].Embedding {
		norm += v * v
	}
	if math.Abs(norm-1) > 1e-9 || res.Usage.PromptTokens != 4 {
		t.Fatalf("norm² %v, prompt_tokens %d", norm, res.Usage.PromptTokens)
	}
	if code, body := post(t, p.url+"/v1/embeddings", map[string]any{"input": strings.Repeat("x", 64)}); code != http.StatusBadRequest || !strings.Contains(body, "exceeds the available context size") {
		t.Fatalf("long input: %d %q", code, body)
	}
}

func TestKnobsReadAtEachRequest(t *testing.T) {
	e, knobs, _ := knobsEnv(t, fast)
	p := startProc(t, e, "--model", writeModel(t, 100))
	waitHealthy(t, p.url, 10*time.Second)
	count := func() int {
		code, s := readStream(t.Context(), t, p.url+"/completion", map[string]any{"prompt": "k", "stream": true, "n_predict": 100})
		if code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
		return len(s.tokens())
	}
	if n := count(); n != standin.DefaultEOSAfter {
		t.Fatalf("%d tokens with default knobs, want %d", n, standin.DefaultEOSAfter)
	}
	k := fast
	k.EOSAfter = 7
	if err := standin.WriteKnobs(knobs, k); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 7 {
		t.Fatalf("%d tokens after eos_after 7 was written, want 7", n)
	}
	// A knobs file that does not parse means the defaults, with a warning.
	if err := writeRaw(knobs, `{"eos_after": "many"}`); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != standin.DefaultEOSAfter {
		t.Fatalf("%d tokens with a broken knobs file, want the default %d", n, standin.DefaultEOSAfter)
	}
	if s := p.stderr.String(); !strings.Contains(s, "using default knobs") || strings.Contains(s, "error:") {
		t.Fatalf("want one warning without \"error:\" (Ollama would take it for the runner's error):\n%s", s)
	}
}

func TestPerModelKnobs(t *testing.T) {
	model := writeModel(t, 100) // .../sha256-0123456789abcdef
	k := fast
	k.EOSAfter = 9
	k.Models = map[string]standin.Knobs{"0123456789": {EOSAfter: 3}, "not-this-one": {EOSAfter: 5}}
	e, _, _ := knobsEnv(t, k)
	p := startProc(t, e, "--model", model)
	waitHealthy(t, p.url, 10*time.Second)
	if n := len(strings.Fields(text(t, p.url, map[string]any{"prompt": "m"}))); n != 3 {
		t.Fatalf("%d tokens, want the model's override 3", n)
	}
}

func TestHangCompletionEndsWithClient(t *testing.T) {
	k := fast
	k.Hang = standin.HangCompletion
	p, _ := startLoaded(t, k)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	result := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/completion", strings.NewReader(`{"prompt":"x","stream":true}`))
		res, err := client().Do(req)
		if err == nil {
			res.Body.Close()
		}
		result <- err
	}()
	waitFor(t, 10*time.Second, "the request to be held", func() bool {
		return strings.Contains(p.stderr.String(), "hang=completion: holding task")
	})
	select {
	case err := <-result:
		t.Fatalf("a hung request was answered: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-result; err == nil {
		t.Fatal("the cancelled request succeeded")
	}
	// The handler itself ends when its client goes away, long before the
	// process stops.
	waitFor(t, 10*time.Second, "the held request to be released", func() bool {
		return strings.Contains(p.stderr.String(), "cancel_tasks: cancel task")
	})
}

func TestStreamStopsWhenClientLeaves(t *testing.T) {
	k := standin.Knobs{LoadMS: -1, TokenMS: 20, EOSAfter: 10000}
	p, _ := startLoaded(t, k)
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/completion", strings.NewReader(`{"prompt":"x","stream":true,"n_predict":10000}`))
	res, err := client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := res.Body.Read(buf); err != nil { // the first token
		t.Fatal(err)
	}
	cancel()
	res.Body.Close()
	var decoded int
	waitFor(t, 10*time.Second, "the generation to stop", func() bool {
		m := regexp.MustCompile(`cancel_tasks: cancel task.*\n.*n_decoded = (\d+)`).FindStringSubmatch(p.stderr.String())
		if m == nil {
			return false
		}
		decoded, _ = strconv.Atoi(m[1])
		return true
	})
	if decoded >= 10000 {
		t.Fatalf("generated %d tokens after the client left", decoded)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestUnknownFlagsIgnored(t *testing.T) {
	e, _, _ := knobsEnv(t, fast)
	model := writeModel(t, 3<<20)
	p := startProc(t, e,
		"--frobnicate", "7", "--weird-switch", "-Z", "-x", "-1", "--spec-type", "draft-mtp",
		"--model", model, "--keep", "-1", "-c", "48", "--no-webui", "--unknown=value", "--flash-attn", "auto")
	waitHealthy(t, p.url, 10*time.Second)
	// --model and -c were found among the unknown flags: the model loaded
	// and the context is 48.
	if code, body := post(t, p.url+"/completion", map[string]any{"prompt": strings.Repeat("a", 47)}); code != http.StatusBadRequest || !strings.Contains(body, `"n_ctx":48`) {
		t.Fatalf("got %d %q, want the 48-token context", code, body)
	}
	if !strings.Contains(p.stderr.String(), "CPU model buffer size =     3.00 MiB") {
		t.Fatalf("no buffer line for the 3 MiB model:\n%s", p.stderr)
	}
}

func TestListDevicesAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args         []string
		stdout, errs string
	}{
		{[]string{"--list-devices", "--offline", "--verbose"}, "Available devices:\n", ""},
		{[]string{"--version"}, "", "version: " + standin.Build},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			var stdout, stderr syncBuffer
			listened := false
			code := standin.Run(t.Context(), standin.Config{
				Args: tc.args, Stdout: &stdout, Stderr: &stderr,
				Getenv:   env{}.get,
				OnListen: func(net.Addr) { listened = true },
			})
			if code != 0 || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.errs) || listened {
				t.Fatalf("code %d, listened %v, stdout %q, stderr %q", code, listened, stdout.String(), stderr.String())
			}
		})
	}
}

func TestDiscoveryStart(t *testing.T) {
	// Ollama's device discovery: no --model, read stderr up to system_info.
	p := startProc(t, env{}, "--no-webui", "--offline", "--verbose")
	if !regexp.MustCompile(`(?m)^system_info: n_threads = \d+`).MatchString(p.stderr.String()) {
		t.Fatalf("no system_info line before listening:\n%s", p.stderr)
	}
	if code, body := get(t, p.url+"/health"); code != http.StatusOK || !strings.Contains(body, `"ok"`) {
		t.Fatalf("/health: %d %q", code, body)
	}
}

// bufferSizeRegex is Ollama v0.34.4's (llm/llama_server.go), which sets the
// size /api/ps shows.
var bufferSizeRegex = regexp.MustCompile(`(?m)(?:^|\n)[^\n:]*?([A-Za-z_][A-Za-z0-9_]*):\s+(\S+)\s+(model|KV|compute|output|RS)\s+buffer size\s*=\s*([\d.]+)\s*MiB`)

func TestModelBufferLine(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fileSize  int
		knobBytes int64
		want      uint64 // what Ollama computes from the line
	}{
		{"file size", 114848, 0, 115343}, // "0.11 MiB"
		{"model_bytes", 100, 5 << 20, 5 << 20},
		{"model_bytes, GiB", 100, 3 << 30, 3 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := fast
			k.ModelBytes = tc.knobBytes
			e, _, _ := knobsEnv(t, k)
			p := startProc(t, e, "--model", writeModel(t, tc.fileSize))
			waitHealthy(t, p.url, 10*time.Second)
			m := bufferSizeRegex.FindAllStringSubmatch(p.stderr.String(), -1)
			if len(m) != 1 || m[0][2] != "CPU" || m[0][3] != "model" {
				t.Fatalf("want one CPU model buffer line, got %q in\n%s", m, p.stderr)
			}
			mib, _ := strconv.ParseFloat(m[0][4], 64)
			if got := uint64(mib * 1024 * 1024); got != tc.want {
				t.Fatalf("Ollama would read %d bytes, want %d", got, tc.want)
			}
		})
	}
}

// ollamaStatus copies how Ollama v0.34.4 captures a runner's last error
// (llm/status.go: errorPrefixes, outOfMemorySubstrings, statusErrorLine),
// because importing github.com/ollama/ollama/llm would add dependencies to
// the module. TestRealOllama checks the same texts against the real code.
var (
	ollamaErrorPrefixes = []string{"mlx:", "MLX:", "panic:", "fatal error:", "error:", "Error:", "CUDA error", "ROCm error",
		"cudaMalloc failed", "\"ERR\"", "error loading model", "GGML_ASSERT", "Deepseek2 does not support K-shift",
		"signal arrived during cgo execution", "llama_init_from_model:"}
	ollamaOOMSubstrings = []string{"out of memory", "out of device memory", "cudaMalloc failed", "hipMalloc failed",
		"failed to allocate", "allocation failed", "not enough memory", "insufficient memory",
		"vk_error_out_of_device_memory", "erroroutofmemory", "failed to reserve graph"}
)

func isOutOfMemory(msg string) bool {
	msg = strings.ToLower(msg)
	for _, s := range ollamaOOMSubstrings {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// ollamaError returns the error text Ollama would report for stderr.
func ollamaError(stderr string) string {
	var errs []string
	for _, line := range strings.Split(stderr, "\n") {
		line = strings.TrimRight(line, " \t\r")
		start, prefix := -1, ""
		for _, p := range ollamaErrorPrefixes {
			if i := strings.Index(line, p); i >= 0 && (start < 0 || i < start) {
				start, prefix = i, p
			}
		}
		switch {
		case start >= 0:
			errs = append(errs, prefix+strings.TrimRight(line[start+len(prefix):], " \t\r"))
		case line != "" && isOutOfMemory(line):
			errs = append(errs, line)
		}
	}
	return strings.Join(errs, "\n")
}

func TestLoadFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		knobs   standin.Knobs
		model   bool // pass an existing --model
		lastErr string
		oom     bool
	}{
		{"oom_at_load", standin.Knobs{OOMAtLoad: true, ModelBytes: 8 << 30}, true,
			"cudaMalloc failed: out of memory\nalloc_tensor_range: failed to allocate CUDA0 buffer of size 8589934592\nerror loading model: unable to allocate CUDA0 buffer", true},
		{"exit_at_load", standin.Knobs{ExitAtLoad: true}, true,
			"error loading model: vramguard stand-in: exit_at_load knob set", false},
		{"missing model file", standin.Knobs{}, false,
			"error loading model: llama_model_loader: failed to load model from", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.knobs.LoadMS = -1
			e, _, log := knobsEnv(t, tc.knobs)
			model := "/nonexistent/model.gguf"
			if tc.model {
				model = writeModel(t, 100)
			}
			p := startProc(t, e, "--model", model)
			if code := p.wait(t, 10*time.Second); code != standin.ExitLoad {
				t.Fatalf("exit status %d, want %d", code, standin.ExitLoad)
			}
			got := ollamaError(p.stderr.String())
			if !strings.HasPrefix(got, tc.lastErr) || isOutOfMemory(got) != tc.oom {
				t.Fatalf("Ollama's last error %q (out of memory %v), want %q (%v)", got, isOutOfMemory(got), tc.lastErr, tc.oom)
			}
			ev, err := standin.ReadEvents(log)
			if err != nil || len(ev) < 2 || ev[len(ev)-1].Event != standin.EventExit || ev[len(ev)-1].Code != standin.ExitLoad {
				t.Fatalf("events %+v, %v: want an exit event last", ev, err)
			}
		})
	}
}

func TestOOMHealth(t *testing.T) {
	e, _, _ := knobsEnv(t, standin.Knobs{LoadMS: -1, OOMAtLoad: true, OOMHealth: true})
	p := startProc(t, e, "--model", writeModel(t, 100))
	var code int
	var body string
	waitFor(t, 10*time.Second, "/health to fail", func() bool {
		code, body = get(t, p.url+"/health")
		return code != http.StatusServiceUnavailable
	})
	if code != http.StatusInternalServerError || !strings.Contains(body, `"type":"server_error"`) {
		t.Fatalf("/health: %d %q", code, body)
	}
	if !isOutOfMemory(ollamaError(p.stderr.String())) {
		t.Fatalf("stderr not classified as out of memory:\n%s", p.stderr)
	}
	select {
	case <-p.exited:
		t.Fatalf("exited with %d; oom_health keeps the process up", p.code)
	default:
	}
}

func TestCrashAfterTokensInProcess(t *testing.T) {
	k := fast
	k.CrashAfterTokens = 3
	e, _, log := knobsEnv(t, k)
	p := startProc(t, e, "--model", writeModel(t, 100))
	waitHealthy(t, p.url, 10*time.Second)
	code, s := readStream(t.Context(), t, p.url+"/completion", map[string]any{"prompt": "boom", "stream": true, "n_predict": 10})
	if code != http.StatusOK || len(s.events) != 3 || len(s.tokens()) != 3 || !isUnexpectedEOF(s.err) {
		t.Fatalf("status %d, %d events, %d tokens, err %v; want 3 tokens and an unexpected EOF", code, len(s.events), len(s.tokens()), s.err)
	}
	if code := p.wait(t, 10*time.Second); code != standin.ExitCrash {
		t.Fatalf("exit status %d, want %d", code, standin.ExitCrash)
	}
	if got := ollamaError(p.stderr.String()); got != "GGML_ASSERT(vramguard stand-in: crash_after_tokens = 3) failed" {
		t.Fatalf("Ollama's last error %q", got)
	}
	ev, err := standin.ReadEvents(log)
	if err != nil {
		t.Fatal(err)
	}
	if last := ev[len(ev)-1]; last.Event != standin.EventExit || last.Code != standin.ExitCrash || last.Reason != "crash_after_tokens" {
		t.Fatalf("last event %+v", last)
	}
}

func TestRequestLog(t *testing.T) {
	e, _, log := knobsEnv(t, fast)
	model := writeModel(t, 100)
	p := startProc(t, e, "--model", model, "--frob")
	waitHealthy(t, p.url, 10*time.Second)
	post(t, p.url+"/tokenize", `{ "content" : "abc" }`)
	post(t, p.url+"/detokenize", "not json")
	big := `{"content":"` + strings.Repeat("z", standin.MaxLoggedBody) + `"}`
	post(t, p.url+"/tokenize", big)

	ev, err := standin.ReadEvents(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) < 4 {
		t.Fatalf("%d events", len(ev))
	}
	start := ev[0]
	wantArgs := []string{"--host", "127.0.0.1", "--port", "0", "--model", model, "--frob"}
	if start.Event != standin.EventStart || !slices.Equal(start.Args, wantArgs) || start.Model() != model || start.PID == 0 || start.Time.IsZero() {
		t.Fatalf("start event %+v", start)
	}
	reqs := ev[len(ev)-3:]
	for i, want := range []struct{ path, body string }{
		{"/tokenize", `{"content":"abc"}`},
		{"/detokenize", `"not json"`},
		{"/tokenize", ""},
	} {
		r := reqs[i]
		if r.Event != standin.EventRequest || r.Method != http.MethodPost || r.Path != want.path || (want.body != "" && string(r.Body) != want.body) {
			t.Fatalf("request event %d: %+v", i, r)
		}
	}
	if big := reqs[2]; !big.BodyTruncated || len(big.Body) < standin.MaxLoggedBody || !json.Valid(big.Body) {
		t.Fatalf("big body: truncated %v, %d bytes", big.BodyTruncated, len(big.Body))
	}
	health := 0
	for _, e := range ev {
		if e.Path == "/health" {
			health++
		}
	}
	if health == 0 {
		t.Fatal("no /health request logged")
	}
}

func ExampleWriteKnobs() {
	dir, _ := os.MkdirTemp("", "knobs")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "knobs.json")

	// Runners of the model whose blob path contains "fe95b4" fail to load
	// with out-of-memory; all others stream a token every 10 ms.
	err := standin.WriteKnobs(path, standin.Knobs{
		TokenMS: 10,
		Models:  map[string]standin.Knobs{"fe95b4": {OOMAtLoad: true}},
	})
	fmt.Println(err)
	k, err := standin.ReadKnobs(path)
	fmt.Println(k.ForModel("/models/blobs/sha256-fe95b4aa").OOMAtLoad, k.ForModel("/models/blobs/sha256-0000").OOMAtLoad, err)
	// Output:
	// <nil>
	// true false <nil>
}

func ExampleRun() {
	dir, _ := os.MkdirTemp("", "standin")
	defer os.RemoveAll(dir)
	model := filepath.Join(dir, "model.gguf")
	_ = os.WriteFile(model, make([]byte, 2<<20), 0o644)

	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan int)
	go func() {
		done <- standin.Run(ctx, standin.Config{
			Args:     []string{"--model", model, "--port", "0", "-c", "64"},
			Getenv:   func(string) string { return "" }, // default knobs, no log
			OnListen: func(a net.Addr) { addr <- a },
		})
	}()
	url := "http://" + (<-addr).String()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		res, err := hc.Get(url + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, _ := hc.Post(url+"/completion", "application/json", strings.NewReader(`{"prompt":"hi","n_predict":3,"seed":7}`))
	var out struct {
		Content  string `json:"content"`
		StopType string `json:"stop_type"`
	}
	_ = json.NewDecoder(res.Body).Decode(&out)
	res.Body.Close()
	fmt.Printf("%d words, stop_type %s\n", len(strings.Fields(out.Content)), out.StopType)
	cancel()
	fmt.Println("exit status", <-done)
	// Output:
	// 3 words, stop_type limit
	// exit status 0
}

func writeRaw(path, s string) error {
	tmp := path + ".raw"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
