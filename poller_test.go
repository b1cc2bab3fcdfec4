package vramguard_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/vramguard/vramguard/vramguardtest"
)

// psClock records when each /api/ps request goes out.
type psClock struct {
	next http.RoundTripper
	mu   sync.Mutex
	at   []time.Time
}

func (p *psClock) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/api/ps" {
		p.mu.Lock()
		p.at = append(p.at, time.Now())
		p.mu.Unlock()
	}
	return p.next.RoundTrip(r)
}

// Concurrent unloads of N models share the client's /api/ps requests: at
// most one per poll interval, where each unload polling on its own makes
// about N.
func TestConcurrentUnloadsSharePolls(t *testing.T) {
	const (
		n        = 8
		interval = 20 * time.Millisecond
	)
	var models []vramguardtest.ModelConfig
	for i := range n {
		models = append(models, vramguardtest.ModelConfig{Name: fmt.Sprintf("m%d", i)})
	}
	// Each model stays listed for 300 ms after its unload: the unloads
	// poll for that long, side by side.
	s := newSim(t, vramguardtest.Config{UnloadDelay: 300 * time.Millisecond}, models...)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	clock := &psClock{next: tr}
	c := newTestClient(t, s, Options{PollInterval: interval, HTTPClient: &http.Client{Transport: clock}})
	for _, m := range models {
		if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: m.Name, Prompt: "x"}, KeepAliveFor(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
	}
	clock.mu.Lock()
	clock.at = nil
	clock.mu.Unlock()

	start := time.Now()
	reps, err := c.UnloadAll(t.Context())
	elapsed := time.Since(start)
	if err != nil || len(reps) != n {
		t.Fatalf("UnloadAll: %d reports, %v", len(reps), err)
	}
	polls := 0
	for _, r := range reps {
		if !r.Verified {
			t.Errorf("%s not verified: %+v", r.Model, r)
		}
		polls += r.Polls
	}
	clock.mu.Lock()
	at := clock.at
	clock.mu.Unlock()
	// One request per interval, plus the first.
	if max := int(elapsed/interval) + 1; len(at) > max {
		t.Errorf("%d /api/ps requests in %v: more than one per %v interval (%d)", len(at), elapsed, interval, max)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < interval/2 {
			t.Errorf("/api/ps requests %d and %d went out %v apart, within one %v interval", i-1, i, gap, interval)
		}
	}
	t.Logf("%d unloads in %v read %d listings from %d /api/ps requests", n, elapsed.Round(time.Millisecond), polls, len(at))
}
