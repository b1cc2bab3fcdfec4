package integration_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// countingTransport counts the requests a client sends.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

func countedClient(t *testing.T, s *ollamatest.Server, opts vramguard.Options) (*vramguard.OllamaClient, *countingTransport) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	ct := &countingTransport{next: tr}
	opts.HTTPClient = &http.Client{Transport: ct}
	return newClient(t, s, opts), ct
}

// TestClosedClientContract: on every version, after Close every call of
// the client and of its guards fails with ErrClosed and sends nothing.
func TestClosedClientContract(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		c, ct := countedClient(t, s, vramguard.Options{})
		if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil { // unloads what it left warm
			t.Fatal(err)
		}
		requireEmpty(t, s, "after Close")
		before := ct.n.Load()
		g := vramguard.Guard{Client: c}
		called := false
		for name, err := range map[string]error{
			"UnloadModel": second(c.UnloadModel(t.Context(), modelA)),
			"UnloadAll":   second(c.UnloadAll(t.Context())),
			"Cleanup":     second(c.Cleanup(t.Context(), vramguard.CleanupOptions{AllModels: true})),
			"ReleaseVRAM": second(c.ReleaseVRAM(t.Context())),
			"EnsureFree":  second(c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1})),
			"Running":     second(c.Running(t.Context())),
			"IsResident":  second(c.IsResident(t.Context(), modelA)),
			"ListModels":  second(c.ListModels(t.Context())),
			"Generate":    second(c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveUnload, nil)),
			"Guard.Run": g.Run(t.Context(), modelA, func(context.Context, *vramguard.Session) error {
				called = true
				return nil
			}),
		} {
			if !errors.Is(err, vramguard.ErrClosed) {
				t.Errorf("%s after Close: %v, want ErrClosed", name, err)
			}
		}
		if n := ct.n.Load() - before; n != 0 || called {
			t.Errorf("after Close: %d requests sent, guarded function called: %v", n, called)
		}
		requireEmpty(t, s, "after the calls on the closed client")
	})
}

func second[T any](_ T, err error) error { return err }

// TestRefusedGuardedCallLeavesOthersModel: another program loaded the
// model with a 1 h keep-alive; a guarded call refused before it reached
// the server (a prompt over MaxPromptBytes) must not unload it.
func TestRefusedGuardedCallLeavesOthersModel(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		raw := s.Client()
		if err := raw.Generate(t.Context(), &api.GenerateRequest{Model: modelA, Prompt: "x", Options: short(2),
			KeepAlive: &api.Duration{Duration: time.Hour}}, func(api.GenerateResponse) error { return nil }); err != nil {
			t.Fatal(err)
		}
		c, ct := countedClient(t, s, vramguard.Options{})
		g := vramguard.Guard{Client: c}
		_, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: modelA,
			Prompt: strings.Repeat("x", vramguard.MaxPromptBytes+1)}, nil)
		if !errors.Is(err, vramguard.KindInvalidInput) {
			t.Fatalf("got %v, want KindInvalidInput", err)
		}
		if n := ct.n.Load(); n != 0 {
			t.Errorf("the refused call sent %d requests", n)
		}
		t.Logf("ollama %s: %v", s.Version(), err)
		ps, err := raw.ListRunning(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(ps.Models) != 1 || time.Until(ps.Models[0].ExpiresAt) < 50*time.Minute {
			t.Fatalf("the other program's model after the refused call: %+v", ps.Models)
		}
		if _, err := c.UnloadModel(t.Context(), modelA); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGuardReturnsWhileOthersGenerate: another program generates on the
// model when a guard's use ends. The guard returns its good result with
// KindUnverified and ErrHeldByOthers (not retryable) while that
// generation still runs, and the model goes once it ends.
func TestGuardReturnsWhileOthersGenerate(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		if s.UsesStandin() {
			// A long generation: 2,000 tokens at 5 ms.
			setKnobs(t, s, standin.Knobs{EOSAfter: 5000, TokenMS: 5})
		}
		c := newClient(t, s, vramguard.Options{})
		raw := s.Client()
		otherCtx, stopOther := context.WithCancel(t.Context())
		defer stopOther()
		otherDone := make(chan struct{})
		var gen *vramguard.Generation
		g := vramguard.Guard{Client: c}
		err := g.Run(t.Context(), modelA, func(ctx context.Context, ss *vramguard.Session) error {
			var err error
			if gen, err = ss.Generate(ctx, req(modelA, 4), nil); err != nil {
				return err
			}
			// Another program starts a long generation on the model.
			first := make(chan struct{})
			go func() {
				defer close(otherDone)
				var once atomic.Bool
				_ = raw.Generate(otherCtx, &api.GenerateRequest{Model: modelA, Prompt: "y", Options: short(2000)},
					func(api.GenerateResponse) error {
						if !once.Swap(true) {
							close(first)
						}
						return nil
					})
			}()
			select {
			case <-first:
			case <-otherDone:
				return errors.New("the other generation ended before its first chunk")
			}
			return nil
		})
		if gen == nil {
			t.Fatalf("no generation: %v", err)
		}
		select {
		case <-otherDone:
			t.Fatalf("the guard returned only after the other program's generation ended (err %v)", err)
		default:
		}
		k := vramguard.KindOf(err)
		if !errors.Is(err, vramguard.ErrHeldByOthers) || k != vramguard.KindUnverified || k.Retryable() {
			t.Fatalf("guard: %v (kind %v), want KindUnverified with ErrHeldByOthers", err, k)
		}
		t.Logf("ollama %s: %q, then %v", s.Version(), gen.Text, err)
		// The unload was sent: the model goes when the other request ends.
		stopOther()
		<-otherDone
		waitEmpty(t, s, 10*time.Second)
	})
}
