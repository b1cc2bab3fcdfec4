package vramguard

import (
	"errors"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard/internal/testkit/faultproxy"
	"github.com/vramguard/vramguard/internal/testkit/sim"
)

// checkVision's doc: "The question counts against the call's first-chunk
// timeout". Timeouts.Total: "bounds the whole generation". A slow /api/show
// followed by a slow first chunk, each under the limit but together over
// it, must time out; the stream's watchdog starts afresh after the check.
func TestReviewVisionCheckCountsAgainstTimeouts(t *testing.T) {
	const step = 400 * time.Millisecond
	for _, tt := range []struct {
		name string
		to   Timeouts
	}{
		{"first chunk", Timeouts{FirstChunk: 600 * time.Millisecond}},
		{"total", Timeouts{FirstChunk: 10 * time.Second, Total: 600 * time.Millisecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, sim.Config{}, sim.ModelConfig{Name: "llava", Vision: true, Chunks: 2})
			p, err := faultproxy.New(s.URL(), faultproxy.Options{Rule: func(r *faultproxy.Request) faultproxy.Fault {
				if r.Path == "/api/show" {
					return faultproxy.Delay(step)
				}
				return faultproxy.Pass()
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			c := newProxyClient(t, p, Options{Timeouts: tt.to})
			if err := s.FailNext("llava", sim.Stall(step)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			gen, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "llava", Prompt: "x", Images: []api.ImageData{testPNG(t)}}, KeepAliveUnload, nil)
			took := time.Since(start)
			if !errors.Is(err, KindTimeout) {
				t.Fatalf("took %v with timeouts %+v, got gen=%v err=%v; want KindTimeout: the vision check's time was not counted", took, tt.to, gen != nil, err)
			}
		})
	}
}

// With Total shorter than FirstChunk, the vision check is cut by Total
// (min(FirstChunk, Total)), but the error names ErrFirstChunkTimeout: a
// caller matching ErrTotalTimeout misses it.
func TestReviewVisionCheckTotalCause(t *testing.T) {
	s := newSim(t, sim.Config{}, sim.ModelConfig{Name: "llava", Vision: true})
	p, err := faultproxy.New(s.URL(), faultproxy.Options{Rule: func(r *faultproxy.Request) faultproxy.Fault {
		if r.Path == "/api/show" {
			return faultproxy.Stall(time.Minute)
		}
		return faultproxy.Pass()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := newProxyClient(t, p, Options{Timeouts: Timeouts{FirstChunk: time.Minute, Total: 100 * time.Millisecond}})
	_, err = c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "llava", Prompt: "x", Images: []api.ImageData{testPNG(t)}}, KeepAliveUnload, nil)
	if !errors.Is(err, KindTimeout) || !errors.Is(err, ErrTotalTimeout) {
		t.Fatalf("got %v, want KindTimeout wrapping ErrTotalTimeout (the Total limit is what fired)", err)
	}
}
