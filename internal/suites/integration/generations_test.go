package integration_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/gguf"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// Ollama changed how it runs models in v0.30: up to v0.24.0 a model runs in
// `ollama runner` (llama.cpp built into ollama), from v0.30 in llama.cpp's
// own llama-server, which these tests replace with the stand-in of
// internal/testkit/standin (Ollama's scheduler, keep-alive, unload and
// /api/ps run unchanged above it). The tests below take each failure to the
// real server and check the text it sends back is classified right, stating
// each generation's text.

// setKnobs sets the stand-in's knobs for the rest of the test and resets
// them at its end.
func setKnobs(t *testing.T, s *ollamatest.Server, k standin.Knobs) {
	t.Helper()
	if err := s.SetRunnerKnobs(k); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.SetRunnerKnobs(standin.Knobs{}); err != nil {
			t.Errorf("reset the stand-in's knobs: %v", err)
		}
	})
}

// registerUnloadable registers a model the server accepts but its runner
// cannot load: the key llama.cpp requires for the norm's epsilon is renamed
// (same length, so the file stays well formed).
func registerUnloadable(t *testing.T, s *ollamatest.Server, name string) {
	t.Helper()
	b, err := gguf.Bytes(gguf.Params{Seed: 99})
	if err != nil {
		t.Fatal(err)
	}
	const key = "llama.attention.layer_norm_rms_epsilon"
	if bytes.Count(b, []byte(key)) != 1 {
		t.Fatalf("the GGUF file does not hold %s once", key)
	}
	b = bytes.Replace(b, []byte(key), []byte("llama.attention.layer_norm_rms_epsiloX"), 1)
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	c := s.Client()
	if err := c.CreateBlob(t.Context(), digest, bytes.NewReader(b)); err != nil {
		t.Fatalf("upload the truncated model: %v", err)
	}
	if err := c.Create(t.Context(), &api.CreateRequest{Model: name, Files: map[string]string{"model.gguf": digest}},
		func(api.ProgressResponse) error { return nil }); err != nil {
		t.Fatalf("create the truncated model: %v", err)
	}
}

// TestServerTextsClassified: a runner that crashes mid-stream, a model
// that fails to load and a load that runs out of memory, each on every
// version that can produce it, reach the caller as KindModelCrash,
// KindModelCrash and KindOutOfMemory, with the server's own text kept in
// the error.
func TestServerTextsClassified(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		c := newClient(t, s, vramguard.Options{})
		// check: err is of kind want and holds one of the server's texts.
		check := func(t *testing.T, err error, want vramguard.Kind, texts ...string) {
			t.Helper()
			if err == nil {
				t.Fatalf("the call succeeded, want %v", want)
			}
			t.Logf("ollama %s: %v", s.Version(), err)
			if k := vramguard.KindOf(err); k != want {
				t.Errorf("kind %v, want %v", k, want)
			}
			if !slices.ContainsFunc(texts, func(text string) bool { return strings.Contains(err.Error(), text) }) {
				t.Errorf("the error has none of the server's texts %q", texts)
			}
		}
		t.Run("load fails", func(t *testing.T) {
			if s.UsesStandin() {
				// v0.30+: llama-server exits while loading.
				setKnobs(t, s, standin.Knobs{ExitAtLoad: true})
				_, err := c.GenerateStreaming(t.Context(), req(modelA, 4), vramguard.KeepAliveUnload, nil)
				check(t, err, vramguard.KindModelCrash, "llama-server process has terminated")
				return
			}
			// Up to v0.24: the runner cannot read the model. The runner's
			// own message comes through, or, when the runner exits before
			// Ollama reads it, v0.6.5's "unable to load model" and v0.17+'s
			// "model failed to load" (seen on v0.17.4, one load in three).
			registerUnloadable(t, s, "tiny-broken")
			_, err := c.GenerateStreaming(t.Context(), req("tiny-broken", 4), vramguard.KeepAliveUnload, nil)
			check(t, err, vramguard.KindModelCrash, "llama runner process has terminated: error loading model",
				"unable to load model", "model failed to load")
		})
		t.Run("out of memory at load", func(t *testing.T) {
			if !s.UsesStandin() {
				// Up to v0.24 the server refuses, before loading, a context
				// whose cache cannot fit in the machine's memory.
				// A model of 256 blocks that advertises a context of 2^20
				// tokens: its cache would take 32 GiB at that length.
				if _, err := gguf.Register(t.Context(), s.Client(), "tiny-deep", gguf.Params{Seed: 98, Blocks: 256, Context: 1 << 20}); err != nil {
					t.Fatal(err)
				}
				r := req("tiny-deep", 4)
				r.Options["num_ctx"] = 1 << 20
				_, err := c.GenerateStreaming(t.Context(), r, vramguard.KeepAliveUnload, nil)
				check(t, err, vramguard.KindOutOfMemory, "requires more system memory")
				return
			}
			// The runner exits after llama.cpp's allocation failure...
			setKnobs(t, s, standin.Knobs{OOMAtLoad: true})
			_, err := c.GenerateStreaming(t.Context(), req(modelA, 4), vramguard.KeepAliveUnload, nil)
			check(t, err, vramguard.KindOutOfMemory, "llama-server process has terminated: exit status 1: cudaMalloc failed: out of memory")
			// ...or stays up and reports it through /health.
			setKnobs(t, s, standin.Knobs{OOMAtLoad: true, OOMHealth: true})
			_, err = c.GenerateStreaming(t.Context(), req(modelA, 4), vramguard.KeepAliveUnload, nil)
			check(t, err, vramguard.KindOutOfMemory, "llama-server reported out-of-memory during startup")
		})
		t.Run("crash mid-stream", func(t *testing.T) {
			var chunks int
			fn := func(vramguard.Chunk) error { chunks++; return nil }
			if s.UsesStandin() {
				setKnobs(t, s, standin.Knobs{CrashAfterTokens: 3})
				_, err := c.GenerateStreaming(t.Context(), req(modelA, 20), vramguard.KeepAliveUnload, fn)
				check(t, err, vramguard.KindModelCrash, "an error was encountered while running the model: GGML_ASSERT")
				if chunks != 3 {
					t.Errorf("%d chunks reached the caller before the crash, want 3", chunks)
				}
				return
			}
			// The real runners are killed by TestRunnerKilledMidStream.
			t.Skipf("ollama %s: see TestRunnerKilledMidStream", s.Version())
		})
		// Whatever failed, the next call works and nothing stays resident.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if _, err := c.GenerateStreaming(ctx, req(modelA, 2), vramguard.KeepAliveUnload, nil); err != nil {
			t.Fatalf("the call after the failures: %v", err)
		}
		waitEmpty(t, s, 2*time.Second)
	})
}
