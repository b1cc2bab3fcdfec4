package vramguard

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/wire"
	"github.com/vramguard/vramguard/internal/wire/wiretest"
)

// Fuzz targets for every parser of untrusted text in this package. The
// NDJSON stream handling is fed through GenerateStreaming with a transport
// that answers with the fuzzer's bytes, so the client's own reply reader
// (internal/wire: lines of any length, context arrays, {"error"} lines,
// status errors) and its classification are part of what is fuzzed;
// FuzzStreamMatchesAPI (ndjson_test.go) compares it with
// api.Client.Generate on the same bytes, and internal/wire fuzzes the
// reader alone (FuzzReplyReader).

// bodyTransport answers every request with status and body, whose read
// ends with tail (nil: a clean end).
type bodyTransport struct {
	status int
	body   []byte
	tail   error
}

func (b *bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	var body io.Reader = bytes.NewReader(b.body)
	if b.tail != nil {
		body = io.MultiReader(body, errReader{b.tail})
	}
	return &http.Response{
		StatusCode: b.status,
		Status:     strconv.Itoa(b.status) + " " + http.StatusText(b.status),
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"application/x-ndjson"}},
		Body:    io.NopCloser(body),
		Request: r,
	}, nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// streamFromBody runs GenerateStreaming against a server that answers
// with status and body, through the client's own reply reader (the client
// owns its HTTP client).
func streamFromBody(status int, body []byte, tail error) (*Generation, []Chunk, error) {
	hc := &http.Client{Transport: &bodyTransport{status: status, body: body, tail: tail}}
	return streamWith(Options{Host: "http://fuzz.invalid:11434", HTTPClient: hc, KeepModelsOnClose: true}, false)
}

// streamChatFromBody is streamFromBody for a chat.
func streamChatFromBody(status int, body []byte, tail error) (*Generation, []Chunk, error) {
	hc := &http.Client{Transport: &bodyTransport{status: status, body: body, tail: tail}}
	return streamWith(Options{Host: "http://fuzz.invalid:11434", HTTPClient: hc, KeepModelsOnClose: true}, true)
}

// streamFromBodyAPI is streamFromBody through api.Client.Generate
// (Options.API).
func streamFromBodyAPI(status int, body []byte, tail error) (*Generation, []Chunk, error) {
	u, _ := url.Parse("http://fuzz.invalid:11434")
	hc := &http.Client{Transport: &bodyTransport{status: status, body: body, tail: tail}}
	return streamWith(Options{API: api.NewClient(u, hc), KeepModelsOnClose: true}, false)
}

func streamWith(opts Options, chat bool) (*Generation, []Chunk, error) {
	c, err := NewClient(opts)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	var chunks []Chunk
	fn := func(ch Chunk) error {
		chunks = append(chunks, ch)
		return nil
	}
	var gen *Generation
	if chat {
		gen, err = c.ChatStreaming(context.Background(), &ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "x"}}}, KeepAliveUnload, fn)
	} else {
		gen, err = c.GenerateStreaming(context.Background(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, fn)
	}
	return gen, chunks, err
}

// hasDoneLine reports whether body holds a line that decodes as a
// done:true reply.
func hasDoneLine(body []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, len(body)+1)
	for sc.Scan() {
		var r api.GenerateResponse
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Done {
			return true
		}
	}
	return false
}

func validKind(k Kind) bool { return k > KindUnknown && k <= KindInternal }

// streamSeeds adds the seeds the reply reader's fuzz target (internal/wire)
// also starts from.
func streamSeeds(f *testing.F) {
	for _, s := range wiretest.StreamSeeds() {
		f.Add([]byte(s.Body), s.Status, s.Tail)
	}
}

// FuzzGenerateStream: whatever a server sends, GenerateStreaming returns
// success only when a done:true line came through (the callback saw it),
// and otherwise an *Error of a valid kind, never KindCanceled (nothing was
// canceled), never a panic.
func FuzzGenerateStream(f *testing.F) {
	streamSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte, status uint16, tail uint8) {
		checkStream(t, body, status, tail, streamFromBody)
	})
}

