package vramguard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// ErrFormatMismatch: the CLI fallback's text for a request with Format does
// not satisfy it. It is the cause inside a *FallbackTextError, which keeps
// the text. With Format "json" the text must parse as one JSON value; with
// a schema it must also have the schema's basic shape: the JSON type its
// "type" names (a name or a list of names) and, for an object, the
// properties its "required" lists, checked again for the values under
// "properties" and "items"; other keywords are not checked.
//
// The streaming path never needs the check, because the server's done line
// says that the reply ended. The CLI does not: a text that is not JSON is a
// reply that ended early (servers constrain the sampling to the format, so
// a complete reply parses), for example one the runner cut without a done
// line, which the streaming path reports as KindTransient wrapping
// ErrIncompleteStream. It is KindTransient here too. Valid JSON of the
// wrong shape is no cut reply but one the server did not fit to the
// schema, and asking again gets the same: KindServer, not retryable. A
// text the library cut at num_predict is not checked: its DoneReason
// "length" says it is cut, as the server's does on the streaming path.
// Like every failure of the fallback, it is returned joined to the first
// attempt's cause, under the first attempt's kind (KindTimeout or
// KindTransient); errors.Is(err, KindServer) still finds the fallback's.
var ErrFormatMismatch = errors.New("text does not match the request's format")

// FallbackTextError is the cause of a CLI fallback that ran to its end but
// whose text the library refused (ErrFormatMismatch). Text is what the CLI
// wrote to stdout, less its trailing newlines; the ChunkFunc has received
// it already, without the Done chunk. Reach it through the returned
// *Error with errors.As.
type FallbackTextError struct {
	Text string
	Err  error // why, wrapping ErrFormatMismatch
}

func (e *FallbackTextError) Error() string {
	return fmt.Sprintf("cli text %.40q (%d bytes): %v", e.Text, len(e.Text), e.Err)
}

// Unwrap returns the reason.
func (e *FallbackTextError) Unwrap() error { return e.Err }

// generateCLI runs the generation through `ollama run MODEL --keepalive K
// --nowordwrap` with the prompt on stdin and the answer on stdout, under the
// same three timeouts as the streaming path. It always sends a keep-alive
// (the CLI's default is 5 minutes), and after an unload keep-alive it
// verifies that the model is gone, because a model left by the fallback is
// the failure this library exists to prevent. Its Generation's DoneReason
// is "" (unknown) unless the library stopped the CLI ("length"), and a
// text that does not satisfy req.Format fails (ErrFormatMismatch).
func (c *OllamaClient) generateCLI(ctx context.Context, req *GenerateRequest, ka KeepAlive, fn ChunkFunc) (*Generation, error) {
	const op = "generate (cli)"
	bin := c.opts.CLIPath
	if bin == "" {
		bin = "ollama"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, newError(op, req.Model, KindUnavailable, err)
	}
	if ka.mode == keepAliveServer {
		ka = KeepAliveUnload
	}
	fctx, fcancel := context.WithCancelCause(ctx)
	defer fcancel(nil)
	f, end, err := c.book.begin(op, req.Model, ka, fcancel, false)
	if err != nil {
		return nil, err
	}
	f.sent.Store(true) // the CLI sends it at once
	gen, err := func() (*Generation, error) {
		defer end()
		return c.runCLI(fctx, path, req, ka, fn, f)
	}()
	if ka == KeepAliveUnload {
		// Whatever happened, leave nothing resident.
		if _, uerr := c.cleanup(ctx, CleanupOptions{Models: []string{req.Model}, mode: unloadMode{keepLoads: true}}); uerr != nil && err == nil {
			err = uerr
		}
	}
	if err != nil {
		return nil, err
	}
	return gen, nil
}

// cliFormat is the --format flag's value for a request's format: "json",
// or the schema on one line (every CLI version sends "json" as the JSON
// string and anything else as it is); "" for none.
func cliFormat(f json.RawMessage) string {
	var s string
	if json.Unmarshal(f, &s) == nil {
		return s // validFormat let only "json" through
	}
	var b bytes.Buffer
	if json.Compact(&b, f) != nil || b.String() == "null" {
		return ""
	}
	return b.String()
}

