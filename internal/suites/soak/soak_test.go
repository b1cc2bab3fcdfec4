// Package soak holds vramguard's soak test: thousands of guarded calls
// against the simulator, through the fault proxy, with random faults on
// both and random cancellations, then checks for goroutines, connections
// and models left behind. It runs only with -soak (make soak).
package soak_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/faultproxy"
	"github.com/vramguard/vramguard/vramguardtest"
	"go.uber.org/goleak"
)

var (
	soakOn      = flag.Bool("soak", false, "run the soak test (make soak)")
	soakCalls   = flag.Int("soak.calls", 5000, "guarded operations to run")
	soakWorkers = flag.Int("soak.workers", 8, "concurrent callers")
	soakSeed    = flag.Uint64("soak.seed", 0, "random seed; 0 picks one (logged)")
	soakFaults  = flag.Float64("soak.faults", 0.2, "share of requests the proxy breaks")
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// callBound is the longest any single operation may take: the client's
// timeouts are 300 ms to 2 s, cleanups 5 s.
const callBound = 20 * time.Second

var models = []string{"a", "b", "c"}

// rng is a locked random source shared by the workers and the proxy rule.
type rng struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (r *rng) intn(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.IntN(n)
}

func (r *rng) float() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.Float64()
}

// tally counts outcomes by name; safe for concurrent use.
type tally struct {
	mu sync.Mutex
	m  map[string]int
}

func (t *tally) add(k string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]int{}
	}
	t.m[k]++
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.m))
	for k := range t.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, t.m[k])
	}
	return strings.TrimSpace(b.String())
}