// FuzzChatStream: the same rules for a chat's reply, whose text is in
// message.content (the generation seeds teach it the shapes of lines).
func FuzzChatStream(f *testing.F) {
	streamSeeds(f)
	line := func(v any) string { b, _ := json.Marshal(v); return string(b) + "\n" }
	f.Add([]byte(line(api.ChatResponse{Message: api.Message{Role: "assistant", Content: "a castle"}})+
		line(api.ChatResponse{Message: api.Message{ToolCalls: []api.ToolCall{{Function: api.ToolCallFunction{Name: "f"}}}}})+
		line(api.ChatResponse{Done: true, DoneReason: "stop"})), uint16(200), uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, status uint16, tail uint8) {
		checkStream(t, body, status, tail, streamChatFromBody)
	})
}

func checkStream(t *testing.T, body []byte, status uint16, tail uint8, stream func(int, []byte, error) (*Generation, []Chunk, error)) {
	code := 200
	if status >= 200 && status < 600 && (status < 300 || status >= 400) {
		code = int(status) // no 1xx (transport-level) or 3xx (redirects)
	}
	var tailErr error
	switch tail % 4 {
	case 1:
		tailErr = syscall.ECONNRESET
	case 2:
		tailErr = io.ErrUnexpectedEOF
	case 3:
		tailErr = errors.New("http2: stream closed")
	}
	gen, chunks, err := stream(code, body, tailErr)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || !validKind(e.Kind) || e.Kind == KindCanceled {
			t.Fatalf("error %v (%T, kind %v): want an *Error of a valid kind", err, err, KindOf(err))
		}
		if gen != nil {
			t.Fatalf("a generation with the error %v", err)
		}
		return
	}
	if code >= 400 {
		t.Fatalf("success from a %d reply", code)
	}
	if len(chunks) == 0 || !slicesContainsDone(chunks) || !hasDoneLine(body) {
		t.Fatalf("success without a done line: %d chunks, body %.200q", len(chunks), body)
	}
	var text strings.Builder
	var calls int
	for _, ch := range chunks {
		text.WriteString(ch.Text)
		calls += len(ch.ToolCalls)
	}
	if gen.Text != text.String() || gen.Chunks != len(chunks) || len(gen.ToolCalls) != calls {
		t.Fatalf("generation text %q (%d chunks, %d tool calls) differs from the chunks %q (%d, %d)",
			gen.Text, gen.Chunks, len(gen.ToolCalls), text.String(), len(chunks), calls)
	}
}

func slicesContainsDone(chunks []Chunk) bool {
	for _, ch := range chunks {
		if ch.Done {
			return true
		}
	}
	return false
}

// TestStreamHugeLine: a line over 8 MiB. api.Client.Generate gives up on
// it (bufio.ErrTooLong), which the library used to report as a transient
// incomplete stream whatever the line held (issue #14, item 3): a finished
// generation whose done line carried a long context array, and garbage
// that the same request would get again, both became retryable failures.
// With the client's own reader, a line that is long because of its context
// array is read, and a long line that is not a reply is KindServer, not
// retryable. Through Options.API the api client's limit remains, and so
// does the transient incomplete stream: the documented limit of that path.
func TestStreamHugeLine(t *testing.T) {
	garbage := append(bytes.Repeat([]byte{'x'}, 9<<20), '\n')
	withGarbage := append([]byte(`{"response":"a"}`+"\n"), garbage...)
	withGarbage = append(withGarbage, `{"done":true}`+"\n"...)

	var done bytes.Buffer
	done.WriteString(`{"response":"a"}` + "\n" + `{"response":"","done":true,"done_reason":"stop","context":[`)
	for i := range 2_000_000 { // 9 MB of token ids
		fmt.Fprintf(&done, "%d,", 10000+i%90000)
	}
	done.WriteString(`1],"eval_count":1}` + "\n")

	t.Run("garbage", func(t *testing.T) {
		_, _, err := streamFromBody(200, withGarbage, nil)
		if !errors.Is(err, KindServer) || !errors.Is(err, wire.ErrMalformedLine) || KindOf(err).Retryable() {
			t.Fatalf("got %v, want a KindServer malformed line, not retryable", err)
		}
	})
	t.Run("context", func(t *testing.T) {
		gen, _, err := streamFromBody(200, done.Bytes(), nil)
		if err != nil || gen.Text != "a" || gen.Metrics.EvalCount != 1 || gen.DoneReason != "stop" {
			t.Fatalf("got %+v, %v; want the generation", gen, err)
		}
	})
	t.Run("api client", func(t *testing.T) {
		for _, body := range [][]byte{withGarbage, done.Bytes()} {
			_, _, err := streamFromBodyAPI(200, body, nil)
			if !errors.Is(err, KindTransient) || !errors.Is(err, ErrIncompleteStream) {
				t.Fatalf("got %v, want a transient incomplete stream", err)
			}
		}
	})
}

