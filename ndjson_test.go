package vramguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/wire"
)

// Tests of the client's own reply reader (ndjson.go, internal/wire),
// through GenerateStreaming against httptest servers. The tests of the
// reader alone, where a small buffer or cap makes a case cheap, are in
// internal/wire.

// streamTestClient starts a server whose /api/generate runs write, and a
// client for it that owns its HTTP client (so the own reader is used).
func streamTestClient(t *testing.T, write func(w http.ResponseWriter)) *OllamaClient {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/api/generate" {
			http.NotFound(w, r)
			return
		}
		write(w)
	}))
	t.Cleanup(srv.Close)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	c, err := NewClient(Options{Host: srv.URL, HTTPClient: &http.Client{Transport: tr}, KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if !c.readsOwnStream() {
		t.Fatal("the client does not use its own reader")
	}
	return c
}

// repeatTo writes block until n bytes went out, and returns how many did.
func repeatTo(w io.Writer, block []byte, n int) int {
	sent := 0
	for sent < n {
		k, err := w.Write(block[:min(len(block), n-sent)])
		sent += k
		if err != nil {
			break
		}
	}
	return sent
}

const doneMetrics = `"done":true,"done_reason":"length","total_duration":2000000000,"load_duration":30000000,` +
	`"prompt_eval_count":128,"prompt_eval_duration":1000000,"eval_count":4,"eval_duration":1500000}` + "\n"

// TestStreamHugeContext: the done line of a 10 MB prompt carries a 60 MB
// context array (issue #14: 60,000,320 bytes seen). The generation
// succeeds with the text and metrics of the stream, and the client
// allocates a small fraction of the array: it checks the array as it reads
// and keeps none of it.
func TestStreamHugeContext(t *testing.T) {
	const contextBytes = 60_000_000
	block := bytes.Repeat([]byte("123456,"), 64<<10/7)
	sent := 0
	c := streamTestClient(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, word := range []string{"a", " castle", " at", " dawn"} {
			fmt.Fprintf(w, `{"model":"tiny","created_at":"2026-11-30T10:00:00Z","response":%q,"done":false}`+"\n", word)
		}
		_, _ = io.WriteString(w, `{"model":"tiny","created_at":"2026-11-30T10:00:00Z","response":"","context":[`)
		sent = repeatTo(w, block, contextBytes)
		_, _ = io.WriteString(w, `7],`+doneMetrics)
	})
	req := &GenerateRequest{Model: "tiny", Prompt: "x"}
	// Warm the connection and the code paths, then measure a second call.
	if _, err := c.GenerateStreaming(t.Context(), req, KeepAliveUnload, nil); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	gen, err := c.GenerateStreaming(t.Context(), req, KeepAliveUnload, nil)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("%v (kind %v)", err, KindOf(err))
	}
	if sent < contextBytes {
		t.Fatalf("the server sent %d bytes of context, want %d", sent, contextBytes)
	}
	m := gen.Metrics
	if gen.Text != "a castle at dawn" || gen.Chunks != 5 || gen.DoneReason != "length" || m.EvalCount != 4 ||
		m.PromptEvalCount != 128 || m.LoadDuration != 30_000_000 || m.TotalDuration != 2_000_000_000 || !gen.Loaded {
		t.Errorf("generation %+v", gen)
	}
	// Client and server share the process: the bound covers both.
	const bound = 4 << 20
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > bound {
		t.Errorf("allocated %d bytes for a %d-byte context array, want at most %d", alloc, sent, bound)
	} else {
		t.Logf("allocated %d bytes for a %d-byte context array", alloc, sent)
	}
}

// TestStreamFieldTooLarge: a line whose response text is over the cap
// fails with ErrReplyTooLarge, KindServer, not retryable, once the cap is
// reached (the rest of the line is not read).
func TestStreamFieldTooLarge(t *testing.T) {
	block := bytes.Repeat([]byte("a"), 1<<20)
	c := streamTestClient(t, func(w http.ResponseWriter) {
		_, _ = io.WriteString(w, `{"response":"a"}`+"\n"+`{"response":"`)
		repeatTo(w, block, wire.MaxLine+1)
		_, _ = io.WriteString(w, `",`+doneMetrics)
	})
	_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, nil)
	if !errors.Is(err, ErrReplyTooLarge) || !errors.Is(err, KindServer) || KindOf(err).Retryable() {
		t.Fatalf("got %v (kind %v), want KindServer wrapping ErrReplyTooLarge", err, KindOf(err))
	}
}