func TestSoak(t *testing.T) {
	if !*soakOn {
		t.Skip("soak test: run it with -soak (make soak)")
	}
	t.Cleanup(func() { goleak.VerifyNone(t) }) // first cleanup: runs last
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -soak.seed=%d)", seed, seed)
	r := &rng{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	goroutinesBefore := runtime.NumGoroutine()

	var cfgs []vramguardtest.ModelConfig
	for i, m := range models {
		cfgs = append(cfgs, vramguardtest.ModelConfig{Name: m, Chunks: 6, LoadLatency: time.Duration(2+3*i) * time.Millisecond,
			TokenLatency: time.Duration(i) * 300 * time.Microsecond})
	}
	s := vramguardtest.New(vramguardtest.Config{Models: cfgs})
	defer s.Close()
	p, err := faultproxy.New(s.URL(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	proxyFaults := &tally{}
	var faultsOn atomic.Bool
	faultsOn.Store(true)
	p.SetRule(func(req *faultproxy.Request) faultproxy.Fault {
		if !faultsOn.Load() || r.float() >= *soakFaults {
			return faultproxy.Pass()
		}
		f := randomProxyFault(r, req)
		proxyFaults.add(f.Kind.String())
		return f
	})

	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	c, err := vramguard.NewClient(vramguard.Options{
		Host:           p.URL().String(),
		HTTPClient:     &http.Client{Transport: tr},
		Timeouts:       vramguard.Timeouts{FirstChunk: 300 * time.Millisecond, Idle: 200 * time.Millisecond, Total: 2 * time.Second},
		UnloadTimeout:  2 * time.Second,
		PollInterval:   2 * time.Millisecond,
		CleanupTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}

	var (
		outcomes  = &tally{}
		ops       = &tally{}
		simFaults = &tally{}
		calls     atomic.Int64
		slowest   atomic.Int64
		untyped   atomic.Int64
		examples  sync.Map // kind -> "op: first error of that kind"
		goAways   atomic.Int64
		tasks     sync.WaitGroup
	)
	record := func(op string, err error, d time.Duration) {
		ops.add(op)
		for {
			old := slowest.Load()
			if int64(d) <= old || slowest.CompareAndSwap(old, int64(d)) {
				break
			}
		}
		if d > callBound {
			t.Errorf("%s took %v", op, d)
		}
		if err == nil {
			outcomes.add("ok")
			return
		}
		var e *vramguard.Error
		if !errors.As(err, &e) {
			untyped.Add(1)
			t.Errorf("%s: untyped error %T: %v", op, err, err)
			return
		}
		k := strings.ReplaceAll(vramguard.KindOf(err).String(), " ", "-")
		outcomes.add(k)
		examples.LoadOrStore(k, op+": "+errSummary(err))
	}

	start := time.Now()
	var wg sync.WaitGroup
	for range *soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := calls.Add(1)
				if n > int64(*soakCalls) {
					return
				}
				if n%500 == 250 {
					// The server goes away for a moment, under everyone.
					goAways.Add(1)
					if err := p.GoAway(); err != nil {
						t.Error(err)
					}
					time.Sleep(5 * time.Millisecond) // the outage
					if err := p.Resume(); err != nil {
						t.Error(err)
					}
				}
				if r.float() < 0.1 {
					m := models[r.intn(len(models))]
					f := randomSimFault(r)
					simFaults.add(f.Kind.String())
					if err := s.FailNext(m, f); err != nil {
						t.Error(err)
					}
				}
				op, d, err := runOp(r, c, &tasks)
				record(op, err, d)
			}
		}()
	}
	wg.Wait()
	tasks.Wait()
	elapsed := time.Since(start)

	// Faults off, then the client's own joins and cleanups: nothing may
	// stay resident, open or running.
	faultsOn.Store(false)
	if err := s.SetFaults("a"); err != nil {
		t.Error(err)
	}
	residentBeforeClose := len(listed(s))
	waitErr := c.Wait()
	closeErr := c.Close()
	tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, func() bool { return len(listed(s)) == 0 }); err != nil {
		t.Errorf("models resident at the end: %v", listed(s))
	}
	residentAtEnd := len(listed(s))
	if err := p.WaitFor(ctx, func(st faultproxy.Stats) bool { return st.Open == 0 && st.Handlers == 0 }); err != nil {
		t.Errorf("proxy connections still open: %+v", p.Stats())
	}
	pst := p.Stats()
	if err := p.Close(); err != nil {
		t.Error(err)
	}
	upstreamAfter := p.Stats().UpstreamOpen
	if upstreamAfter != 0 {
		t.Errorf("%d upstream connections open after the proxy closed", upstreamAfter)
	}
	st := s.Stats("")
	s.Close()
	// goleak (registered first) checks every goroutine when the test ends;
	// the count here is the figure for RELIABILITY.md.
	goroutinesAfter := awaitGoroutines(goroutinesBefore, 10*time.Second)

	t.Logf("FIGURE soak: %d operations by %d workers in %v (%.0f ops/s), seed %d", *soakCalls, *soakWorkers,
		elapsed.Round(time.Millisecond), float64(*soakCalls)/elapsed.Seconds(), seed)
	t.Logf("FIGURE operations: %s", ops)
	t.Logf("FIGURE outcomes: %s; untyped errors %d; slowest operation %v", outcomes, untyped.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
	examples.Range(func(k, v any) bool {
		t.Logf("example %s: %s", k, v)
		return true
	})
	t.Logf("FIGURE proxy: %d requests, faults injected %s, %d go-aways; %d client connections accepted, %d open at the end; %d upstream dialed, %d open after Close",
		pst.Requests, proxyFaults, goAways.Load(), pst.Accepted, pst.Open, pst.Dialed, upstreamAfter)
	t.Logf("FIGURE simulator: faults queued %s; %d requests, %d loads, %d load failures, %d unloads, %d cancels seen, %d crashes, %d completed",
		simFaults, st.Requests, st.Loads, st.LoadFailures, st.Unloads, st.Cancelled, st.Crashes, st.Completed)
	t.Logf("FIGURE end: models resident before Close %d, at the end %d; goroutines before %d, after %d; Wait: %v; Close: %v",
		residentBeforeClose, residentAtEnd, goroutinesBefore, goroutinesAfter, errSummary(waitErr), errSummary(closeErr))
}

// runOp runs one random guarded operation and returns its name, duration
// and error.
func runOp(r *rng, c *vramguard.OllamaClient, tasks *sync.WaitGroup) (string, time.Duration, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if r.float() < 0.1 {
		// A random cancellation, at a random moment.
		d := time.Duration(r.intn(40)) * time.Millisecond
		stop := time.AfterFunc(d, func() { cancel(errors.New("soak: caller canceled")) })
		defer stop.Stop()
	}
	model := models[r.intn(len(models))]
	req := func() *vramguard.GenerateRequest {
		return &vramguard.GenerateRequest{Model: model, Prompt: "a castle at dawn", Options: map[string]any{"seed": r.intn(100)}}
	}
	cancelAt := -1
	if r.float() < 0.05 {
		cancelAt = 1 + r.intn(5)
	}
	onChunk := func(ch vramguard.Chunk) error {
		if ch.Index == cancelAt {
			cancel(errors.New("soak: canceled from the chunk callback"))
		}
		return nil
	}
	start := time.Now()
	var op string
	var err error
	switch x := r.intn(100); {
	case x < 40:
		op = "guard.generate"
		g := vramguard.Guard{Client: c, Async: r.float() < 0.3, Release: r.float() < 0.2}
		_, err = g.Generate(ctx, req(), onChunk)
	case x < 55:
		op = "guard.run"
		g := vramguard.Guard{Client: c}
		err = g.Run(ctx, model, func(ctx context.Context, s *vramguard.Session) error {
			for range 2 {
				if _, err := s.Generate(ctx, req(), onChunk); err != nil {
					return err
				}
			}
			return nil
		})
	case x < 60:
		op = "guard.keep-loaded"
		g := vramguard.Guard{Client: c, KeepLoaded: true}
		_, err = g.Generate(ctx, req(), nil)
	case x < 80:
		op = "phase"
		var ph *vramguard.Phase
		ph, err = c.StartPhase(ctx, "soak", vramguard.PhaseOptions{KeepAlive: vramguard.KeepAliveFor(time.Minute)})
		if err == nil {
			g := ph.Guard()
			for range 1 + r.intn(3) {
				rq := req()
				rq.Model = models[r.intn(len(models))]
				if _, err = g.Generate(ctx, rq, onChunk); err != nil {
					break
				}
			}
			if r.float() < 0.8 {
				_, eerr := ph.End(ctx)
				err = errors.Join(err, eerr)
			} // else the phase ends by itself when ctx is canceled below
		}
	case x < 90:
		op = "cleanup-async"
		task := c.CleanupAsync(ctx, vramguard.CleanupOptions{AllModels: true, Release: true})
		tasks.Add(1)
		go func() {
			defer tasks.Done()
			_, _ = task.Wait()
		}()
	case x < 95:
		op = "cleanup"
		_, err = c.Cleanup(ctx, vramguard.CleanupOptions{Models: []string{model}})
	default:
		op = "unload"
		_, err = c.UnloadModel(ctx, model)
	}
	return op, time.Since(start), err
}

