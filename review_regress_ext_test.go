package vramguard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A closed client with a budget sends nothing either.
func TestClosedClientWithBudgetSendsNothing(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a"}}})
	t.Cleanup(s.Close)
	c, ct := countedClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}, Budget: &vramguard.Budget{}})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	before := ct.n.Load()
	_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	if !errors.Is(err, vramguard.ErrClosed) {
		t.Errorf("GenerateStreaming on a closed client: %v, want ErrClosed", err)
	}
	if n := ct.n.Load() - before; n > 0 {
		t.Errorf("closed client sent %d requests", n)
	}
}

// slowReader's first snapshot takes delay.
type slowReader struct {
	r     vramguard.VRAMReader
	delay time.Duration
	first chan struct{}
	once  bool
}

func (s *slowReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if !s.once {
		s.once = true
		close(s.first)
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.r.Snapshot(ctx)
}

// A generation waiting for another's budget check still honours its ctx.
func TestAdmissionHonoursContext(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "a"}, {Name: "b"}}})
	t.Cleanup(s.Close)
	const delay = 2 * time.Second
	sr := &slowReader{r: &vramguardtest.GPU{Server: s}, delay: delay, first: make(chan struct{})}
	c, _ := countedClient(t, s, vramguard.Options{VRAM: sr, Budget: &vramguard.Budget{}})
	other := make(chan struct{})
	go func() {
		defer close(other)
		_, _ = c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	}()
	t.Cleanup(func() { <-other })
	<-sr.first
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "b", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	if took := time.Since(start); !errors.Is(err, vramguard.KindCanceled) || took > delay/2 {
		t.Errorf("GenerateStreaming with a 50 ms ctx behind a %v budget check: %v after %v", delay, err, took)
	}
}

// Phase.End's hand-over (NeedBytes) waits for this client's generation on
// a model it evicts, as its unloads do, instead of cutting it.
func TestPhaseHandoverKeepsOwnGenerations(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	c, _ := countedClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}})
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	p, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{NeedBytes: 20 * gib})
	if err != nil {
		t.Fatal(err)
	}
	// A generation on big whose first chunk is slow (queued, prefill).
	if err := s.FailNext("big", vramguardtest.Stall(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "big", Prompt: "y"}, vramguard.KeepAliveFor(time.Hour), nil)
		errc <- err
	}()
	if err := s.WaitInFlight(t.Context(), "big", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Errorf("End: %v", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("the client's generation during the hand-over: %v", err)
	}
}
