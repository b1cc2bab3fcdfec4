package comfyuitest_test

import (
	"context"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard/vramguardtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const gib = 1 << 30

// start returns a running fake Ollama, closed when the test ends, and a
// real api.Client for it.
func start(t *testing.T, cfg vramguardtest.Config) (*vramguardtest.Server, *api.Client) {
	t.Helper()
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s, s.APIClient()
}

// generate runs one generation and returns its error.
func generate(ctx context.Context, c *api.Client, req *api.GenerateRequest) struct{ err error } {
	err := c.Generate(ctx, req, func(api.GenerateResponse) error { return nil })
	return struct{ err error }{err}
}

// unload sends Ollama's unload request.
func unload(t *testing.T, c *api.Client, name string) {
	t.Helper()
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: name, KeepAlive: keepAlive(0)},
		func(api.GenerateResponse) error { return nil })
	if err != nil {
		t.Fatalf("unload %s: %v", name, err)
	}
}

func keepAlive(d time.Duration) *api.Duration { return &api.Duration{Duration: d} }

// waitFor waits for cond on the fake Ollama, failing the test after d.
func waitFor(t *testing.T, s *vramguardtest.Server, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
