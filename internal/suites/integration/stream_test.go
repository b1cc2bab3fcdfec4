package integration_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/gguf"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// modelX is the small model with a vocabulary token for "x"; see
// registerModelX.
const modelX = "tiny-x"

// TestStreamHugePrompt (issue #14, item 3): a 4 MB prompt, within
// MaxPromptBytes, with a small num_ctx, so that the server truncates it and
// generates. The done line then carries the deprecated `context` array,
// every token of the whole prompt: about 16 MB on one line (a 10 MB prompt
// gave 40 MB), twice the api client's 8 MiB line limit. The generation
// finished, so the call must succeed with the server's text and metrics,
// and leave nothing resident. (4 MB, not the 10 MB of the report: the
// servers' tokenizing is most of this test's time, and 4 MB is past the
// limit with a margin.)
func TestStreamHugePrompt(t *testing.T) {
	const size = 4_000_000
	prompt := strings.Repeat("x", size)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		registerModelX(t, s)
		c := newClient(t, s, vramguard.Options{})
		r := &vramguard.GenerateRequest{
			Model:   modelX,
			Prompt:  prompt,
			Options: map[string]any{"num_predict": 4, "num_ctx": 128, "temperature": 0.7, "seed": 1},
			// The server tokenizes the four million bytes three times (its
			// length check, the runner, the done line's context): seconds
			// on a busy machine, before the first chunk and before done.
			Timeouts: vramguard.Timeouts{FirstChunk: 4 * time.Minute, Idle: 4 * time.Minute, Total: 8 * time.Minute},
		}
		gen, err := c.GenerateStreaming(t.Context(), r, vramguard.KeepAliveUnload, nil)
		if err != nil {
			t.Fatalf("%v (kind %v, retryable %v)", err, vramguard.KindOf(err), vramguard.KindOf(err).Retryable())
		}
		if gen.Text == "" || gen.Metrics.EvalCount != 4 || gen.DoneReason != "length" {
			t.Errorf("text %q, eval count %d, done reason %q; want text, 4 and length", gen.Text, gen.Metrics.EvalCount, gen.DoneReason)
		}
		t.Logf("%d chunks, text %q, prompt_eval_count %d, in %v", gen.Chunks, gen.Text, gen.Metrics.PromptEvalCount, gen.Elapsed.Round(time.Millisecond))
		d := waitEmpty(t, s, 5*time.Second)
		t.Logf("/api/ps empty %v after the call returned", d)
	})
}

// registerModelX registers modelX: the small model (gguf.Small) whose
// unused token <0xFF> (no UTF-8 text holds that byte) is turned into the
// normal token "x".
//
// Why: the test models' vocabulary is the 256 byte tokens, so llama.cpp
// tokenizes every character through its byte fallback, and that path is
// quadratic: llm_tokenizer_spm_session::resegment calls
// output.reserve(output.size() + symbol.n) per character (llama-vocab.cpp
// line 190 in v0.17.4), an exact-size reallocation of the whole token
// vector each time. Measured on the runner generation here (v0.6.5,
// v0.17.4, v0.24.0), time to the first chunk: 100 KB 0.65-1.3 s, 300 KB
// 7-21 s; a 10 MB prompt gave no first chunk in 5 minutes. With a
// token for "x" a prompt of x's never reaches the fallback: 1 MB in about
// 1.2 s. Real models' vocabularies cover text, which is why 10 MB prompts
// generate on real servers. v0.30+ runs the stand-in, whose own tokenizer
// is one token per byte and linear.
//
// The file keeps its size, so the tensor data keeps its offsets: the token
// text loses five bytes and general.name gains them.
func registerModelX(t *testing.T, s *ollamatest.Server) {
	t.Helper()
	b, err := gguf.Bytes(gguf.Small())
	if err != nil {
		t.Fatal(err)
	}
	ggufString := func(s string) []byte { return append(binary.LittleEndian.AppendUint64(nil, uint64(len(s))), s...) }
	size := len(b)
	replace := func(old, new []byte) {
		t.Helper()
		if n := bytes.Count(b, old); n != 1 {
			t.Fatalf("the GGUF file holds %q %d times, want once", old, n)
		}
		b = bytes.Replace(b, old, new, 1)
	}
	replace(ggufString("<0xFF>"), ggufString("x"))
	replace(ggufString("vramguard-tiny"), ggufString("vramguard-tiny+five"))
	// tokenizer.ggml.token_type: key, array type (u32), element type
	// (u32), count (u64), then one i32 per token; token 258 is <0xFF>:
	// byte (6) becomes normal (1), so that llama.cpp renders it as text.
	key := ggufString("tokenizer.ggml.token_type")
	i := bytes.Index(b, key)
	if i < 0 {
		t.Fatal("the GGUF file has no tokenizer.ggml.token_type")
	}
	at := i + len(key) + 4 + 4 + 8 + 258*4
	if typ := binary.LittleEndian.Uint32(b[at:]); typ != 6 {
		t.Fatalf("token 258 has type %d, want 6 (byte)", typ)
	}
	binary.LittleEndian.PutUint32(b[at:], 1)
	if len(b) != size {
		t.Fatalf("the GGUF file changed size: %d, want %d", len(b), size)
	}
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	c := s.Client()
	if err := c.CreateBlob(t.Context(), digest, bytes.NewReader(b)); err != nil {
		t.Fatalf("upload %s: %v", modelX, err)
	}
	if err := c.Create(t.Context(), &api.CreateRequest{Model: modelX, Files: map[string]string{"model.gguf": digest}},
		func(api.ProgressResponse) error { return nil }); err != nil {
		t.Fatalf("create %s: %v", modelX, err)
	}
}
