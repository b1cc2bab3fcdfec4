package benchreal_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	vpool "github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
)

// poolCtx is the num_ctx of the pool benchmark's calls. At the default
// context the estimates (≈43 and ≈45 MB, mostly the compute graph) are a
// hundred times what these CPU servers list, and no device size holds
// either model but not both; at 64 tokens they are 0.24 and 0.65 MB.
const poolCtx = 64

// side is one setup of BenchmarkPoolWorkflow: a client and its counters.
type side struct {
	name      string
	c         *vramguard.OllamaClient
	evictions atomic.Int64 // unloads to make room: the budget's (cause budget) or a placement's (the pool's EnsureFree)
}

func (s *side) hooks() vramguard.Hooks {
	return vramguard.Hooks{OnUnloadStart: func(ctx context.Context, u vramguard.UnloadStart) context.Context {
		if u.Cause == vramguard.CauseBudget || u.Cause == vramguard.CauseEnsureFree {
			s.evictions.Add(1)
		}
		return ctx
	}}
}

// BenchmarkPoolWorkflow is issue #28's figure: the original workflow's
// prompt stage (B, then A four times, 8 tokens each, num_ctx 64) in a
// phase, on devices that hold either model but not both (the public fake
// GPU that follows each server's /api/ps, sized from the models' estimates
// and listed sizes), on
//
//   - setup=single: one server and one such device, Budget{MakeRoom: true}:
//     the budget evicts B to load A, and, with more images, A to load B;
//   - setup=pool: a pool of two such servers and devices: B on one, A on
//     the other, each loaded once.
//
// images=N runs the stage N times in one phase (a batch of N images), then
// End. loads/op counts the runner processes the servers started (read
// from /proc after every step, untimed: Generation.Loaded, a load_duration
// threshold, took a warm step for a load when a busy machine made
// load_duration 11 ms), reloads/op the loads beyond the first of each
// model, evictions/op the unloads that made room (cause budget, or the
// pool's EnsureFree)
// (Hooks.OnUnloadStart). Each operation is timed whole, End included;
// every server must list nothing after it (checked untimed).
func BenchmarkPoolWorkflow(b *testing.B) {
	for _, v := range ollamatest.Versions() {
		b.Run("ollama="+v, func(b *testing.B) {
			ss := []*ollamatest.Server{benchServer(b, v), benchServer(b, v)}
			total := eitherNotBoth(b, ss[0])
			one := &side{name: "single"}
			one.c = benchClient(b, vramguard.Options{Host: ss[0].URL().String(), PollInterval: pollInterval, Hooks: one.hooks(),
				VRAM: &vramguardtest.PSGPU{Client: ss[0].Client(), Total: total}, Budget: &vramguard.Budget{MakeRoom: true}})
			pool := &side{name: "pool"}
			pool.c = benchPool(b, ss, total, vramguard.Options{PollInterval: pollInterval, Hooks: pool.hooks()})
			for _, images := range []int{1, 4} {
				for _, sd := range []*side{one, pool} {
					b.Run(fmt.Sprintf("images=%d/setup=%s", images, sd.name), func(b *testing.B) {
						runPoolWorkflow(b, sd, ss, images)
					})
				}
			}
		})
	}
}

func runPoolWorkflow(b *testing.B, sd *side, ss []*ollamatest.Server, images int) {
	loads, reloads := 0, 0
	sd.evictions.Store(0)
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
		p, err := sd.c.StartPhase(ctx, "prompts", vramguard.PhaseOptions{})
		if err != nil {
			b.Fatal(err)
		}
		g := p.Guard()
		seen := map[[2]int]bool{} // (server, runner pid): every load starts a runner
		for img := range images {
			for j, m := range workflow {
				if _, err := g.Generate(ctx, &vramguard.GenerateRequest{
					Model:   m,
					Prompt:  fmt.Sprintf("image %d step %d: a castle at dawn", img, j),
					Options: map[string]any{"num_predict": 8, "num_ctx": poolCtx, "temperature": 0.7, "seed": 1},
				}, nil); err != nil {
					b.Fatalf("image %d step %d (%s): %v", img, j, m, err)
				}
				b.StopTimer()
				for k, s := range ss {
					pids, err := s.RunnerPIDs()
					if err != nil {
						b.Fatal(err)
					}
					for _, pid := range pids {
						seen[[2]int{k, pid}] = true
					}
				}
				b.StartTimer()
			}
		}
		_, err = p.End(ctx)
		cancel()
		if err != nil {
			b.Fatalf("Phase.End: %v", err)
		}
		b.StopTimer()
		for k, s := range ss {
			resp, err := s.Client().ListRunning(b.Context())
			if err != nil || len(resp.Models) > 0 {
				b.Fatalf("server %d after the phase: %v, %v; want nothing listed", k, resp, err)
			}
		}
		loads += len(seen)
		reloads += len(seen) - 2 // loads beyond the first of each of the two models
		b.StartTimer()
	}
	b.ReportMetric(float64(loads)/float64(b.N), "loads/op")
	b.ReportMetric(float64(sd.evictions.Load())/float64(b.N), "evictions/op")
	b.ReportMetric(float64(reloads)/float64(b.N), "reloads/op")
}

