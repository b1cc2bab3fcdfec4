package vramguardtest

import (
	"time"

	"github.com/vramguard/vramguard"
)

// TB is what NewClient needs of a test: *testing.T, *testing.B and
// *testing.F have it.
type TB interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// NewClient returns a vramguard client of s for a test: opts with Host
// set to s's URL (the client then knows its server, and takes and honours
// leases), PollInterval 5 ms and UnloadTimeout 5 s where they are zero
// (unloads of the fake verify in milliseconds), and VRAM as given (set it
// to s.GPU() for a device). It fails the test at once if vramguard
// refuses opts, and closes the client in tb.Cleanup, failing the test if
// Close fails. Create s before it, so that the client closes first.
func NewClient(tb TB, s *Server, opts vramguard.Options) *vramguard.OllamaClient {
	tb.Helper()
	opts.Host, opts.API = s.URL().String(), nil
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	if opts.UnloadTimeout == 0 {
		opts.UnloadTimeout = 5 * time.Second
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		tb.Fatalf("vramguardtest.NewClient: %v", err)
		return nil
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Errorf("closing the client of %s: %v", s.URL(), err)
		}
	})
	return c
}
