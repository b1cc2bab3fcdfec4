package vramguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	. "github.com/vramguard/vramguard"

	"github.com/vramguard/vramguard/vramguardtest"
)

// fakeCLI writes a shell script that stands in for `ollama run`: it records
// its arguments and OLLAMA_HOST, then runs body. The real CLI is exercised
// by the integration tests against a real server.
func fakeCLI(t *testing.T, body string) (path, argsFile string) {
	t.Helper()
	dir := t.TempDir()
	argsFile = filepath.Join(dir, "args")
	path = filepath.Join(dir, "ollama")
	script := "#!/bin/sh\necho \"$@\" > " + argsFile + "\necho \"$OLLAMA_HOST\" >> " + argsFile + "\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, argsFile
}

func TestFallbackAfterTransientFailure(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	cli, argsFile := fakeCLI(t, `printf 'from the cli: '; cat; printf '\n'`)
	var fellBack atomic.Int32
	c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli,
		Hooks: Hooks{OnFallback: func(_ context.Context, e FallbackEvent) {
			if e.Model == "tiny" && e.Err != nil {
				fellBack.Add(1)
			}
		}}})
	if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
		t.Fatal(err)
	}
	var chunks int
	gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "a fox"}, KeepAliveServerDefault,
		func(Chunk) error { chunks++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if !gen.Fallback || gen.Text != "from the cli: a fox" || fellBack.Load() != 1 || chunks == 0 {
		t.Fatalf("gen %+v, fallbacks %d, chunks %d", gen, fellBack.Load(), chunks)
	}
	args, _ := os.ReadFile(argsFile)
	// KeepAliveServerDefault becomes an explicit 0s: the CLI's own default
	// would leave the model resident for 5 minutes.
	if want := "run tiny --nowordwrap --keepalive 0s\n" + Host(c) + "\n"; string(args) != want {
		t.Errorf("cli got %q, want %q", args, want)
	}
	if s.Listed("tiny") {
		t.Error("model resident after the fallback")
	}
}

func TestFallbackNotForPermanentFailures(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	cli, argsFile := fakeCLI(t, `cat`)
	c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
	_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "missing", Prompt: "x"}, KeepAliveUnload, nil)
	if !errors.Is(err, KindNotFound) {
		t.Fatalf("got %v", err)
	}
	if _, statErr := os.Stat(argsFile); statErr == nil {
		t.Error("the CLI ran for a not-found model")
	}
}

func TestFallbackFailures(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		cliPath  string
		timeouts Timeouts
		wantKind Kind   // of the fallback's own error, inside the joined cause
		wantText string // in the message
	}{
		{name: "missing binary", cliPath: "/nonexistent/ollama", wantKind: KindUnavailable},
		{name: "cli error", body: `echo "Error: model requires more system memory (9 GiB) than is available (2 GiB)" >&2; exit 1`,
			wantKind: KindOutOfMemory, wantText: "requires more system memory"},
		{name: "cli stalls", body: `sleep 5`, timeouts: Timeouts{FirstChunk: 100 * time.Millisecond}, wantKind: KindTimeout},
		{name: "cli idles", body: `printf 'a'; sleep 5`, timeouts: Timeouts{Idle: 100 * time.Millisecond}, wantKind: KindTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			cli := tt.cliPath
			if cli == "" {
				cli, _ = fakeCLI(t, tt.body)
			}
			c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
			if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x", Timeouts: tt.timeouts}, KeepAliveUnload, nil)
			if !errors.Is(err, KindTransient) {
				t.Fatalf("got %v, want the first failure's kind (transient)", err)
			}
			if !errors.Is(err, tt.wantKind) || !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %v does not carry the fallback's %v failure", err, tt.wantKind)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestNoFallbackAfterChunksReachedTheCaller(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	cli, argsFile := fakeCLI(t, `cat`)
	c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
	if err := s.FailNext("tiny", vramguardtest.CloseAfter(2)); err != nil {
		t.Fatal(err)
	}
	var seen []string
	_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload,
		func(ch Chunk) error { seen = append(seen, ch.Text); return nil })
	if !errors.Is(err, ErrIncompleteStream) || len(seen) != 2 {
		t.Fatalf("got %v after %d chunks, want the cut stream's error", err, len(seen))
	}
	if _, statErr := os.Stat(argsFile); statErr == nil {
		t.Error("the CLI ran although the caller had already received text")
	}
	// Without a callback nothing was delivered: the fallback runs.
	if err := s.FailNext("tiny", vramguardtest.CloseAfter(2)); err != nil {
		t.Fatal(err)
	}
	gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, nil)
	if err != nil || !gen.Fallback {
		t.Fatalf("without a callback: %+v, %v", gen, err)
	}
}