// TestStreamCutMidLine is the regression case of the stream fuzzer's
// first finding: a connection cut in the middle of a line. bufio.Scanner
// hands the partial line over at the read error, the api client fails to
// decode it and returns it as errors.New(partial line), and the library
// classified that as KindServer: a dropped connection looked like a
// permanent server error (not retried, no fallback). It must be a
// transient incomplete stream.
func TestStreamCutMidLine(t *testing.T) {
	full := `{"model":"tiny","response":"a castle","done":false}` + "\n" + `{"model":"tiny","response":" at dawn","done":false}` + "\n"
	for _, tail := range []error{syscall.ECONNRESET, io.ErrUnexpectedEOF, nil} {
		for _, cut := range []int{1, 20, len(full)/2 + 5, len(full) - 2} {
			_, _, err := streamFromBody(200, []byte(full[:cut]), tail)
			if !errors.Is(err, KindTransient) {
				t.Errorf("cut at %d, then %v: got %v (kind %v), want transient", cut, tail, err, KindOf(err))
			}
		}
	}
}

var kindTexts = []string{
	"out of memory", "CUDA error", "llama runner process has terminated", "model runner has unexpectedly stopped",
	"server busy", "model 'x' not found", "connection refused", "request canceled", "unexpected EOF",
	// The llama-server generation (Ollama v0.30 to v0.34.4).
	"llama-server process has terminated: exit status 2", "llama-server process no longer running: exit status 1 ",
	"failed to reserve graph", "llama-server reported out-of-memory during startup: ", "the input length exceeds the context length",
	"timed out waiting for llama-server to start - ", "prediction aborted, token repeat limit reached",
}

