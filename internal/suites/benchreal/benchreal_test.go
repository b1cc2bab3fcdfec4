package benchreal_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// pool holds one server per version for the whole run; TestMain stops them
// and then checks for leaked goroutines.
var pool = ollamatest.NewPool(ollamatest.Options{})

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pool.Wrap(m))
}

const (
	modelA = ollamatest.ModelA // the small model
	modelB = ollamatest.ModelB // the larger one

	// pollInterval is the vramguard client's PollInterval in every
	// benchmark here (the default is 50 ms).
	pollInterval = 10 * time.Millisecond
	// barePoll is the hand-written loop's poll interval.
	barePoll = time.Millisecond
	// opTimeout bounds one benchmark operation.
	opTimeout = 2 * time.Minute
)

// env is one server with both models registered, a raw API client with its
// own transport, and a vramguard client over that same API client.
type env struct {
	s   *ollamatest.Server
	raw *api.Client
	c   *vramguard.OllamaClient
}

// eachVersion runs fn as a sub-benchmark per server version.
func eachVersion(b *testing.B, fn func(b *testing.B, e *env)) {
	for _, v := range ollamatest.Versions() {
		b.Run("ollama="+v, func(b *testing.B) {
			s := pool.Require(b, v)
			b.Cleanup(func() {
				if b.Failed() {
					b.Logf("ollama %s server log (tail):\n%s", s.Version(), s.LogTail(6000))
				}
			})
			if err := ollamatest.RegisterModels(b.Context(), s); err != nil {
				b.Fatalf("register models: %v", err)
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			b.Cleanup(tr.CloseIdleConnections)
			raw := api.NewClient(s.URL(), &http.Client{Transport: tr})
			c, err := vramguard.NewClient(vramguard.Options{
				API:          raw,
				PollInterval: pollInterval,
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if err := c.Close(); err != nil {
					b.Errorf("Close: %v", err)
				}
				// Close unloads what the client left warm; a closed client
				// sends nothing, so the raw client looks.
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if ps, err := raw.ListRunning(ctx); err != nil || len(ps.Models) > 0 {
					b.Errorf("models left resident after Close: %v (err %v)", ps, err)
				}
			})
			e := &env{s: s, raw: raw, c: c}
			e.requireEmpty(b)
			fn(b, e)
		})
	}
}

// listed reports whether /api/ps lists model.
func listed(ms []api.ProcessModelResponse, model string) bool {
	want := vramguard.NormalizeModelName(model)
	for _, m := range ms {
		if vramguard.NormalizeModelName(m.Model) == want || vramguard.NormalizeModelName(m.Name) == want {
			return true
		}
	}
	return false
}

func (e *env) running(b *testing.B) []api.ProcessModelResponse {
	b.Helper()
	resp, err := e.raw.ListRunning(b.Context())
	if err != nil {
		b.Fatalf("/api/ps: %v", err)
	}
	return resp.Models
}

func (e *env) requireEmpty(b *testing.B) {
	b.Helper()
	if ms := e.running(b); len(ms) != 0 {
		b.Fatalf("/api/ps lists %d models, want none", len(ms))
	}
}

// load loads model with the server's default keep-alive (an empty prompt
// loads and answers at once) and waits until /api/ps lists it.
func (e *env) load(b *testing.B, model string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
	defer cancel()
	if err := e.raw.Generate(ctx, &api.GenerateRequest{Model: model}, func(api.GenerateResponse) error { return nil }); err != nil {
		b.Fatalf("load %s: %v", model, err)
	}
	for !listed(e.running(b), model) {
		if ctx.Err() != nil {
			b.Fatalf("%s not listed after its load", model)
		}
		time.Sleep(barePoll)
	}
}

// bareUnload is the unload a user writes by hand: the unload request, then
// /api/ps every barePoll until the model is gone. It returns the polls made.
func bareUnload(ctx context.Context, raw *api.Client, model string) (polls int, err error) {
	stream := false
	err = raw.Generate(ctx, &api.GenerateRequest{Model: model, KeepAlive: &api.Duration{}, Stream: &stream},
		func(api.GenerateResponse) error { return nil })
	if err != nil {
		return 0, err
	}
	for {
		resp, err := raw.ListRunning(ctx)
		polls++
		if err != nil {
			return polls, err
		}
		if !listed(resp.Models, model) {
			return polls, nil
		}
		time.Sleep(barePoll)
	}
}

// BenchmarkUnload compares UnloadModel (verified; PollInterval 10 ms) with
// the bare unload request followed by a 1 ms /api/ps poll loop. Each
// iteration first loads the model, untimed; the timed part ends when the
// model is no longer listed.
func BenchmarkUnload(b *testing.B) {
	const model = modelA
	eachVersion(b, func(b *testing.B, e *env) {
		b.Run("mode=verified", func(b *testing.B) {
			var polls, attempts int
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				e.load(b, model)
				ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
				b.StartTimer()
				rep, err := e.c.UnloadModel(ctx, model)
				b.StopTimer()
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				if !rep.Verified || !rep.WasLoaded {
					b.Fatalf("report %+v", rep)
				}
				polls += rep.Polls
				attempts += rep.Attempts
				b.StartTimer()
			}
			b.StopTimer()
			e.requireEmpty(b)
			b.ReportMetric(float64(polls)/float64(b.N), "polls/op")
			b.ReportMetric(float64(attempts)/float64(b.N), "requests/op")
		})
		b.Run("mode=bare", func(b *testing.B) {
			var polls int
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				e.load(b, model)
				ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
				b.StartTimer()
				n, err := bareUnload(ctx, e.raw, model)
				b.StopTimer()
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				polls += n
				b.StartTimer()
			}
			b.StopTimer()
			e.requireEmpty(b)
			b.ReportMetric(float64(polls)/float64(b.N), "polls/op")
			b.ReportMetric(1, "requests/op")
		})
	})
}