func TestFallbackOptions(t *testing.T) {
	all := map[string]any{"num_predict": 4, "seed": 1, "temperature": 0.7, "top_p": 0.9}
	tests := []struct {
		name     string
		options  map[string]any
		drop     bool                // Options.FallbackDropOptions
		fault    vramguardtest.Fault // the first attempt's failure
		timeouts Timeouts            // of the request
		wantKind Kind                // of the first failure, kept by a refusal
		refused  string              // the option list a refusal names; "" when the CLI runs
		dropped  []string            // Generation.DroppedOptions when it runs
		wantText string              // of the CLI, which writes "one two three four five six"
		reason   string              // Generation.DoneReason
	}{
		{name: "no options", fault: vramguardtest.Busy(), wantText: "one two three four five six", reason: ""},
		{name: "empty options", options: map[string]any{}, fault: vramguardtest.Busy(), wantText: "one two three four five six", reason: ""},
		{name: "options set to nil", options: map[string]any{"seed": nil}, fault: vramguardtest.Busy(),
			wantText: "one two three four five six", reason: ""},
		// 4 approximate tokens: 4 words, but bytes/4 stops it first, at 16 bytes.
		{name: "num_predict is enforced", options: map[string]any{"num_predict": 4}, fault: vramguardtest.Busy(),
			wantText: "one two three fo", reason: "length"},
		{name: "num_predict from JSON", options: map[string]any{"num_predict": json.Number("2")}, fault: vramguardtest.Busy(),
			wantText: "one two ", reason: "length"},
		{name: "num_predict above the output", options: map[string]any{"num_predict": 100}, fault: vramguardtest.Busy(),
			wantText: "one two three four five six", reason: ""},
		{name: "num_predict -1 is no cap", options: map[string]any{"num_predict": -1}, fault: vramguardtest.Busy(),
			wantText: "one two three four five six", reason: ""},
		{name: "sampling options refused", options: all, fault: vramguardtest.Busy(), wantKind: KindTransient,
			refused: "seed, temperature, top_p"},
		{name: "refusal keeps a timeout's kind", options: all, fault: vramguardtest.Stall(5 * time.Second),
			timeouts: Timeouts{FirstChunk: 50 * time.Millisecond}, wantKind: KindTimeout, refused: "seed, temperature, top_p"},
		{name: "num_predict that is not a number", options: map[string]any{"num_predict": "4"}, fault: vramguardtest.Busy(),
			wantKind: KindTransient, refused: "num_predict"},
		{name: "dropped on request", options: all, drop: true, fault: vramguardtest.Busy(),
			dropped: []string{"seed", "temperature", "top_p"}, wantText: "one two three fo", reason: "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			cli, argsFile := fakeCLI(t, `printf 'one two three four five six'`)
			var fellBack atomic.Int32
			var logs bytes.Buffer
			c := newTestClient(t, s, Options{Fallback: true, FallbackDropOptions: tt.drop, CLIPath: cli,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				Hooks:  Hooks{OnFallback: func(context.Context, FallbackEvent) { fellBack.Add(1) }}})
			if err := s.FailNext("tiny", tt.fault); err != nil {
				t.Fatal(err)
			}
			var streamed strings.Builder
			gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x", Options: tt.options, Timeouts: tt.timeouts},
				KeepAliveUnload, func(ch Chunk) error { streamed.WriteString(ch.Text); return nil })
			_, statErr := os.Stat(argsFile)
			if tt.refused != "" {
				if !errors.Is(err, ErrFallbackUnsupported) || KindOf(err) != tt.wantKind {
					t.Fatalf("got %+v, %v (kind %v); want ErrFallbackUnsupported with kind %v", gen, err, KindOf(err), tt.wantKind)
				}
				if !strings.Contains(err.Error(), "cannot carry: "+tt.refused+"\n") && !strings.HasSuffix(err.Error(), "cannot carry: "+tt.refused) {
					t.Errorf("error %q does not name exactly %s", err, tt.refused)
				}
				if statErr == nil || fellBack.Load() != 0 {
					t.Errorf("the CLI ran (hook called %d times)", fellBack.Load())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if statErr != nil || !gen.Fallback || fellBack.Load() != 1 {
				t.Fatalf("the CLI did not run: %+v", gen)
			}
			if gen.Text != tt.wantText || streamed.String() != tt.wantText || gen.DoneReason != tt.reason {
				t.Errorf("text %q (streamed %q), reason %q; want %q, %q", gen.Text, streamed.String(), gen.DoneReason, tt.wantText, tt.reason)
			}
			if !slices.Equal(gen.DroppedOptions, tt.dropped) || (tt.dropped == nil && gen.DroppedOptions != nil) {
				t.Errorf("DroppedOptions %q, want %q", gen.DroppedOptions, tt.dropped)
			}
			warned := strings.Contains(logs.String(), `level=WARN msg="the ollama CLI runs without options it cannot carry"`)
			if warned != (tt.dropped != nil) {
				t.Errorf("warning about dropped options logged: %v; want %v (logs %q)", warned, tt.dropped != nil, logs.String())
			}
			if s.Listed("tiny") {
				t.Error("model resident after the fallback")
			}
		})
	}
}

