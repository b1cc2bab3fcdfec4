package vramguardtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard/vramguardtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start returns a running simulator, closed when the test ends, and a real
// api.Client for it.
func start(t *testing.T, cfg vramguardtest.Config) (*vramguardtest.Server, *api.Client) {
	t.Helper()
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s, s.APIClient()
}

// tiny is a small, fast model.
func tiny(mods ...func(*vramguardtest.ModelConfig)) vramguardtest.ModelConfig {
	m := vramguardtest.ModelConfig{
		Name:        "tiny",
		Size:        2 << 30,
		SizeVRAM:    2 << 30,
		LoadLatency: 10 * time.Millisecond,
		Chunks:      4,
	}
	for _, f := range mods {
		f(&m)
	}
	return m
}

// result is what a Generate call produced.
type result struct {
	chunks []api.GenerateResponse // lines without done
	final  *api.GenerateResponse  // the done:true line, if any
	err    error
}

func generate(ctx context.Context, c *api.Client, req *api.GenerateRequest) result {
	var res result
	res.err = c.Generate(ctx, req, func(r api.GenerateResponse) error {
		if r.Done {
			res.final = &r
		} else {
			res.chunks = append(res.chunks, r)
		}
		return nil
	})
	return res
}

// mustGenerate runs a generation that must end with done:true.
func mustGenerate(t *testing.T, c *api.Client, req *api.GenerateRequest) result {
	t.Helper()
	res := generate(t.Context(), c, req)
	if res.err != nil {
		t.Fatalf("Generate(%s): %v", req.Model, res.err)
	}
	if res.final == nil {
		t.Fatalf("Generate(%s): stream ended without done", req.Model)
	}
	return res
}

// unload sends Ollama's unload request.
func unload(t *testing.T, c *api.Client, name string) api.GenerateResponse {
	t.Helper()
	var got api.GenerateResponse
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: name, KeepAlive: keepAlive(0)},
		func(r api.GenerateResponse) error { got = r; return nil })
	if err != nil {
		t.Fatalf("unload %s: %v", name, err)
	}
	return got
}

func keepAlive(d time.Duration) *api.Duration { return &api.Duration{Duration: d} }

// ps returns the /api/ps entry for model name ("tiny:latest").
func ps(t *testing.T, c *api.Client, name string) (api.ProcessModelResponse, bool) {
	t.Helper()
	resp, err := c.ListRunning(t.Context())
	if err != nil {
		t.Fatalf("ListRunning: %v", err)
	}
	for _, m := range resp.Models {
		if m.Name == name {
			return m, true
		}
	}
	return api.ProcessModelResponse{}, false
}

// runner returns the simulator's state of model name.
func runner(s *vramguardtest.Server, name string) (vramguardtest.RunnerState, bool) {
	for _, r := range s.Running() {
		if r.Model == name {
			return r, true
		}
	}
	return vramguardtest.RunnerState{}, false
}

// waitFor waits up to d for cond.
func waitFor(t *testing.T, s *vramguardtest.Server, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// statusError returns err as an api.StatusError.
func statusError(t *testing.T, err error) api.StatusError {
	t.Helper()
	var se api.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not an api.StatusError", err, err)
	}
	return se
}
