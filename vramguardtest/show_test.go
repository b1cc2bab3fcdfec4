package vramguardtest_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

// TestShowModelfileFrom: /api/show's modelfile names the weights blob in
// its first command, a FROM line, as Ollama's does; the blob is the
// configured one or one derived from the name.
func TestShowModelfileFrom(t *testing.T) {
	const blob = "sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		tiny(func(m *vramguardtest.ModelConfig) { m.Blob = blob }),
		{Name: "user/other:q4"},
	}})
	sum := sha256.Sum256([]byte("weights of user/other:q4"))
	for _, tt := range []struct{ model, from string }{
		{"tiny", vramguardtest.ModelsDir + "/blobs/sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"},
		{"user/other:q4", vramguardtest.ModelsDir + "/blobs/sha256-" + hex.EncodeToString(sum[:])},
	} {
		resp, err := c.Show(t.Context(), &api.ShowRequest{Model: tt.model})
		if err != nil {
			t.Fatal(err)
		}
		var first string
		for line := range strings.Lines(resp.Modelfile) {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				first = l
				break
			}
		}
		if first != "FROM "+tt.from {
			t.Errorf("%s: first command %q, want FROM %s; modelfile:\n%s", tt.model, first, tt.from, resp.Modelfile)
		}
		if !strings.Contains(resp.Modelfile, "# FROM ") {
			t.Errorf("%s: no commented FROM with the name, as Ollama writes:\n%s", tt.model, resp.Modelfile)
		}
	}
}

// TestShowModelInfo: /api/show reports the architecture keys of the shape
// derived from Size, or ModelInfo as given.
func TestShowModelInfo(t *testing.T) {
	info := map[string]any{"general.architecture": "llama"}
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "big", Size: 5 << 30},
		{Name: "bare", ModelInfo: info},
	}})
	resp, err := c.Show(t.Context(), &api.ShowRequest{Model: "big"})
	if err != nil {
		t.Fatal(err)
	}
	sh := vramguardtest.ShapeOf(5 << 30)
	for key, want := range map[string]int{
		"llama.block_count":             sh.Blocks,
		"llama.embedding_length":        sh.Embedding,
		"llama.attention.head_count":    sh.Heads,
		"llama.attention.head_count_kv": sh.HeadsKV,
		"llama.attention.key_length":    sh.Embedding / sh.Heads,
		"llama.context_length":          vramguardtest.DefaultContextLength,
	} {
		if got, _ := resp.ModelInfo[key].(float64); int(got) != want {
			t.Errorf("%s = %v, want %d", key, resp.ModelInfo[key], want)
		}
	}
	resp, err = c.Show(t.Context(), &api.ShowRequest{Model: "bare"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ModelInfo) != 1 {
		t.Errorf("bare: model_info %v, want %v", resp.ModelInfo, info)
	}
}
