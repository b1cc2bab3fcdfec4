package vramguard

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ollama/ollama/api"
)

// ollamaText is an error text of Ollama, with the status it comes with and
// the kind the library must give it. plain is the kind of the same text
// with no status (a line after the stream began, the CLI's stderr); zero
// means the same as want.
type ollamaText struct {
	name  string
	code  int
	msg   string
	want  Kind
	plain Kind
}

// ollamaTexts are the texts of both server generations: `ollama runner`
// (v0.6.5 to v0.24) and llama-server (v0.30 to v0.34.4), as their sources
// word them.
var ollamaTexts = []ollamaText{
	// Runner crashes, load failures and hung loads.
	{name: "v0.34 terminated", code: 500, msg: "llama-server process has terminated: exit status 2: error loading model: unknown model architecture: 'qwen9'", want: KindModelCrash},
	{name: "v0.34 terminated by signal", code: 500, msg: "llama-server process has terminated: signal: killed", want: KindModelCrash},
	{name: "v0.34 no longer running", code: 500, msg: "llama-server process no longer running: exit status 1 ", want: KindModelCrash},
	{name: "v0.17 terminated", code: 500, msg: "llama runner process has terminated: exit status 2", want: KindModelCrash},
	{name: "v0.17 no longer running", code: 500, msg: "llama runner process no longer running: -1 ", want: KindModelCrash},
	{name: "v0.6.5 load failed", code: 500, msg: "unable to load model: /tmp/x/models/blobs/sha256-67d584dc1285cb504ff316b2a56d738977f16d2cd9721b7659bf3c97fda81493", want: KindModelCrash},
	{name: "v0.17 load failed", code: 500, msg: "model failed to load, this may be due to resource limitations or an internal error, check ollama server logs for details", want: KindModelCrash},
	{name: "runner stopped", code: 500, msg: "model runner has unexpectedly stopped, this may be due to resource limitations or an internal error, check ollama server logs for details", want: KindModelCrash},
	{name: "v0.34 load stalled", code: 500, msg: "timed out waiting for llama-server to start - ", want: KindModelCrash},
	{name: "v0.17 load stalled", code: 500, msg: "timed out waiting for llama runner to start - progress 0.00 - ", want: KindModelCrash},
	{name: "runner killed mid-stream", code: 500, msg: "an error was encountered while running the model: unexpected EOF", want: KindModelCrash},
	{name: "v0.34 runner stream reset", code: 500, msg: "error reading llama-server response: read tcp 127.0.0.1:41790->127.0.0.1:40125: read: connection reset by peer", want: KindModelCrash},
	{name: "v0.34 runner refused its health check", code: 500, msg: "connection refused", want: KindModelCrash, plain: KindUnavailable},
	{name: "v0.34 runner hung on its health check", code: 500, msg: "server not responding", want: KindModelCrash, plain: KindServer},
	{name: "incompatible model", code: 500, msg: "llama-server process has terminated: exit status 1: llama_model_load: error loading model: missing tensor 'blk.0.attn_q.weight': this model may be incompatible with your version of Ollama. If you previously pulled this model, try updating it by running `ollama pull tiny:latest`", want: KindModelCrash},

	// Out of memory: wins over every other text.
	{name: "v0.34 startup OOM", code: 500, msg: "llama-server reported out-of-memory during startup: ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB on device 0: cudaMalloc failed: out of memory", want: KindOutOfMemory},
	{name: "v0.34 startup OOM, bare", code: 500, msg: "llama-server reported out-of-memory during startup: llama_init_from_model: failed to initialize the context", want: KindOutOfMemory},
	{name: "v0.34 graph reservation", code: 500, msg: "llama-server process has terminated: exit status 1: graph_reserve: failed to allocate compute buffers\nllama_init_from_model: failed to reserve graph", want: KindOutOfMemory},
	{name: "failed to reserve graph alone", code: 500, msg: "failed to reserve graph", want: KindOutOfMemory},
	{name: "stalled load that ran out of memory", code: 500, msg: "timed out waiting for llama-server to start - CUDA error: out of memory", want: KindOutOfMemory},
	{name: "v0.34 Vulkan", code: 500, msg: "llama-server process has terminated: exit status 1: ggml_vulkan: Device memory allocation of size 4294967296 failed: vk::Device::allocateMemory: ErrorOutOfDeviceMemory", want: KindOutOfMemory},
	{name: "system memory", code: 500, msg: "model requires more system memory (9.6 GiB) than is available (4.1 GiB)", want: KindOutOfMemory},
	{name: "full model on GPU", code: 500, msg: "unable to load full model on GPU", want: KindOutOfMemory},
	{name: "v0.17 memory layout", code: 500, msg: "memory layout cannot be allocated with num_gpu = 99", want: KindOutOfMemory},
	{name: "v0.17 allocate", code: 500, msg: "failed to allocate memory for model", want: KindOutOfMemory},

	// Input longer than the context: the caller's input.
	{name: "v0.34 input length", code: 400, msg: "the input length exceeds the context length", want: KindInvalidInput},
	{name: "v0.34 prompt longer than context", code: 400, msg: "the prompt is longer than the context length currently available to the model; shorten the prompt, adjust the context length in settings, or use a model with a longer context length", want: KindInvalidInput},
	{name: "v0.34 truncation impossible", code: 500, msg: "input after truncation exceeds maximum context length", want: KindInvalidInput},
	{name: "llama-server's own 400", code: 400, msg: `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5012,"n_ctx":4096}}`, want: KindInvalidInput},

	// A broken install: no runner binary. The path holds "model": still
	// no missing model.
	{name: "v0.34 no llama-server", code: 500, msg: "error starting llama-server: llama-server binary not found (checked: /usr/local/lib/ollama/llama-server, /opt/models/build/lib/ollama/llama-server). Run 'cmake -S llama/server --preset cpu && cmake --build --preset cpu' first", want: KindServer},

	// Transient.
	{name: "busy", code: 503, msg: "server busy, please try again.  maximum pending requests exceeded", want: KindTransient},
	{name: "v0.34 no slots", code: 500, msg: "no slots available after 10 retries", want: KindTransient},
	{name: "v0.34 repeat limit", code: 500, msg: "prediction aborted, token repeat limit reached", want: KindTransient},
	{name: "canceled by another", code: 499, msg: "request canceled", want: KindTransient},

	// Unchanged texts.
	{name: "not found", code: 404, msg: "model 'nope' not found", want: KindNotFound},
	{name: "not found, pull", code: 404, msg: `model "nope" not found, try pulling it first`, want: KindNotFound},
	{name: "bad option", code: 400, msg: `option "temperature" must be of type float32`, want: KindInvalidInput},
}

