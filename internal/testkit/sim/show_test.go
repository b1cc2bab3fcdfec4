package sim_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/testkit/sim"
)

// TestShowModelfileFrom: /api/show's modelfile names the weights blob in
// its first command, a FROM line, as Ollama's does; the blob is the
// configured one or one derived from the name.
func TestShowModelfileFrom(t *testing.T) {
	const blob = "sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	_, c := start(t, sim.Config{Models: []sim.ModelConfig{
		tiny(func(m *sim.ModelConfig) { m.Blob = blob }),
		{Name: "user/other:q4"},
	}})
	sum := sha256.Sum256([]byte("weights of user/other:q4"))
	for _, tt := range []struct{ model, from string }{
		{"tiny", sim.ModelsDir + "/blobs/sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"},
		{"user/other:q4", sim.ModelsDir + "/blobs/sha256-" + hex.EncodeToString(sum[:])},
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