// runCLI runs the CLI; f is marked streaming at its first output.
func (c *OllamaClient) runCLI(ctx context.Context, path string, req *GenerateRequest, ka KeepAlive, fn ChunkFunc, f *flight) (*Generation, error) {
	const op = "generate (cli)"
	t := req.Timeouts.or(c.opts.Timeouts)
	wd := newWatchdog(ctx, t, 0)
	defer wd.release()

	cmd, stderr := c.cliCommand(wd.ctx, path, req, ka)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, newError(op, req.Model, KindInternal, err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, newError(op, req.Model, KindUnavailable, err)
	}
	limit, _ := cliOptions(req.Options)
	out := cliOutput{start: start, tc: tokenCap{max: limit}, wd: wd, f: f, fn: fn}
	out.read(stdout, func() { _ = cmd.Process.Kill() })
	werr := cmd.Wait()
	if err := wd.finish(op, req.Model, ctx, out.fnErr); err != nil {
		return nil, err
	}
	if werr != nil && !out.capped {
		msg := strings.TrimSpace(stderr.String())
		var ee *exec.ExitError
		if msg == "" || !errors.As(werr, &ee) {
			msg = werr.Error()
		}
		return nil, newError(op, req.Model, classifyMessage(msg), fmt.Errorf("%w: %s", werr, lastLine(msg)))
	}
	text := strings.TrimRight(out.text.String(), "\n")
	reason := "" // the CLI does not say how the reply ended
	if out.capped {
		reason = "length"
	} else if kind, err := checkFormat(req.Format, text); err != nil {
		// Before the Done chunk: the caller must not read it as complete.
		return nil, newError(op, req.Model, kind, &FallbackTextError{Text: text, Err: err})
	}
	if fn != nil {
		if err := fn(Chunk{Index: out.chunks + 1, Bytes: len(text), Elapsed: time.Since(start), Done: true}); err != nil {
			return nil, newError(op, req.Model, KindCanceled, fmt.Errorf("chunk callback: %w", err))
		}
	}
	return &Generation{
		Model:      req.Model,
		Text:       text,
		DoneReason: reason,
		Chunks:     out.chunks,
		Fallback:   true,
		FirstChunk: out.first,
		Elapsed:    time.Since(start),
	}, nil
}

// checkFormat checks the CLI's text against the request's format (nil:
// none, else as normFormat left it) and returns the failure with its kind
// (see ErrFormatMismatch).
func checkFormat(format json.RawMessage, text string) (Kind, error) {
	if len(format) == 0 {
		return 0, nil
	}
	if !json.Valid([]byte(text)) {
		err := json.Unmarshal([]byte(text), new(any)) // the syntax error
		return KindTransient, fmt.Errorf("%w: not JSON (a reply that ended early): %v", ErrFormatMismatch, err)
	}
	var schema map[string]any
	if json.Unmarshal(format, &schema) != nil {
		return 0, nil // "json": any JSON value
	}
	var v any
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return KindInternal, err // valid JSON decodes
	}
	if err := schemaShape(schema, v, "$"); err != nil {
		return KindServer, fmt.Errorf("%w: not of the schema's shape: %v", ErrFormatMismatch, err)
	}
	return 0, nil
}