// workflow is the original design's prompt stage: the generator on model B,
// the refiner three passes on model A, the negative prompt on A.
var workflow = []string{modelB, modelA, modelA, modelA, modelA}

// runWorkflow runs the steps through g and returns the loads counted from
// Generation.Loaded, and the load_duration Ollama reported for the steps
// that did not count as loads.
func runWorkflow(ctx context.Context, g vramguard.Guard) (loads int, reuses []time.Duration, err error) {
	for i, m := range workflow {
		gen, err := g.Generate(ctx, &vramguard.GenerateRequest{
			Model:   m,
			Prompt:  fmt.Sprintf("step %d: a castle at dawn", i),
			Options: map[string]any{"num_predict": 8, "temperature": 0.7, "seed": 1},
		}, nil)
		if err != nil {
			return loads, reuses, err
		}
		if gen.Loaded {
			loads++
		} else {
			reuses = append(reuses, gen.Metrics.LoadDuration)
		}
	}
	return loads, reuses, nil
}

// BenchmarkWorkflow runs the original workflow per call (the zero Guard:
// keep-alive 0 and a verified unload after every step) and in one Phase
// (models kept warm, one verified unload of both at End). Both hand over an
// empty /api/ps, checked untimed after every iteration.
func BenchmarkWorkflow(b *testing.B) {
	eachVersion(b, func(b *testing.B, e *env) {
		b.Run("mode=per-call", func(b *testing.B) {
			loads := 0
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
				n, reuses, err := runWorkflow(ctx, vramguard.Guard{Client: e.c})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				if n != len(workflow) {
					// Every step follows a verified unload, so every step
					// loads; a load shorter than Options.LoadThreshold
					// does not count (see BENCHMARKS.md).
					b.Logf("per-call: %d loads; load_duration of the others: %v", n, reuses)
				}
				loads += n
				b.StopTimer()
				e.requireEmpty(b)
				b.StartTimer()
			}
			b.ReportMetric(float64(loads)/float64(b.N), "loads/op")
		})
		b.Run("mode=phase", func(b *testing.B) {
			loads := 0
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
				p, err := e.c.StartPhase(ctx, "prompts", vramguard.PhaseOptions{})
				if err != nil {
					b.Fatal(err)
				}
				n, _, err := runWorkflow(ctx, p.Guard())
				_, eerr := p.End(ctx)
				cancel()
				if err != nil || eerr != nil {
					b.Fatal(err, eerr)
				}
				loads += n
				b.StopTimer()
				e.requireEmpty(b)
				b.StartTimer()
			}
			b.ReportMetric(float64(loads)/float64(b.N), "loads/op")
		})
	})
}
