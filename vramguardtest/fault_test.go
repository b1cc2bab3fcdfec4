package vramguardtest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

func TestFaults(t *testing.T) {
	tests := []struct {
		name  string
		fault vramguardtest.Fault
		check func(t *testing.T, s *vramguardtest.Server, c *api.Client, res result, elapsed time.Duration)
	}{
		{
			name:  "stall before first chunk",
			fault: vramguardtest.Stall(120 * time.Millisecond),
			check: func(t *testing.T, _ *vramguardtest.Server, _ *api.Client, res result, elapsed time.Duration) {
				if res.final == nil || elapsed < 120*time.Millisecond {
					t.Errorf("done %v after %v, want done after >= 120ms", res.final != nil, elapsed)
				}
			},
		},
		{
			name:  "stall between chunks",
			fault: vramguardtest.StallAfter(2, 120*time.Millisecond),
			check: func(t *testing.T, _ *vramguardtest.Server, _ *api.Client, res result, _ time.Duration) {
				if len(res.chunks) != 4 || res.final == nil {
					t.Fatalf("got %d chunks, done %v", len(res.chunks), res.final != nil)
				}
				if gap := res.chunks[2].CreatedAt.Sub(res.chunks[1].CreatedAt); gap < 120*time.Millisecond {
					t.Errorf("gap after chunk 2 = %v, want >= 120ms", gap)
				}
			},
		},
		{
			name:  "crash mid-stream",
			fault: vramguardtest.CrashAfter(2),
			check: func(t *testing.T, s *vramguardtest.Server, c *api.Client, res result, _ time.Duration) {
				if res.err == nil || res.err.Error() != "an error was encountered while running the model: unexpected EOF" {
					t.Errorf("err = %v", res.err)
				}
				if len(res.chunks) != 2 || res.final != nil {
					t.Errorf("got %d chunks, done %v; want 2, no done", len(res.chunks), res.final != nil)
				}
				if _, ok := ps(t, c, "tiny:latest"); !ok {
					t.Error("dead runner not listed by /api/ps")
				}
				if r, _ := runner(s, "tiny:latest"); !r.Dead {
					t.Error("runner not marked dead")
				}
				// The next request reloads silently.
				next := mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
				if next.final.LoadDuration <= 0 || s.Loads("tiny") != 2 {
					t.Errorf("after a crash: load_duration %v, Loads %d; want a reload", next.final.LoadDuration, s.Loads("tiny"))
				}
			},
		},
		{
			name:  "crash before output",
			fault: vramguardtest.CrashAfter(0),
			check: func(t *testing.T, _ *vramguardtest.Server, _ *api.Client, res result, _ time.Duration) {
				if se := statusError(t, res.err); se.StatusCode != 500 || !strings.Contains(se.ErrorMessage, "unexpected EOF") {
					t.Errorf("got %+v", se)
				}
			},
		},
		{
			name:  "crash at load",
			fault: vramguardtest.LoadCrash(),
			check: func(t *testing.T, s *vramguardtest.Server, c *api.Client, res result, _ time.Duration) {
				se := statusError(t, res.err)
				if se.StatusCode != 500 || se.ErrorMessage != "llama runner process has terminated: exit status 2" {
					t.Errorf("got %+v", se)
				}
				if _, ok := ps(t, c, "tiny:latest"); ok || s.Loads("tiny") != 0 {
					t.Error("failed load left the model listed or counted")
				}
				mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
			},
		},
		{
			name:  "runner stopped at load",
			fault: vramguardtest.RunnerStopped(),
			check: func(t *testing.T, _ *vramguardtest.Server, _ *api.Client, res result, _ time.Duration) {
				if se := statusError(t, res.err); se.StatusCode != 500 || !strings.HasPrefix(se.ErrorMessage, "model runner has unexpectedly stopped") {
					t.Errorf("got %+v", se)
				}
			},
		},
		{
			name:  "out of memory at load",
			fault: vramguardtest.OOM(),
			check: func(t *testing.T, s *vramguardtest.Server, _ *api.Client, res result, _ time.Duration) {
				se := statusError(t, res.err)
				if se.StatusCode != 500 || se.ErrorMessage != "model requires more system memory (2.0 GiB) than is available (0 B)" {
					t.Errorf("got %+v", se)
				}
				if _, used, _ := s.Memory(); used != 0 {
					t.Errorf("failed load holds %d bytes", used)
				}
			},
		},
		{
			name:  "busy",
			fault: vramguardtest.Busy(),
			check: func(t *testing.T, _ *vramguardtest.Server, _ *api.Client, res result, _ time.Duration) {
				if se := statusError(t, res.err); se.StatusCode != 503 || se.ErrorMessage != "server busy, please try again.  maximum pending requests exceeded" {
					t.Errorf("got %+v", se)
				}
			},
		},
		{
			name:  "stream closed without done",
			fault: vramguardtest.CloseAfter(3),
			check: func(t *testing.T, _ *vramguardtest.Server, _ *api.Client, res result, _ time.Duration) {
				if res.err != nil || len(res.chunks) != 3 || res.final != nil {
					t.Errorf("err %v, %d chunks, done %v; want nil, 3, no done", res.err, len(res.chunks), res.final != nil)
				}
			},
		},
		{
			name:  "repeat-token abort",
			fault: vramguardtest.RepeatAfter(3),
			check: func(t *testing.T, _ *vramguardtest.Server, _ *api.Client, res result, _ time.Duration) {
				if res.err != nil || len(res.chunks) != 3 || res.final != nil {
					t.Fatalf("err %v, %d chunks, done %v; want nil, 3, no done", res.err, len(res.chunks), res.final != nil)
				}
				if res.chunks[0].Response != res.chunks[2].Response {
					t.Errorf("chunks differ: %q, %q", res.chunks[0].Response, res.chunks[2].Response)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})
			if err := s.FailNext("tiny", tt.fault); err != nil {
				t.Fatal(err)
			}
			begin := time.Now()
			res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
			tt.check(t, s, c, res, time.Since(begin))
		})
	}
}

func TestFaultScope(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	if err := s.FailNext("nope", vramguardtest.Busy()); err == nil {
		t.Error("FailNext accepted an unknown model")
	}
	// One-shot: only the next request.
	s.FailNext("tiny", vramguardtest.Busy())
	if res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"}); res.err == nil {
		t.Error("FailNext fault did not fire")
	}
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})

	// Persistent until cleared.
	s.SetFaults("tiny", vramguardtest.CloseAfter(1))
	for range 2 {
		if res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"}); res.final != nil {
			t.Error("SetFaults fault did not fire")
		}
	}
	s.SetFaults("tiny")
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})

	// Non-streaming replies see faults too.
	stream := false
	s.FailNext("tiny", vramguardtest.CrashAfter(1))
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "p", Stream: &stream},
		func(api.GenerateResponse) error { return nil })
	if se := statusError(t, err); se.StatusCode != 500 {
		t.Errorf("non-streaming crash: %+v", se)
	}
}