// TestStreamCutLongLine: a connection cut inside a long line, clean or by
// a reset, is a transient incomplete stream, as inside a short one.
func TestStreamCutLongLine(t *testing.T) {
	var done bytes.Buffer
	done.WriteString(`{"response":"a"}` + "\n" + `{"response":"","context":[`)
	for range 300_000 {
		done.WriteString("4321,")
	}
	done.WriteString(`1],` + doneMetrics)
	long := `{"response":"a"}` + "\n" + `{"response":"` + strings.Repeat("z", 200_000) + `","done":true}` + "\n"
	for _, body := range []string{done.String(), long} {
		for _, cut := range []int{len(body) / 2, len(body) - 3} {
			for _, tail := range []error{nil, syscall.ECONNRESET, io.ErrUnexpectedEOF} {
				_, _, err := streamFromBody(200, []byte(body[:cut]), tail)
				if !errors.Is(err, KindTransient) || !errors.Is(err, ErrIncompleteStream) {
					t.Errorf("cut at %d of %d, then %v: got %v, want a transient incomplete stream", cut, len(body), tail, err)
				}
				if tail != nil && !errors.Is(err, tail) {
					t.Errorf("cut at %d, then %v: %v does not wrap it", cut, tail, err)
				}
			}
		}
		if _, _, err := streamFromBody(200, []byte(body), nil); err != nil {
			t.Errorf("the whole body: %v", err)
		}
	}
}

// TestStreamErrorLine: an {"error"} line after output began is the same
// plain error as through api.Client.Generate, classified alike.
func TestStreamErrorLine(t *testing.T) {
	for _, msg := range []string{
		"an error was encountered while running the model: unexpected EOF",
		"CUDA error: out of memory",
		"prediction aborted, token repeat limit reached",
		"something else",
	} {
		line, _ := json.Marshal(map[string]string{"error": msg})
		body := []byte(`{"response":"a"}` + "\n" + string(line) + "\n")
		_, chunks, err := streamFromBody(200, body, nil)
		_, _, apiErr := streamFromBodyAPI(200, body, nil)
		var e *Error
		if !errors.As(err, &e) || e.Err.Error() != msg || e.Kind != classifyMessage(msg) || len(chunks) != 1 {
			t.Errorf("%q: got %v after %d chunks, want %v wrapping the text", msg, err, len(chunks), classifyMessage(msg))
		}
		if KindOf(err) != KindOf(apiErr) || err.Error() != apiErr.Error() {
			t.Errorf("%q: own reader %v, api client %v", msg, err, apiErr)
		}
	}
}

// TestStreamStatusErrors: a status of 400 and up gives the same
// api.StatusError (Status set: the streaming shape) or
// api.AuthorizationError as api.Client.Generate, so the kinds are the same.
func TestStreamStatusErrors(t *testing.T) {
	for _, tt := range []struct {
		status int
		body   string
		kind   Kind
	}{
		{404, `{"error":"model 'tiny' not found"}`, KindNotFound},
		{400, `{"error":"the input length exceeds the context length"}` + "\n", KindInvalidInput},
		{500, `{"error":"llama-server process has terminated: exit status 2"}`, KindModelCrash},
		{500, `{"error":"model requires more system memory (8 GiB) than is available"}`, KindOutOfMemory},
		{503, `{"error":"server busy, please try again.  maximum pending requests exceeded"}`, KindTransient},
		{502, "<html><body>502 Bad Gateway</body></html>\r\n<p>nginx</p>\n", KindTransient},
		{500, `{"detail":"no error member"}`, KindServer},
		{401, `{"error":"unauthorized","signin_url":"https://ollama.com/connect"}`, KindServer},
		{401, `not json`, KindServer},
	} {
		_, _, err := streamFromBody(tt.status, []byte(tt.body), nil)
		_, _, apiErr := streamFromBodyAPI(tt.status, []byte(tt.body), nil)
		if KindOf(err) != tt.kind || KindOf(apiErr) != tt.kind {
			t.Errorf("%d %q: own reader %v, api client %v; want %v", tt.status, tt.body, err, apiErr, tt.kind)
		}
		var se, apiSE api.StatusError
		var ae, apiAE api.AuthorizationError
		switch {
		case errors.As(apiErr, &apiSE):
			if !errors.As(err, &se) || se != apiSE || se.Status == "" {
				t.Errorf("%d %q: own reader %#v, api client %#v", tt.status, tt.body, err, apiSE)
			}
		case errors.As(apiErr, &apiAE):
			if !errors.As(err, &ae) || ae != apiAE {
				t.Errorf("%d %q: own reader %#v, api client %#v", tt.status, tt.body, err, apiAE)
			}
		default:
			t.Errorf("%d %q: the api client returned %v", tt.status, tt.body, apiErr)
		}
	}
	// An empty body: the api client sees no line and returns nil (a
	// stream without done); the own reader keeps the status.
	_, _, err := streamFromBody(404, nil, nil)
	var se api.StatusError
	if !errors.Is(err, KindNotFound) || !errors.As(err, &se) || se.StatusCode != 404 {
		t.Errorf("empty 404: %v", err)
	}
}