// schemaShape reports where v, decoded with UseNumber, departs from the
// basic shape schema asks for at path: its "type" and "required", then
// recursively the present properties under "properties" and the elements
// under "items" (a schema object). Keywords it does not know, and type
// names outside JSON Schema's seven, pass.
func schemaShape(schema map[string]any, v any, path string) error {
	if t, ok := schema["type"]; ok && !hasType(t, v) {
		return fmt.Errorf("%s: want %s, got %s", path, typeNames(t), jsonType(v))
	}
	switch v := v.(type) {
	case map[string]any:
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if name, ok := r.(string); ok {
					if _, ok := v[name]; !ok {
						return fmt.Errorf("%s: missing required property %q", path, name)
					}
				}
			}
		}
		props, _ := schema["properties"].(map[string]any)
		names := make([]string, 0, len(props))
		for name := range props {
			names = append(names, name)
		}
		slices.Sort(names) // the first mismatch is the same every time
		for _, name := range names {
			sub, ok := props[name].(map[string]any)
			if pv, present := v[name]; ok && present {
				if err := schemaShape(sub, pv, fmt.Sprintf("%s[%q]", path, name)); err != nil {
					return err
				}
			}
		}
	case []any:
		if sub, ok := schema["items"].(map[string]any); ok {
			for i, e := range v {
				if err := schemaShape(sub, e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// hasType reports whether v is of the JSON Schema type t: a name, or a
// list of names of which one must match. An unknown name matches.
func hasType(t any, v any) bool {
	switch t := t.(type) {
	case string:
		switch jt := jsonType(v); t {
		case "object", "array", "string", "boolean", "null":
			return jt == t
		case "number":
			return jt == "number" || jt == "integer"
		case "integer":
			return jt == "integer"
		}
		return true
	case []any:
		for _, n := range t {
			if hasType(n, v) {
				return true
			}
		}
		return len(t) == 0
	}
	return true // not a type the check understands
}

// jsonType names v's JSON type; a number without a fraction is "integer".
func jsonType(v any) string {
	switch v := v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		if _, err := v.Int64(); err == nil {
			return "integer"
		}
		if f, err := v.Float64(); err == nil && f == math.Trunc(f) && !math.IsInf(f, 0) {
			return "integer"
		}
		return "number"
	}
	return "null"
}

// typeNames renders a schema's "type" for a message.
func typeNames(t any) string {
	if l, ok := t.([]any); ok {
		names := make([]string, 0, len(l))
		for _, n := range l {
			names = append(names, fmt.Sprint(n))
		}
		return "one of " + strings.Join(names, ", ")
	}
	return fmt.Sprint(t)
}

// cliCommand builds the `ollama run` command for req, its stdin set to the
// prompt; the returned buffer keeps the end of its stderr.
func (c *OllamaClient) cliCommand(ctx context.Context, path string, req *GenerateRequest, ka KeepAlive) (*exec.Cmd, *tailBuffer) {
	args := []string{"run", req.Model, "--nowordwrap", "--keepalive", ka.cliFlag()}
	if req.Think != nil {
		args = append(args, fmt.Sprintf("--think=%t", *req.Think))
	}
	if f := cliFormat(req.Format); f != "" {
		args = append(args, "--format", f)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = os.Environ()
	if c.host != "" {
		cmd.Env = append(cmd.Env, "OLLAMA_HOST="+c.host)
	}
	prompt := req.Prompt
	if req.System != "" {
		prompt = req.System + "\n\n" + req.Prompt
	}
	cmd.Stdin = strings.NewReader(prompt)
	stderr := &tailBuffer{max: 4096}
	cmd.Stderr = stderr
	cmd.WaitDelay = time.Second
	return cmd, stderr
}

// cliOutput reads the CLI's stdout into chunks.
type cliOutput struct {
	start  time.Time
	tc     tokenCap
	wd     *watchdog
	f      *flight
	fn     ChunkFunc
	text   strings.Builder
	first  time.Duration
	chunks int
	capped bool  // the token cap was reached and the CLI killed
	fnErr  error // the chunk callback's failure
}

// read reads stdout to its end, or until the token cap, when kill stops
// the CLI: its request to the server ends with it, so the server stops
// generating and drops its reference to the model.
func (o *cliOutput) read(stdout io.Reader, kill func()) {
	var pending []byte // an incomplete UTF-8 sequence at the end of the last read
	buf := make([]byte, 4096)
	for {
		n, rerr := stdout.Read(buf)
		if n > 0 {
			if o.first == 0 {
				o.first = max(time.Since(o.start), 1)
				o.f.streaming.Store(true)
			}
			o.wd.chunk()
		}
		data := buf[:n]
		if len(pending) > 0 {
			data = append(pending, data...)
		}
		end := len(data)
		if rerr == nil {
			end = completeRunes(data) // a rune cut by the read waits for its rest
		}
		piece := string(data[:end])
		pending = bytes.Clone(data[end:])
		fit, full := o.tc.fit(piece)
		if piece = piece[:fit]; piece != "" {
			o.chunks++
			o.text.WriteString(piece)
			if o.fn != nil && o.fnErr == nil {
				if o.fnErr = o.fn(Chunk{Text: piece, Index: o.chunks, Bytes: o.text.Len(), Elapsed: time.Since(o.start)}); o.fnErr != nil {
					o.wd.abort(o.fnErr)
				}
			}
		}
		if full {
			o.capped = true
			kill()
			return
		}
		if rerr != nil {
			return
		}
	}
}

// cliOptions splits a request's options for the CLI fallback. `ollama run`
// has no sampling flags on any version tested (v0.6.5 to v0.34.4 have
// --format, --keepalive, --nowordwrap, --verbose, and from v0.17 --think
// and --hidethinking; v0.17's --seed is for image models only), so the only
// option it can honour is num_predict, which the library enforces on its
// output: limit is that cap (0: none). dropped lists, sorted, every other
// option, and num_predict itself when it is not a number. Options set to
// nil are skipped, as the server skips them.
func cliOptions(opts map[string]any) (limit int, dropped []string) {
	for k, v := range opts {
		if v == nil {
			continue
		}
		if k == "num_predict" {
			if n, ok := optionInt(v); ok {
				limit = max(n, 0) // -1 (no limit) and -2 (fill the context): no cap
				continue
			}
		}
		dropped = append(dropped, k)
	}
	slices.Sort(dropped)
	return limit, dropped
}

// optionInt reads an integer option as the server reads its JSON: any
// number, truncated; anything else is not an integer.
func optionInt(v any) (int, bool) {
	if n, ok := v.(json.Number); ok {
		f, err := n.Float64()
		if err != nil {
			return 0, false
		}
		v = f
	}
	var f float64
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f = float64(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		f = float64(rv.Uint())
	case reflect.Float32, reflect.Float64:
		f = rv.Float()
	default:
		return 0, false
	}
	switch {
	case math.IsNaN(f):
		return 0, false
	case f >= math.MaxInt:
		return math.MaxInt, true
	case f <= math.MinInt:
		return math.MinInt, true
	}
	return int(f), true
}

// tokenCap enforces num_predict on the CLI's output, which carries no token
// counts. It counts approximate tokens: the larger of the words (runs of
// non-space runes, as strings.Fields counts them) and the bytes divided by
// 4, rounded up. A tokenizer gives at least one token per word and about
// one per 4 bytes of English text, so the CLI is stopped near where the
// server would have stopped, and never far past it: a capped text holds at
// most max words and 4*max bytes (4 times the server's cut only for text
// of one-byte tokens).
type tokenCap struct {
	max    int // 0: no cap
	words  int
	bytes  int
	inWord bool
}

// fit counts s, rune by rune, and returns how many of its bytes fit under
// the cap and whether the cap is reached (the next rune did not fit).
func (c *tokenCap) fit(s string) (n int, full bool) {
	if c.max <= 0 {
		return len(s), false
	}
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		space := unicode.IsSpace(r)
		words := c.words
		if !space && !c.inWord {
			words++
		}
		if max(words, (c.bytes+size+3)/4) > c.max {
			return n, true
		}
		c.words, c.bytes, c.inWord = words, c.bytes+size, !space
		n += size
	}
	return n, false
}

// completeRunes returns the length of the longest prefix of b that does
// not end inside a UTF-8 sequence. Invalid bytes count as complete runes.
func completeRunes(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// lastLine returns the last non-empty line of s, without the CLI's spinner
// escape sequences.
func lastLine(s string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(stripANSI(lines[i]))
		if l != "" {
			return l
		}
	}
	return ""
}

// stripANSI removes CSI escape sequences (the CLI's spinner).
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

var _ io.Writer = (*tailBuffer)(nil)
