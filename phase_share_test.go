package vramguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// TestPhasesShareAClient (issue #35, item 1): two phases of one client on
// one model: the first End leaves the model to the other (its report says
// so, naming the phase), whose next step is a reuse, and the last End
// unloads it, verified: one load for both. A plain guard's cleanup leaves
// it too. Before, the first End unloaded it and the second phase loaded
// it again (2 loads).
func TestPhasesShareAClient(t *testing.T) {
	for _, noLease := range []bool{false, true} {
		name := map[bool]string{false: "leased", true: "NoLease"}[noLease]
		t.Run(name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "m", LoadLatency: 20 * time.Millisecond})
			c := newTestClient(t, s, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: leaseDir(t)}})
			step := func(p *vramguard.Phase) *vramguard.Generation {
				t.Helper()
				g := p.Guard()
				gen, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "m", Prompt: "x"}, nil)
				if err != nil {
					t.Fatal(err)
				}
				return gen
			}
			a, err := c.StartPhase(t.Context(), "a", vramguard.PhaseOptions{NoLease: noLease})
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.StartPhase(t.Context(), "b", vramguard.PhaseOptions{NoLease: noLease})
			if err != nil {
				t.Fatal(err)
			}
			step(a)
			step(b)
			rep, err := a.End(t.Context())
			if err != nil {
				t.Fatalf("a.End: %v", err)
			}
			if len(rep.Cleanup.Unloads) != 1 {
				t.Fatalf("a's cleanup %+v; want one report for m", rep.Cleanup)
			}
			u := rep.Cleanup.Unloads[0]
			if u.Verified || u.Attempts != 0 || len(u.Leased) != 1 || u.Leased[0].Note != "phase b" {
				t.Errorf("a's report for m %+v; want it left, no unload sent, held by phase b", u)
			}
			if !s.Listed("m") {
				t.Fatal("a.End unloaded the model phase b keeps warm")
			}
			// A plain guard of the same client leaves it as well.
			plain := vramguard.Guard{Client: c}
			if _, err := plain.Generate(t.Context(), &vramguard.GenerateRequest{Model: "m", Prompt: "y"}, nil); err != nil {
				t.Fatal(err)
			}
			if !s.Listed("m") {
				t.Fatal("a guard's cleanup unloaded the model phase b keeps warm")
			}
			if gen := step(b); gen.Loaded {
				t.Error("b's next step loaded the model again")
			}
			rep, err = b.End(t.Context())
			if err != nil || len(rep.Cleanup.Unloads) != 1 || !rep.Cleanup.Unloads[0].Verified {
				t.Fatalf("b.End = %+v, %v; want m unloaded, verified", rep.Cleanup, err)
			}
			if s.Listed("m") || s.Loads("m") != 1 {
				t.Errorf("after the last End: listed %v, %d loads; want gone after 1 load", s.Listed("m"), s.Loads("m"))
			}
		})
	}
}

// TestPhaseHandoverSparesOtherPhase: a phase's hand-over does not evict a
// model another live phase of its client keeps; when the room needs it,
// the hand-over refuses, naming that phase.
func TestPhaseHandoverSparesOtherPhase(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "m", SizeVRAM: 8 * gib})
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Leases: vramguard.LeaseOptions{Dir: leaseDir(t)}})
	a, err := c.StartPhase(t.Context(), "a", vramguard.PhaseOptions{NeedBytes: 20 * gib})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.StartPhase(t.Context(), "b", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = b.End(context.Background()) }()
	g := b.Guard()
	if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "m", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = a.End(t.Context())
	var re *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrLeased) || !errors.As(err, &re) || !strings.Contains(err.Error(), "phase b") {
		t.Errorf("a.End's hand-over = %v; want a refusal naming phase b", err)
	}
	if !s.Listed("m") {
		t.Error("a's hand-over evicted the model phase b keeps")
	}
}

// TestPhaseGuardKeepsItsModel (the composition oracle's seed
// 1796173682162242647): a plain guard and a phase's guard use one model at
// once and the plain one ends first, wanting the model unloaded. The
// phase's guard ended last and honoured that wish, unloading the model its
// phase keeps (the phase's next step loaded it again). The phase keeps it
// now, and its End unloads it, verified.
func TestPhaseGuardKeepsItsModel(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, vramguard.Options{})
	p, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inPhase, plainDone := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		pg := p.Guard()
		errs <- pg.Run(t.Context(), "tiny", func(ctx context.Context, ss *vramguard.Session) error {
			_, err := ss.Generate(ctx, &vramguard.GenerateRequest{Prompt: "x"}, nil)
			close(inPhase)
			<-plainDone // the plain guard ends first
			return err
		})
	}()
	<-inPhase
	g := vramguard.Guard{Client: c}
	if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	close(plainDone)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if !s.Listed("tiny") {
		t.Fatalf("after both guards ended the phase's model is gone (%d loads); want it warm until End", s.Loads("tiny"))
	}
	rep, err := p.End(t.Context())
	if err != nil || len(rep.Cleanup.Unloads) != 1 || !rep.Cleanup.Unloads[0].Verified || s.Listed("tiny") {
		t.Fatalf("End: %+v, %v, listed %v; want tiny unloaded, verified", rep, err, s.Listed("tiny"))
	}
	if n := s.Loads("tiny"); n != 1 {
		t.Errorf("%d loads; want 1", n)
	}
}
