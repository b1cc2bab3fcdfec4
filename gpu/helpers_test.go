package gpu

import (
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// newSim starts a simulator with the given models; it is closed at the end
// of the test.
func newSim(t *testing.T, cfg vramguardtest.Config, models ...vramguardtest.ModelConfig) *vramguardtest.Server {
	t.Helper()
	cfg.Models = append(cfg.Models, models...)
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// newTestClient returns a client for s with fast polling; it is closed at
// the end of the test and must close cleanly.
func newTestClient(t *testing.T, s *vramguardtest.Server, opts vramguard.Options) *vramguard.OllamaClient {
	t.Helper()
	opts.Host = s.URL().String()
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	if opts.UnloadTimeout == 0 {
		opts.UnloadTimeout = 5 * time.Second
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}