// FuzzClassifyMessage: any text gets a valid kind, case does not matter
// (for ASCII text), and an out-of-memory text wins over everything else.
func FuzzClassifyMessage(f *testing.F) {
	for _, s := range kindTexts {
		f.Add(s, 500)
	}
	f.Add("", 0)
	f.Add("\xff\x00", -1)
	f.Add("model \"x\" not found, try pulling it first", 404)
	f.Fuzz(func(t *testing.T, msg string, code int) {
		k := classifyMessage(msg)
		if !validKind(k) {
			t.Fatalf("classifyMessage(%q) = %v", msg, k)
		}
		if ks := classifyStatus(code, msg); !validKind(ks) {
			t.Fatalf("classifyStatus(%d, %q) = %v", code, msg, ks)
		}
		if kc := classify(errors.New(msg)); !validKind(kc) {
			t.Fatalf("classify(errors.New(%q)) = %v", msg, kc)
		}
		if kc := classify(api.StatusError{StatusCode: code, ErrorMessage: msg}); !validKind(kc) {
			t.Fatalf("classify(StatusError{%d, %q}) = %v", code, msg, kc)
		}
		if isASCII(msg) {
			if up := classifyMessage(strings.ToUpper(msg)); up != k {
				t.Fatalf("classifyMessage(%q) = %v but %v in upper case", msg, k, up)
			}
		}
		if k := classifyMessage(msg + " CUDA error: out of memory"); k != KindOutOfMemory {
			t.Fatalf("an out-of-memory text after %q gives %v", msg, k)
		}
		if k := classifyStatus(code, "out of memory "+msg); k != KindOutOfMemory {
			t.Fatalf("an out-of-memory text with status %d gives %v", code, k)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] > unicode.MaxASCII {
			return false
		}
	}
	return true
}

// FuzzNormalizeModelName: no panic, idempotent, lower case, no space at
// either end.
func FuzzNormalizeModelName(f *testing.F) {
	for _, s := range []string{"tiny", "TINY", "library/tiny", "registry.ollama.ai/library/tiny", "user/tiny:q4",
		"hf.co/Org/Repo:Q4_K_M", "localhost:5000/m", "tiny@sha256:abc", " llama3.2:3b ", "", "@", "a/", "https://x/y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		n := NormalizeModelName(name)
		if again := NormalizeModelName(n); again != n {
			t.Fatalf("not idempotent: %q -> %q -> %q", name, n, again)
		}
		if strings.TrimSpace(n) != n {
			t.Fatalf("%q -> %q has space at an end", name, n)
		}
		for i := 0; i < len(n); i++ {
			if 'A' <= n[i] && n[i] <= 'Z' {
				t.Fatalf("%q -> %q has upper case", name, n)
			}
		}
	})
}

// TestNormalizeModelNameIdempotent holds the fuzzer's findings: prefixes
// that reappear once an outer one or surrounding space is stripped.
func TestNormalizeModelNameIdempotent(t *testing.T) {
	for _, s := range []string{
		"registry.ollama.ai/library/registry.ollama.ai/tiny",
		"http://https://tiny",
		"library/ tiny",
		"library/library/tiny",
		"https:// tiny",
	} {
		n := NormalizeModelName(s)
		if again := NormalizeModelName(n); again != n {
			t.Errorf("NormalizeModelName(%q) = %q, then %q", s, n, again)
		}
	}
}

// FuzzParseKeepAlive: no panic; a failure is KindInvalidInput; a success
// is a well-formed value whose String reads back as the same value, and a
// positive duration of at least a millisecond never turns into "unload".
func FuzzParseKeepAlive(f *testing.F) {
	for _, s := range []string{"", "default", "0", "0s", "unload", "300", "1.5", "2m", "-1", "-5m", "forever",
		"soon", "NaN", "1e300", "5 minutes", "9223372036.854775", "0x1p-2", "+Inf", "1_000", "2562047h47m16.854s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ka, err := ParseKeepAlive(s)
		if err != nil {
			if KindOf(err) != KindInvalidInput {
				t.Fatalf("ParseKeepAlive(%q): %v, want invalid input", s, err)
			}
			return
		}
		if verr := ka.validate(); verr != nil {
			t.Fatalf("ParseKeepAlive(%q) = malformed %#v", s, ka)
		}
		back, err := ParseKeepAlive(ka.String())
		if err != nil || back != ka {
			t.Fatalf("ParseKeepAlive(%q) = %v (%#v); its String reads back as %#v, %v", s, ka, ka, back, err)
		}
		d, sent := ka.Duration()
		t2 := strings.ToLower(strings.TrimSpace(s))
		if n, perr := strconv.ParseFloat(t2, 64); perr == nil && n >= 0.001 && n < 1e9 {
			if !sent || d < time.Millisecond {
				t.Fatalf("ParseKeepAlive(%q) = %v: %v seconds became %v", s, ka, n, d)
			}
		}
		if pd, perr := time.ParseDuration(t2); perr == nil && pd >= time.Millisecond {
			if !sent || d != pd.Truncate(time.Millisecond) {
				t.Fatalf("ParseKeepAlive(%q) = %v, want %v", s, ka, pd.Truncate(time.Millisecond))
			}
		}
	})
}
