package vramguard_test

import (
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

// A generation with a keep-alive that begins while an unload's last poll
// is in flight may load the model after that poll: the unload must not
// drop it from what Close unloads.
func TestUnloadKeepsNewerWarmModel(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a", LoadLatency: 300 * time.Millisecond})
	c := newTestClient(t, s, Options{})
	polls := 0
	genDone := make(chan error, 1)
	WrapPSList(c, func(inner func(context.Context) (*api.ProcessResponse, error)) func(context.Context) (*api.ProcessResponse, error) {
		return func(ctx context.Context) (*api.ProcessResponse, error) {
			if polls++; polls == 2 {
				time.Sleep(60 * time.Millisecond) // past the settle window after the unload
				go func() {
					_, err := c.GenerateStreaming(context.Background(), &GenerateRequest{Model: "a", Prompt: "x"}, KeepAliveFor(time.Hour), nil)
					genDone <- err
				}()
				for InFlight(c, "a") == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			return inner(ctx)
		}
	})
	if _, err := c.UnloadModel(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := <-genDone; err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if s.Listed("a") {
		t.Error("Close left a model this client used with a 1h keep-alive resident")
	}
}

// The shared /api/ps request of a caller that gave up does not outlive
// Close.
func TestPollerJoinedByClose(t *testing.T) {
	s := newSim(t, vramguardtest.Config{PSDelay: time.Second}, vramguardtest.ModelConfig{Name: "a"})
	c, err := NewClient(Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The call runs under a profiler label, which the goroutines it
	// starts inherit: the checks below look at this client's shared
	// request only, not at another test's client.
	label := pprof.Labels("test", t.Name())
	pprof.Do(t.Context(), label, func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, err := c.Running(ctx); err == nil {
			t.Fatal("Running returned before the delayed /api/ps reply")
		}
	})
	// The caller gave up; its request is still in flight, so the check
	// below can see one.
	if !fetching(t.Name()) {
		t.Fatal("no shared /api/ps request in flight after the caller gave up: the check below would prove nothing")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close returns once the request has ended; its goroutine may still
	// be returning through fetch's frame (a few instructions, which a busy
	// machine under -race stretched past the first look). Gone within a
	// tenth of the 1 s the request itself would take (the server's
	// injected delay) is joined; a request Close did not wait for would
	// still be in flight then.
	for deadline := time.Now().Add(100 * time.Millisecond); fetching(t.Name()); {
		if time.Now().After(deadline) {
			t.Fatal("a shared /api/ps request still runs 100 ms after Close returned (the request takes 1 s)")
		}
		time.Sleep(time.Millisecond)
	}
}

// fetching reports whether a goroutine of the poller's shared request
// runs with the profiler label test=name.
func fetching(name string) bool {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	for _, rec := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(rec, "(*poller).fetch") && strings.Contains(rec, `"test":"`+name+`"`) {
			return true
		}
	}
	return false
}

// Found by the race oracle (#23, ollama 0.34.4, seed 161203832554445): a
// guarded generation whose caller canceled it after the done line had
// arrived, while the reply's end was still being read, came back
// KindCanceled with its whole text received. A generation that reached
// its done line is complete: a cancel or a timeout after it changes
// nothing.
func TestCancelAfterDoneIsComplete(t *testing.T) {
	for _, e := range endpoints() {
		for _, viaAPI := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, api client %v", e.name, viaAPI), func(t *testing.T) {
				s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 3})
				opts := Options{}
				if viaAPI {
					opts.API = s.APIClient()
				}
				c := newTestClient(t, s, opts)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				g, err := e.run(ctx, c, &GenerateRequest{Model: "tiny", Prompt: "a castle"}, KeepAliveUnload, func(ch Chunk) error {
					if ch.Done {
						cancel()
					}
					return nil
				})
				if err != nil || g == nil || g.DoneReason == "" {
					t.Fatalf("canceled after the done line: %+v, %v; want the complete generation", g, err)
				}
			})
		}
	}
}