func (o ollamaText) plainKind() Kind {
	if o.plain != KindUnknown {
		return o.plain
	}
	return o.want
}

func TestClassifyOllamaTexts(t *testing.T) {
	for _, tt := range ollamaTexts {
		t.Run(tt.name, func(t *testing.T) {
			if got := classifyStatus(tt.code, tt.msg); got != tt.want {
				t.Errorf("classifyStatus(%d, %q) = %v, want %v", tt.code, tt.msg, got, tt.want)
			}
			if got := classify(fmt.Errorf("wrapped: %w", errors.New(tt.msg))); got != tt.plainKind() {
				t.Errorf("classify(plain %q) = %v, want %v", tt.msg, got, tt.plainKind())
			}
			if got := classifyMessage("Error: " + tt.msg); got != tt.plainKind() {
				t.Errorf("classifyMessage(CLI stderr %q) = %v, want %v", tt.msg, got, tt.plainKind())
			}
		})
	}
}

// errorServer answers /api/ps and /api/generate with text in the shape
// that tests ask for.
func errorServer(t *testing.T, code int, msg string, midStream bool) *OllamaClient {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"error": msg})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if midStream && r.URL.Path == "/api/generate" {
			// Output began: the error arrives as a line of a 200 reply.
			fmt.Fprintln(w, `{"model":"tiny","response":"a castle","done":false}`)
			w.Write(append(body, '\n'))
			return
		}
		w.WriteHeader(code)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(Options{Host: srv.URL, KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestOllamaTextsThroughTheClient sends every text through the real
// api.Client in the three shapes of FIELD_NOTES §1 Trap 3: a non-streaming
// reply (StatusError without Status), a streaming reply that failed before
// any output (StatusError with Status), and an error line after output
// began (a plain error).
func TestOllamaTextsThroughTheClient(t *testing.T) {
	for _, tt := range ollamaTexts {
		t.Run(tt.name, func(t *testing.T) {
			c := errorServer(t, tt.code, tt.msg, false)
			_, err := c.Running(t.Context())
			if !errors.Is(err, tt.want) {
				t.Errorf("non-streaming: %v (kind %v), want %v", err, KindOf(err), tt.want)
			}
			var se api.StatusError
			if !errors.As(err, &se) || se.StatusCode != tt.code {
				t.Errorf("non-streaming: %v does not keep the api.StatusError %d", err, tt.code)
			}

			_, err = c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, nil)
			if !errors.Is(err, tt.want) {
				t.Errorf("streaming, before output: %v (kind %v), want %v", err, KindOf(err), tt.want)
			}
			if !errors.As(err, &se) || se.Status == "" {
				t.Errorf("streaming, before output: %v is not an api.StatusError with Status", err)
			}

			c = errorServer(t, tt.code, tt.msg, true)
			_, err = c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, nil)
			if !errors.Is(err, tt.plainKind()) {
				t.Errorf("streaming, after output: %v (kind %v), want %v", err, KindOf(err), tt.plainKind())
			}
			if errors.As(err, &se) {
				t.Errorf("streaming, after output: %v is an api.StatusError, want a plain error", err)
			}
		})
	}
}