// TestFallbackCapKillsTheCLI: a CLI that writes without end is killed as
// soon as its text reaches num_predict; without the cap it would run until
// the total timeout.
func TestFallbackCapKillsTheCLI(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	pidFile := filepath.Join(t.TempDir(), "pid")
	cli, _ := fakeCLI(t, `echo $$ > `+pidFile+`; while :; do printf 'tok '; done`)
	c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
	if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
		t.Fatal(err)
	}
	const limit = 50
	var reached time.Time // when the last text chunk, the one at the cap, arrived
	gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x",
		Options: map[string]any{"num_predict": limit}, Timeouts: Timeouts{Total: 30 * time.Second}}, KeepAliveUnload,
		func(ch Chunk) error {
			if !ch.Done {
				reached = time.Now()
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(reached); d > 2*time.Second {
		t.Errorf("returned %v after the cap was reached", d)
	}
	// "tok " is 4 bytes: bytes/4 and the words reach 50 together.
	if want := strings.Repeat("tok ", limit); gen.Text != want || gen.DoneReason != "length" {
		t.Errorf("text %q, reason %q; want %d words, reason length", gen.Text, gen.DoneReason, limit)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := os.FindProcess(pid); err == nil {
		if err := p.Signal(syscall.Signal(0)); err == nil {
			t.Errorf("the CLI (pid %d) still runs", pid)
		}
	}
}

// TestFallbackSplitRunes: a rune cut by the pipe reaches the callback whole.
func TestFallbackSplitRunes(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	cli, _ := fakeCLI(t, `printf 'a \342'; sleep 0.2; printf '\202\254 b'`)
	c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
	if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
		t.Fatal(err)
	}
	var pieces []string
	gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload,
		func(ch Chunk) error { pieces = append(pieces, ch.Text); return nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pieces {
		if !utf8.ValidString(p) {
			t.Errorf("chunk %q is not valid UTF-8 (chunks %q)", p, pieces)
		}
	}
	if gen.Text != "a € b" {
		t.Errorf("text %q", gen.Text)
	}
}

// TestFallbackFormat: the CLI prints the text and exits 0 whether or not
// the server's reply ended, so the fallback never claims DoneReason
// "stop", and a request with Format fails on a text that is not JSON (a
// reply cut short, KindTransient as on the streaming path) or not of the
// schema's shape (KindServer), keeping the text in a *FallbackTextError.
func TestFallbackFormat(t *testing.T) {
	const schema = `{"type":"object","properties":{"positive":{"type":"string"},"n":{"type":"integer"}},"required":["positive","negative"]}`
	cut := "{" + strings.Repeat(" ", 31) // what v0.6.5, v0.17.4 and v0.24.0 gave when the runner cut the reply
	tests := []struct {
		name     string
		format   string         // GenerateRequest.Format; "" for none
		out      string         // what the CLI prints
		options  map[string]any // of the request
		wantKind Kind           // of the fallback's own error; 0 for success
		wantText string         // Generation.Text, or FallbackTextError.Text
		reason   string         // Generation.DoneReason on success
	}{
		{name: "plain text without format", out: `a castle at dawn\n`, wantText: "a castle at dawn", reason: ""},
		{name: "empty text without format", out: ``, wantText: "", reason: ""},
		{name: "cut JSON", format: `"json"`, out: cut + `\n\n`, wantKind: KindTransient, wantText: cut},
		{name: "no text for JSON", format: `"json"`, out: `\n`, wantKind: KindTransient, wantText: ""},
		{name: "two JSON values", format: `"json"`, out: `{} {}\n`, wantKind: KindTransient, wantText: "{} {}"},
		{name: "valid JSON", format: `"json"`, out: `{"a": [1, 2]}\n\n`, wantText: `{"a": [1, 2]}`, reason: ""},
		{name: "schema instance", format: schema, out: `{"positive": "sunny", "negative": "", "n": 3}\n`,
			wantText: `{"positive": "sunny", "negative": "", "n": 3}`, reason: ""},
		{name: "schema instance cut", format: schema, out: `{"positive": "sun`, wantKind: KindTransient, wantText: `{"positive": "sun`},
		{name: "schema wrong type", format: schema, out: `["positive", "negative"]\n`, wantKind: KindServer, wantText: `["positive", "negative"]`},
		{name: "schema required property missing", format: schema, out: `{"positive": "sunny"}\n`, wantKind: KindServer, wantText: `{"positive": "sunny"}`},
		{name: "schema property of the wrong type", format: schema, out: `{"positive": 1, "negative": ""}\n`,
			wantKind: KindServer, wantText: `{"positive": 1, "negative": ""}`},
		// The library stopped the CLI: the reason is known, and says what
		// the server's "length" says on the streaming path.
		{name: "JSON cut at num_predict", format: `"json"`, out: `{"positive": "sunny and bright"}\n`,
			options: map[string]any{"num_predict": 3}, wantText: `{"positive":`, reason: "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			cli, argsFile := fakeCLI(t, `printf '`+tt.out+`'`)
			c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
			if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
				t.Fatal(err)
			}
			var streamed strings.Builder
			var done bool
			gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x", Format: json.RawMessage(tt.format), Options: tt.options},
				KeepAliveUnload, func(ch Chunk) error { streamed.WriteString(ch.Text); done = done || ch.Done; return nil })
			if s.Listed("tiny") {
				t.Error("model resident after the fallback")
			}
			args, _ := os.ReadFile(argsFile)
			if want := cliFormatFlag(tt.format); !strings.Contains(string(args), want) {
				t.Errorf("cli got %q, want %q in it", args, want)
			}
			if tt.wantKind == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if !gen.Fallback || gen.Text != tt.wantText || gen.DoneReason != tt.reason || !done {
					t.Errorf("got %+v (done chunk %v); want text %q, reason %q", gen, done, tt.wantText, tt.reason)
				}
				return
			}
			if gen != nil || KindOf(err) != KindTransient || !errors.Is(err, ErrFormatMismatch) {
				t.Fatalf("got %+v, %v; want ErrFormatMismatch with the first failure's kind (transient)", gen, err)
			}
			if k := fallbackKind(err); k != tt.wantKind {
				t.Errorf("the fallback's own kind %v, want %v (%v)", k, tt.wantKind, err)
			}
			var te *FallbackTextError
			if !errors.As(err, &te) || te.Text != tt.wantText {
				t.Fatalf("error %v keeps no text %q", err, tt.wantText)
			}
			if done || streamed.String() != strings.ReplaceAll(tt.out, `\n`, "\n") {
				t.Errorf("callback got %q, done %v; want the output without the Done chunk", streamed.String(), done)
			}
		})
	}
}

// cliFormatFlag is the --format argument the CLI gets for format ("" for
// none: the command's fixed start).
func cliFormatFlag(format string) string {
	if format == "" {
		return "run tiny --nowordwrap --keepalive 0s\n"
	}
	var s string
	if json.Unmarshal([]byte(format), &s) == nil {
		return "--format " + s + "\n"
	}
	return "--format " + format + "\n"
}

// fallbackKind returns the kind of the fallback's own error, which run
// joins to the first failure's cause under the first failure's kind.
func fallbackKind(err error) Kind {
	var outer, inner *Error
	if !errors.As(err, &outer) || !errors.As(outer.Err, &inner) || inner.Op != "generate (cli)" {
		return KindUnknown
	}
	return inner.Kind
}