// benchServer starts a server of version for the benchmark alone, with
// both models. OLLAMA_NUM_PARALLEL=1: v0.6.5 on a CPU serves four requests
// of a model at once by default and lists four contexts' memory (2.3 MB
// for ModelB at num_ctx 64, against an estimate of 0.65 MB), too far apart
// for a device that holds either model but not both; the later versions
// default to one.
func benchServer(b *testing.B, version string) *ollamatest.Server {
	b.Helper()
	s, err := ollamatest.Start(b.Context(), ollamatest.Options{Version: version, Env: []string{"OLLAMA_NUM_PARALLEL=1"}})
	if err != nil {
		if ollamatest.InCI() {
			b.Fatalf("ollama %s unavailable (CI=true makes this a failure): %v", version, err)
		}
		b.Skipf("ollama %s unavailable: %v", version, err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("ollama %s server log (tail):\n%s", s.Version(), s.LogTail(4000))
		}
		if err := s.Stop(); err != nil {
			b.Errorf("stop ollama %s: %v", s.Version(), err)
		}
	})
	if s.External() {
		b.Skipf("a pool needs servers of its own; %s names one", ollamatest.EnvHost)
	}
	if err := ollamatest.RegisterModels(b.Context(), s); err != nil {
		b.Fatalf("register models: %v", err)
	}
	return s
}

// eitherNotBoth measures both models on s (the estimate at poolCtx, and
// what /api/ps lists once loaded) and returns a device size that holds
// either but not both, in either order.
func eitherNotBoth(b *testing.B, s *ollamatest.Server) uint64 {
	b.Helper()
	c := benchClient(b, vramguard.Options{Host: s.URL().String(), PollInterval: pollInterval})
	est, size := map[string]uint64{}, map[string]uint64{}
	for _, m := range []string{modelA, modelB} {
		e, err := c.EstimateModel(b.Context(), m, poolCtx)
		if err != nil {
			b.Fatal(err)
		}
		est[m] = uint64(e.Total)
		if _, err := c.GenerateStreaming(b.Context(), &vramguard.GenerateRequest{Model: m, Prompt: "x",
			Options: map[string]any{"num_predict": 1, "num_ctx": poolCtx}}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
			b.Fatal(err)
		}
		ps, err := s.Client().ListRunning(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		for _, x := range ps.Models {
			if vramguard.NormalizeModelName(x.Model) == vramguard.NormalizeModelName(m) {
				size[m] = uint64(max(x.SizeVRAM, 0))
				if size[m] == 0 {
					size[m] = uint64(max(x.Size, 0))
				}
			}
		}
		if rep, err := c.UnloadModel(b.Context(), m); err != nil || !rep.Verified || size[m] == 0 {
			b.Fatalf("%s: listed size %d; unload %+v, %v", m, size[m], rep, err)
		}
	}
	eA, eB, zA, zB := est[modelA], est[modelB], size[modelA], size[modelB]
	lo, hi := max(eA, eB, zA, zB), min(zA+eB, zB+eA)
	if lo >= hi {
		b.Fatalf("no device holds either model but not both: either needs %d bytes, %d or more hold both (estimates %d, %d; listed %d, %d)", lo, hi, eA, eB, zA, zB)
	}
	total := lo + (hi-lo)/2
	b.Logf("ollama %s at num_ctx %d: estimates %d, %d; listed %d, %d; each device %d bytes", s.Version(), poolCtx, eA, eB, zA, zB, total)
	return total
}

// benchClient is a vramguard client closed at the end of the benchmark,
// on its own transport.
func benchClient(b *testing.B, opts vramguard.Options) *vramguard.OllamaClient {
	b.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	b.Cleanup(tr.CloseIdleConnections)
	opts.HTTPClient = &http.Client{Transport: tr}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := c.Close(); err != nil {
			b.Errorf("Close: %v", err)
		}
	})
	return c
}

// benchPool is a pool of ss, member i named gpu<i> with a fake GPU of
// total bytes, closed at the end of the benchmark.
func benchPool(b *testing.B, ss []*ollamatest.Server, total uint64, opts vramguard.Options) *vramguard.OllamaClient {
	b.Helper()
	var ms []vpool.Member
	for i, s := range ss {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		b.Cleanup(tr.CloseIdleConnections)
		ms = append(ms, vpool.Member{Name: fmt.Sprintf("gpu%d", i), Host: s.URL().String(),
			VRAM: &vramguardtest.PSGPU{Client: s.Client(), Total: total}, HTTPClient: &http.Client{Transport: tr}})
	}
	p, err := vpool.New(vpool.Options{Members: ms}, opts)
	if err != nil {
		b.Fatal(err)
	}
	c := p.OllamaClient
	b.Cleanup(func() {
		if err := c.Close(); err != nil {
			b.Errorf("Close: %v", err)
		}
	})
	return c
}