// TestUnexpectedEOFCrashOrCut tells the two "unexpected EOF"s apart. The
// runner killed during a generation makes Ollama send the line "an error
// was encountered while running the model: unexpected EOF": a crash. A
// connection to Ollama cut mid-reply makes the api client (v0.30 and
// later) return io.ErrUnexpectedEOF itself: a transient incomplete
// stream, whatever text it renders as.
func TestUnexpectedEOFCrashOrCut(t *testing.T) {
	line := `{"model":"tiny","response":"a castle","done":false}` + "\n"
	crash := line + `{"error":"an error was encountered while running the model: unexpected EOF"}` + "\n"
	tests := []struct {
		name     string
		body     string
		tail     error
		want     Kind
		cut      bool // ErrIncompleteStream
		notCrash bool
	}{
		{"runner killed: the server's line", crash, nil, KindModelCrash, false, false},
		{"connection cut at a line end", line, io.ErrUnexpectedEOF, KindTransient, true, true},
		{"connection cut before any line", "", io.ErrUnexpectedEOF, KindTransient, true, true},
		{"connection cut, wrapped", line, fmt.Errorf("http: read body: %w", io.ErrUnexpectedEOF), KindTransient, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := streamFromBody(200, []byte(tt.body), tt.tail)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v (kind %v), want %v", err, KindOf(err), tt.want)
			}
			if tt.cut && !errors.Is(err, ErrIncompleteStream) {
				t.Errorf("%v does not wrap ErrIncompleteStream", err)
			}
			if tt.notCrash && errors.Is(err, KindModelCrash) {
				t.Errorf("%v: a cut connection taken for a crash", err)
			}
		})
	}
	for _, tt := range []struct {
		err  error
		want Kind
	}{
		{io.ErrUnexpectedEOF, KindTransient},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), KindTransient},
		{errors.New("unexpected EOF"), KindTransient},
		{errors.New("Error: unexpected EOF"), KindTransient},
		{errors.New("an error was encountered while running the model: unexpected EOF"), KindModelCrash},
	} {
		if got := classify(tt.err); got != tt.want {
			t.Errorf("classify(%q) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestStreamCutOverTCP: a real connection closed by the server after one
// line of a chunked reply (the api client returns io.ErrUnexpectedEOF from
// v0.30) is a transient incomplete stream, never a crash.
func TestStreamCutOverTCP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintln(w, `{"model":"tiny","response":"a castle","done":false}`)
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close() // no final chunk: the body is cut
	}))
	defer srv.Close()
	c, err := NewClient(Options{Host: srv.URL, KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var chunks int
	_, err = c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload,
		func(Chunk) error { chunks++; return nil })
	if !errors.Is(err, KindTransient) || !errors.Is(err, ErrIncompleteStream) || errors.Is(err, KindModelCrash) {
		t.Fatalf("got %v (kind %v), want a transient incomplete stream", err, KindOf(err))
	}
	if chunks != 1 {
		t.Errorf("%d chunks before the cut, want 1", chunks)
	}
}
