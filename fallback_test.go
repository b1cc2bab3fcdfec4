package vramguard

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/sim"
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
	s := newSim(t, sim.Config{}, sim.ModelConfig{Name: "tiny"})
	cli, argsFile := fakeCLI(t, `printf 'from the cli: '; cat; printf '\n'`)
	var fellBack atomic.Int32
	c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli,
		Hooks: Hooks{OnFallback: func(string, error) { fellBack.Add(1) }}})
	if err := s.FailNext("tiny", sim.Busy()); err != nil {
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
	if want := "run tiny --nowordwrap --keepalive 0s\n" + c.host + "\n"; string(args) != want {
		t.Errorf("cli got %q, want %q", args, want)
	}
	if s.Listed("tiny") {
		t.Error("model resident after the fallback")
	}
}

func TestFallbackNotForPermanentFailures(t *testing.T) {
	s := newSim(t, sim.Config{}, sim.ModelConfig{Name: "tiny"})
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
			s := newSim(t, sim.Config{}, sim.ModelConfig{Name: "tiny"})
			cli := tt.cliPath
			if cli == "" {
				cli, _ = fakeCLI(t, tt.body)
			}
			c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
			if err := s.FailNext("tiny", sim.Busy()); err != nil {
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
	s := newSim(t, sim.Config{}, sim.ModelConfig{Name: "tiny"})
	cli, argsFile := fakeCLI(t, `cat`)
	c := newTestClient(t, s, Options{Fallback: true, CLIPath: cli})
	if err := s.FailNext("tiny", sim.CloseAfter(2)); err != nil {
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
	if err := s.FailNext("tiny", sim.CloseAfter(2)); err != nil {
		t.Fatal(err)
	}
	gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, nil)
	if err != nil || !gen.Fallback {
		t.Fatalf("without a callback: %+v, %v", gen, err)
	}
}