// TestStreamMalformed: a complete line that is not a reply is KindServer
// and not retryable (the same request would get it again); a line cut
// short at the end of the body is a transient incomplete stream.
func TestStreamMalformed(t *testing.T) {
	ok := `{"response":"a"}` + "\n"
	for _, tt := range []struct {
		body string
		kind Kind
	}{
		{ok + "\x00\xff<html>not json\n", KindServer},
		{ok + "\x00\xff garbage", KindServer},
		{ok + `{"response":42,"done":"yes"}` + "\n", KindServer},
		{ok + `{"done":true}{"done":true}` + "\n", KindServer},
		{ok + `{"done":true}{"done":true}`, KindServer},
		{ok + `{"done":true,"context":[1.5]}` + "\n", KindServer},
		{ok + `{"done":true,"context":["a"],"error":"x"}` + "\n", KindServer},
		{ok + `{"done":true,"context":[99999999999999999999]}` + "\n", KindServer},
		{ok + "[1,2,3]\n", KindServer},
		{ok + `{"done":tr`, KindTransient},
		{ok + `{"response":"a castle`, KindTransient},
	} {
		_, _, err := streamFromBody(200, []byte(tt.body), nil)
		if KindOf(err) != tt.kind || (tt.kind == KindServer && !errors.Is(err, wire.ErrMalformedLine)) ||
			(tt.kind == KindTransient && !errors.Is(err, ErrIncompleteStream)) {
			t.Errorf("%q: got %v (kind %v), want %v", tt.body, err, KindOf(err), tt.kind)
		}
	}
	// Blank lines are skipped; a line without newline at the end counts.
	gen, _, err := streamFromBody(200, []byte("\n"+ok+"  \r\n\n"+`{"done":true}`), nil)
	if err != nil || gen.Text != "a" {
		t.Errorf("blank lines: %v, %v", gen, err)
	}
}

// FuzzStreamMatchesAPI: whatever api.Client.Generate makes a success of,
// the own reader makes the same success of: the same chunks, text and
// metrics (it also succeeds where the api client cannot: lines over 8 MiB,
// blank lines).
func FuzzStreamMatchesAPI(f *testing.F) {
	streamSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte, status uint16, tail uint8) {
		code := 200
		if status >= 200 && status < 600 && (status < 300 || status >= 400) {
			code = int(status)
		}
		var tailErr error
		if tail%2 == 1 {
			tailErr = syscall.ECONNRESET
		}
		apiGen, apiChunks, apiErr := streamFromBodyAPI(code, body, tailErr)
		gen, chunks, err := streamFromBody(code, body, tailErr)
		if apiErr != nil {
			return
		}
		if err != nil {
			t.Fatalf("the api client succeeded, the own reader failed: %v", err)
		}
		if len(chunks) != len(apiChunks) || gen.Text != apiGen.Text || gen.Thinking != apiGen.Thinking ||
			gen.DoneReason != apiGen.DoneReason || gen.Chunks != apiGen.Chunks || !sameMetrics(gen.Metrics, apiGen.Metrics) {
			t.Fatalf("own reader %+v, api client %+v", gen, apiGen)
		}
		for i := range chunks {
			a, b := chunks[i], apiChunks[i]
			if a.Text != b.Text || a.Thinking != b.Thinking || a.Done != b.Done || a.Index != b.Index || a.Bytes != b.Bytes {
				t.Fatalf("chunk %d: own reader %+v, api client %+v", i, a, b)
			}
		}
	})
}

func sameMetrics(a, b api.Metrics) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestReadsOwnStream: the own reader only when the client owns its HTTP
// client and the api client would not sign the request.
func TestReadsOwnStream(t *testing.T) {
	for _, tt := range []struct {
		opts Options
		auth string
		own  bool
	}{
		{Options{Host: "127.0.0.1:11434"}, "", true},
		{Options{Host: "127.0.0.1:11434", HTTPClient: &http.Client{}}, "", true},
		{Options{Host: "https://ollama.com"}, "", false},
		{Options{Host: "127.0.0.1:11434"}, "1", false},
		{Options{API: api.NewClient(nil, http.DefaultClient)}, "", false},
	} {
		t.Setenv("OLLAMA_AUTH", tt.auth)
		c, err := NewClient(tt.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.readsOwnStream(); got != tt.own {
			t.Errorf("%+v, OLLAMA_AUTH=%q: own reader %v, want %v", tt.opts, tt.auth, got, tt.own)
		}
		_ = c.Close()
	}
}
