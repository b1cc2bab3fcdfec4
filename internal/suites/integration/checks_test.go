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
// says why; the same unload against the real server makes the check. And
// beside a second real server on another port that serves the same
// weights files (one models folder), the first server's unload neither
// counts the second's runner as its own (it waited for it, and gave up
// unverified, while the other kept it warm) nor lets the check go.
func TestRunnerCheckTiedToServer(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "the check needs the server's process on this machine")
		c := newClient(t, s, vramguard.Options{})
		if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		rep, err := c.UnloadModel(t.Context(), modelA)
		if err != nil || !rep.Verified || rep.Checked&vramguard.CheckRunnerProcesses == 0 || rep.NoRunnerCheck != "" {
			t.Fatalf("unload on the real server: %+v, %v; want verified with the runner check", rep, err)
		}

		// A second server on another port, with the same models folder,
		// keeps the same weights warm in a runner of its own.
		other, err := ollamatest.Start(t.Context(), ollamatest.Options{Version: s.Version(), Env: []string{"OLLAMA_MODELS=" + s.ModelsDir()}, Logf: t.Logf})
		if err != nil {
			t.Fatalf("a second ollama %s: %v", s.Version(), err)
		}
		t.Cleanup(func() {
			if err := other.Stop(); err != nil {
				t.Errorf("stop the second server: %v", err)
			}
		})
		oc := newClient(t, other, vramguard.Options{})
		if _, err := oc.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		rep, err = c.UnloadModel(t.Context(), modelA)
		if err != nil || !rep.Verified || rep.Checked&vramguard.CheckRunnerProcesses == 0 {
			t.Fatalf("unload beside a second server of the same weights: %+v, %v; want verified with the runner check", rep, err)
		}
		if ps, err := other.Client().ListRunning(t.Context()); err != nil || len(ps.Models) != 1 {
			t.Errorf("the second server after the first's unload: %v, %v; want its model still warm", ps, err)
		}
		if _, err := oc.UnloadModel(t.Context(), modelA); err != nil {
			t.Errorf("unload on the second server: %v", err)
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
