package integration_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// TestCLIFallbackOptions takes a request's options through the real
// `ollama run` of each version. The CLI has no sampling flags on any of
// them, so the library must refuse to drop seed and temperature silently,
// and enforce num_predict itself on the CLI's output.
func TestCLIFallbackOptions(t *testing.T) {
	const limit = 4 // num_predict of every request here
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "the fallback needs a local ollama binary")
		bin, _, err := ollamatest.Binary(t.Context(), s.Version(), t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		if s.UsesStandin() {
			// The stand-in ends a reply after 24 tokens by itself; let it
			// run on, so that only the library's cap can stop the CLI.
			setKnobs(t, s, standin.Knobs{EOSAfter: 2000})
		}
		// A wrapper around the real CLI records that it started.
		dir := t.TempDir()
		ran := filepath.Join(dir, "ran")
		cli := filepath.Join(dir, "ollama")
		script := "#!/bin/sh\necho started >> '" + ran + "'\nexec '" + bin + "' \"$@\"\n"
		if err := os.WriteFile(cli, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		cliRan := func() bool { _, err := os.Stat(ran); return err == nil }
		// client returns a client whose first generation fails like a reset
		// connection, so that it falls back to the CLI. Total bounds a CLI
		// that nothing stops (the seed code's behaviour) for this test only.
		client := func(t *testing.T, drop bool) *vramguard.OllamaClient {
			tr := &failingTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
			t.Cleanup(tr.next.(*http.Transport).CloseIdleConnections)
			return newClient(t, s, vramguard.Options{Fallback: true, FallbackDropOptions: drop, CLIPath: cli,
				HTTPClient: &http.Client{Transport: tr}, Timeouts: vramguard.Timeouts{Total: 30 * time.Second}})
		}
		// capped checks a generation stopped by the library at the cap. The
		// library cuts the text at the cap, counting words as strings.Fields
		// does and bytes/4, so no slack is needed: at most limit words and
		// 4*limit bytes. The random-weight models never stop on their own
		// within that (the seed code got 71 words from v0.17.4 and an
		// endless stream from v0.6.5), so the reason must be "length".
		capped := func(t *testing.T, gen *vramguard.Generation) {
			t.Helper()
			words := len(strings.Fields(gen.Text))
			t.Logf("the CLI gave %d words, %d bytes %q in %v (reason %q)", words, len(gen.Text), gen.Text, gen.Elapsed, gen.DoneReason)
			if !gen.Fallback || !cliRan() {
				t.Fatalf("generation %+v did not come from the CLI", gen)
			}
			if words > limit || len(gen.Text) > 4*limit || gen.DoneReason != "length" {
				t.Errorf("%d words, %d bytes, reason %q: want at most %d words and %d bytes, reason length",
					words, len(gen.Text), gen.DoneReason, limit, 4*limit)
			}
			requireEmpty(t, s, "after the CLI fallback")
		}

		t.Run("refused by default", func(t *testing.T) {
			t.Cleanup(func() { os.Remove(ran) })
			c := client(t, false)
			gen, err := c.GenerateStreaming(t.Context(), req(modelA, limit), vramguard.KeepAliveServerDefault, nil)
			if !errors.Is(err, vramguard.ErrFallbackUnsupported) {
				t.Fatalf("got %+v, %v; want ErrFallbackUnsupported", gen, err)
			}
			if k := vramguard.KindOf(err); k != vramguard.KindTransient {
				t.Errorf("kind %v, want the first failure's (transient)", k)
			}
			if !strings.Contains(err.Error(), "seed, temperature") || strings.Contains(err.Error(), "num_predict") {
				t.Errorf("error %q does not name exactly seed and temperature", err)
			}
			if cliRan() {
				t.Error("the CLI ran")
			}
			t.Logf("refused: %v", err)
			requireEmpty(t, s, "after the refused fallback")
		})
		t.Run("options dropped on request", func(t *testing.T) {
			t.Cleanup(func() { os.Remove(ran) })
			c := client(t, true)
			gen, err := c.GenerateStreaming(t.Context(), req(modelA, limit), vramguard.KeepAliveServerDefault, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"seed", "temperature"}; !slices.Equal(gen.DroppedOptions, want) {
				t.Errorf("DroppedOptions %q, want %q", gen.DroppedOptions, want)
			}
			capped(t, gen)
		})
		t.Run("num_predict only", func(t *testing.T) {
			t.Cleanup(func() { os.Remove(ran) })
			c := client(t, false)
			gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "a castle at dawn",
				Options: map[string]any{"num_predict": limit}}, vramguard.KeepAliveServerDefault, nil)
			if err != nil {
				t.Fatal(err)
			}
			if gen.DroppedOptions != nil {
				t.Errorf("DroppedOptions %q, want none", gen.DroppedOptions)
			}
			capped(t, gen)
		})
	})
}

