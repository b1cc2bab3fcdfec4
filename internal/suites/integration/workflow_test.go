package integration_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// workflow is the original design's prompt stage: the generator on model B,
// the refiner three passes on model A, the negative prompt on A.
var workflow = []string{modelB, modelA, modelA, modelA, modelA}

// runWorkflow runs the steps through g and returns the loads counted from
// the load durations Ollama reports.
func runWorkflow(t *testing.T, ctx context.Context, g vramguard.Guard) (loads int, err error) {
	for i, m := range workflow {
		gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: m, Prompt: fmt.Sprintf("step %d: a castle", i), Options: short(8)}, nil)
		if err != nil {
			return loads, err
		}
		if gen.Loaded {
			loads++
		}
		t.Logf("step %d on %s: load_duration %v, loaded %v", i, m, gen.Metrics.LoadDuration, gen.Loaded)
	}
	return loads, nil
}

// Case 8 and the lifecycle issue: per-call eviction does 5 loads, a phase 2,
// and both hand over an empty /api/ps before "the diffusion model loads".
func TestOriginalWorkflow(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		t.Run("per-call", func(t *testing.T) {
			c := newClient(t, s, vramguard.Options{})
			start := time.Now()
			stop := watchLoads(t, s)
			reported, err := runWorkflow(t, t.Context(), vramguard.Guard{Client: c})
			loads := stop()
			if s.External() {
				loads = reported // its processes are not visible here
			}
			if err != nil {
				t.Fatal(err)
			}
			requireEmpty(t, s, "before the diffusion step")
			if loads != 5 {
				t.Errorf("per-call mode: %d runner starts, want 5", loads)
			}
			t.Logf("per-call: %d loads (%d reported as loads by load_duration), %v", loads, reported, time.Since(start))
		})
		t.Run("phase", func(t *testing.T) {
			var hookLoads atomic.Int32
			c := newClient(t, s, vramguard.Options{Hooks: vramguard.Hooks{OnCallEnd: func(_ context.Context, e vramguard.CallEnd) {
				if e.Generation != nil && e.Generation.Loaded {
					hookLoads.Add(1)
				}
			}}})
			start := time.Now()
			p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stop := watchLoads(t, s)
			reported, err := runWorkflow(t, t.Context(), p.Guard())
			loads := stop()
			if s.External() {
				loads = reported // its processes are not visible here
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(running(t, s)) == 0 {
				t.Error("nothing warm inside the phase")
			}
			rep, err := p.End(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			requireEmpty(t, s, "before the diffusion step")
			// Loads are counted as the server's runner starts. The library
			// tells a load from a reuse by load_duration, which a busy
			// machine can push past the default LoadThreshold on a reuse (18 ms
			// seen under a parallel build), never below it on a load: each
			// load must reach the hook, a reuse may too.
			if loads != 2 {
				t.Errorf("phase mode: %d runner starts, want 2", loads)
			}
			if h := int(hookLoads.Load()); h < loads || h != reported {
				t.Errorf("OnCallEnd told %d loads for %d loads (%d generations reported Loaded)", h, loads, reported)
			}
			t.Logf("phase: %d loads (%d reported), %v, %d verified unloads", loads, reported, time.Since(start), len(rep.Cleanup.Unloads))
		})
	})
}