func randomProxyFault(r *rng, req *faultproxy.Request) faultproxy.Fault {
	if req.Path == "/api/ps" {
		if r.intn(2) == 0 {
			return faultproxy.Delay(time.Duration(r.intn(30)) * time.Millisecond)
		}
		return faultproxy.ResetAfterBytes(r.intn(40))
	}
	if req.IsUnload() {
		switch r.intn(3) {
		case 0:
			return faultproxy.ResetAfterBytes(0)
		case 1:
			return faultproxy.Busy()
		default:
			return faultproxy.Delay(time.Duration(r.intn(20)) * time.Millisecond)
		}
	}
	switch r.intn(12) {
	case 0:
		return faultproxy.ResetAfterBytes(r.intn(300))
	case 1:
		return faultproxy.ResetAfterLines(r.intn(6))
	case 2:
		return faultproxy.Stall(time.Second) // past the first-chunk timeout
	case 3:
		return faultproxy.StallAfter(1+r.intn(4), time.Second) // past the idle timeout
	case 4:
		return faultproxy.RunnerTerminated()
	case 5:
		return faultproxy.Busy()
	case 6:
		return faultproxy.Garbage([]byte("\x00\xff<html>oops</html>\n"))
	case 7:
		return faultproxy.DropDone()
	case 8:
		return faultproxy.InjectAfter(r.intn(4), []byte(`{"error":"an error was encountered while running the model: unexpected EOF"}`+"\n"))
	case 9:
		if r.intn(10) == 0 {
			return faultproxy.HugeLine(r.intn(3), 9<<20)
		}
		return faultproxy.InjectAfter(r.intn(4), []byte(`{"error":"CUDA error: out of memory"}`+"\n"))
	case 10:
		return faultproxy.Delay(time.Duration(r.intn(50)) * time.Millisecond)
	default:
		return faultproxy.StallAfter(r.intn(4), time.Duration(r.intn(100))*time.Millisecond) // within the timeouts
	}
}

func randomSimFault(r *rng) vramguardtest.Fault {
	switch r.intn(8) {
	case 0:
		return vramguardtest.CrashAfter(r.intn(6))
	case 1:
		return vramguardtest.LoadCrash()
	case 2:
		return vramguardtest.RunnerStopped()
	case 3:
		return vramguardtest.OOM()
	case 4:
		return vramguardtest.Busy()
	case 5:
		return vramguardtest.CloseAfter(r.intn(6))
	case 6:
		return vramguardtest.RepeatAfter(r.intn(6))
	default:
		return vramguardtest.Stall(time.Duration(r.intn(500)) * time.Millisecond)
	}
}

// listed returns the models the simulator lists in /api/ps.
func listed(s *vramguardtest.Server) []string {
	var out []string
	for _, rs := range s.Running() {
		if !rs.Loading {
			out = append(out, rs.Model)
		}
	}
	return out
}

// awaitGoroutines returns the goroutine count once it is back to want or
// limit has passed (goroutines of closed connections end asynchronously).
func awaitGoroutines(want int, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond) // nothing to await: goroutines end on their own
	}
}

func errSummary(err error) string {
	if err == nil {
		return "nil"
	}
	s := err.Error()
	n := strings.Count(s, "\n") + 1
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return fmt.Sprintf("%d error(s), first: %+q", n, s)
}