// TestCLIFallbackFormat takes a request with Format through the real
// `ollama run` of each version. The CLI prints what it got and exits 0
// whether or not the server's reply ended, so the fallback must never
// claim DoneReason "stop", and must not return a text that is not JSON, or
// not an instance of the schema, as a success: the seed code returned
// "{" and 31 spaces from v0.6.5, v0.17.4 and v0.24.0 as a complete reply.
// Every reply here is ended by the server at a num_predict baked into the
// model (the CLI cannot send it), so the test is bounded by that, and
// whichever way a version's random-weight model answers, the outcome must
// be a valid JSON success with the reason unknown, or the fallback's
// ErrFormatMismatch keeping the text.
func TestCLIFallbackFormat(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"positive":{"type":"string"},"negative":{"type":"string"}},"required":["positive","negative"]}`)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "the fallback needs a local ollama binary")
		bin, _, err := ollamatest.Binary(t.Context(), s.Version(), t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		const model = "tiny-a-format"
		if err := s.Client().Create(t.Context(), &api.CreateRequest{Model: model, From: modelA,
			Parameters: map[string]any{"num_predict": 24, "seed": 7}}, func(api.ProgressResponse) error { return nil }); err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			name   string
			format json.RawMessage
		}{{"json", json.RawMessage(`"json"`)}, {"schema", schema}} {
			t.Run(f.name, func(t *testing.T) {
				tr := &failingTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
				t.Cleanup(tr.next.(*http.Transport).CloseIdleConnections)
				c := newClient(t, s, vramguard.Options{Fallback: true, CLIPath: bin, HTTPClient: &http.Client{Transport: tr}})
				gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: model, Prompt: "a castle at dawn", Format: f.format},
					vramguard.KeepAliveServerDefault, nil)
				if tr.fails.Load() < 1 {
					t.Fatal("the first request did not fail")
				}
				if err == nil {
					t.Logf("the CLI's reply %q: a success, reason %q", gen.Text, gen.DoneReason)
					if !gen.Fallback || gen.DoneReason != "" {
						t.Errorf("generation %+v: want the fallback's, with the reason unknown", gen)
					}
					var pair map[string]any
					if !json.Valid([]byte(gen.Text)) {
						t.Errorf("success with %q, not JSON", gen.Text)
					} else if json.Unmarshal([]byte(gen.Text), &pair); f.name == "schema" && (pair["positive"] == nil || pair["negative"] == nil) {
						t.Errorf("success with %q, not an instance of the schema", gen.Text)
					}
				} else {
					var te *vramguard.FallbackTextError
					if !errors.As(err, &te) || !errors.Is(err, vramguard.ErrFormatMismatch) {
						t.Fatalf("got %v; want the fallback's ErrFormatMismatch", err)
					}
					mustKind(t, err, vramguard.KindTransient) // the first failure's
					t.Logf("the CLI's reply %q: refused: %v", te.Text, err)
					if json.Valid([]byte(te.Text)) != errors.Is(err, vramguard.KindServer) {
						t.Errorf("text %q refused as %v", te.Text, err)
					}
				}
				requireEmpty(t, s, "after the CLI fallback")
			})
		}
	})
}
