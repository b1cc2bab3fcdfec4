package integration_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// TestRunnerCheckTiedToServer (issue #35, item 3): with a real `ollama
// serve` running on this machine, an unload against the test double on
// another port claims no runner check (it did, Checked
// ps+runner-processes, whenever any ollama serve ran), and the report
// says why; the same unload against the real server makes the check.
func TestRunnerCheckTiedToServer(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "the check needs the server's process on this machine")
		c := newClient(t, s, vramguard.Options{})
		if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		rep, err := c.UnloadModel(t.Context(), modelA)
		if err != nil || !rep.Verified || !rep.Checked.Has(vramguard.CheckRunnerProcesses) || rep.NoRunnerCheck != "" {
			t.Fatalf("unload on the real server: %+v, %v; want verified with the runner check", rep, err)
		}

		double := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny"}}})
		t.Cleanup(double.Close)
		dc := vramguardtest.NewClient(t, double, vramguard.Options{})
		if _, err := dc.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		rep, err = dc.UnloadModel(t.Context(), "tiny")
		if err != nil || !rep.Verified || rep.Checked != vramguard.CheckPS ||
			!strings.Contains(rep.NoRunnerCheck, "no ollama serve process visible on this machine listens on port") {
			t.Errorf("unload on the double beside a real server: %+v, %v; want /api/ps alone, saying why", rep, err)
		}
	})
}
