package integration_test

// Issue #28 on real servers: a pool of two or three Ollama servers of one
// version, each with its own port and models folder, each member's device
// the public fake GPU that follows its server's /api/ps
// (vramguardtest.PSGPU; these CPU servers list size_vram 0, so it counts a
// model's size). The models are tiny, so every device is sized at run time
// from the models' estimates and the sizes the first server lists, so that
// each placement is forced; a test whose sizes cannot force its scenario
// fails and says so.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/gguf"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
	vpool "github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
)

const (
	// modelC is a third model, between ModelA and ModelB in size: one
	// more model than two members hold, so that a load must make room.
	modelC = "tiny-c"
	// poolCtx is the num_ctx of every call here. At the default context
	// the estimates (≈43 and ≈45 MB) are mostly the compute graph, a
	// hundred times what a CPU server lists (≈0.1 and ≈0.5 MB), and no
	// device size holds either model but not both; at 64 tokens the
	// estimates are 0.24 and 0.65 MB.
	poolCtx = 64
)

var modelCParams = gguf.Params{Seed: 3, Embedding: 48, FeedForward: 96}

// poolEnv is n servers of one version, with the three models registered,
// and what the models measure on the first of them.
type poolEnv struct {
	ss     []*ollamatest.Server
	est    map[string]uint64 // EstimateModel at poolCtx
	size   map[string]uint64 // what PSGPU counts once /api/ps lists the model (size_vram, else size)
	leases string            // the test's own lease directory
}

// eachVersionPool runs fn per server version on n servers of the test's
// own. Every server starts and must end with nothing listed.
func eachVersionPool(t *testing.T, n int, fn func(t *testing.T, e *poolEnv)) {
	for _, v := range ollamatest.Versions() {
		t.Run("ollama-"+v, func(t *testing.T) {
			e := &poolEnv{leases: filepath.Join(t.TempDir(), "leases")}
			if err := os.Mkdir(e.leases, 0o700); err != nil { // the library refuses a directory others may enter
				t.Fatal(err)
			}
			for range n {
				e.ss = append(e.ss, poolServer(t, v))
			}
			e.measure(t)
			t.Cleanup(func() {
				// t.Context is done in cleanups; the servers stop after this.
				for i, s := range e.ss {
					if ps, err := s.Client().ListRunning(context.Background()); err != nil || len(ps.Models) > 0 {
						t.Errorf("server %d (%s) at the end of the case: /api/ps %v, err %v; want nothing", i, s.URL().Host, ps, err)
					}
				}
			})
			fn(t, e)
		})
	}
}

// poolServer starts a server of version for the test alone (Require's
// servers are the same: a new port and folder per call; it is Start
// here for OLLAMA_NUM_PARALLEL). v0.6.5 on a CPU serves four requests of a
// model at once by default and lists four contexts' memory, 2.3 MB for
// ModelB against an estimate of 0.65 MB at num_ctx 64: too far apart for
// a device that holds either model but not both. With one, as the later
// versions default to, the listing is within 17% of the estimate.
func poolServer(t *testing.T, version string) *ollamatest.Server {
	t.Helper()
	s, err := ollamatest.Start(t.Context(), ollamatest.Options{Version: version, Env: []string{"OLLAMA_NUM_PARALLEL=1"}, Logf: t.Logf})
	if err != nil {
		if ollamatest.InCI() {
			t.Fatalf("ollama %s unavailable (CI=true makes this a failure): %v", version, err)
		}
		t.Skipf("ollama %s unavailable: %v", version, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ollama %s at %s, server log (tail):\n%s", s.Version(), s.URL().Host, s.LogTail(3000))
		}
		if err := s.Stop(); err != nil {
			t.Errorf("stop ollama %s: %v", s.Version(), err)
		}
	})
	if s.External() {
		t.Skipf("a pool needs servers of its own; %s names one", ollamatest.EnvHost)
	}
	if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
		t.Fatalf("register models: %v", err)
	}
	if _, err := gguf.Register(t.Context(), s.Client(), modelC, modelCParams); err != nil {
		t.Fatalf("register %s: %v", modelC, err)
	}
	return s
}

// measure estimates each model and loads it once on the first server to
// read what /api/ps lists for it: the servers are of one version, so the
// others list the same.
func (e *poolEnv) measure(t *testing.T) {
	t.Helper()
	s := e.ss[0]
	c := newClient(t, s, vramguard.Options{})
	e.est, e.size = map[string]uint64{}, map[string]uint64{}
	for _, m := range []string{modelA, modelB, modelC} {
		est, err := c.EstimateModel(t.Context(), m, poolCtx)
		if err != nil {
			t.Fatal(err)
		}
		e.est[m] = uint64(est.Total)
		rawLoad(t, s, m)
		for _, x := range listing(t, s) {
			if vramguard.NormalizeModelName(x.Model) == vramguard.NormalizeModelName(m) {
				e.size[m] = uint64(max(x.SizeVRAM, 0))
				if e.size[m] == 0 {
					e.size[m] = uint64(max(x.Size, 0))
				}
			}
		}
		if e.size[m] == 0 {
			t.Fatalf("%s: /api/ps lists no size after its load", m)
		}
		if rep, err := c.UnloadModel(t.Context(), m); err != nil || !rep.Verified {
			t.Fatalf("unload %s after measuring it: %+v, %v", m, rep, err)
		}
	}
	t.Logf("at num_ctx %d: estimates %v; listed %v", poolCtx, e.est, e.size)
}

// rawLoad loads model on s as another program would: the raw API client,
// the calls' num_ctx, kept for an hour.
func rawLoad(t *testing.T, s *ollamatest.Server, model string) {
	t.Helper()
	if err := s.Client().Generate(t.Context(), &api.GenerateRequest{Model: model, Prompt: "a castle", Options: poolOpts(1),
		KeepAlive: &api.Duration{Duration: time.Hour}}, func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatalf("load %s on %s: %v", model, s.URL().Host, err)
	}
}

func poolOpts(n int) map[string]any {
	return map[string]any{"num_predict": n, "num_ctx": poolCtx, "temperature": 0.7, "seed": 1}
}

func listing(t *testing.T, s *ollamatest.Server) []api.ProcessModelResponse {
	t.Helper()
	resp, err := s.Client().ListRunning(t.Context())
	if err != nil {
		t.Fatalf("/api/ps of %s: %v", s.URL().Host, err)
	}
	return resp.Models
}

// lists reports the models s lists, normalized and sorted.
func lists(t *testing.T, s *ollamatest.Server) []string {
	t.Helper()
	var out []string
	for _, m := range listing(t, s) {
		out = append(out, vramguard.NormalizeModelName(m.Model))
	}
	slices.Sort(out)
	return out
}

func names(models ...string) []string {
	out := []string{}
	for _, m := range models {
		out = append(out, vramguard.NormalizeModelName(m))
	}
	slices.Sort(out)
	return out
}

// possible fails the test when the measured sizes cannot force its
// scenario.
func possible(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf("the models' sizes make this scenario impossible: "+format, args...)
	}
}

// newPoolOn makes a pool of e's servers, member i named gpu<i> with a fake
// GPU of totals[i] bytes.
func newPoolOn(t *testing.T, e *poolEnv, totals []uint64, po vpool.Options, opts vramguard.Options) (*vpool.Pool, []*vramguardtest.PSGPU) {
	t.Helper()
	var ms []vpool.Member
	var gpus []*vramguardtest.PSGPU
	for i, total := range totals {
		s := e.ss[i]
		g := &vramguardtest.PSGPU{Client: s.Client(), Total: total}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(tr.CloseIdleConnections)
		ms = append(ms, vpool.Member{Name: fmt.Sprintf("gpu%d", i), Host: s.URL().String(), VRAM: g, HTTPClient: &http.Client{Transport: tr}})
		gpus = append(gpus, g)
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 25 * time.Millisecond
	}
	opts.Leases.Dir = e.leases
	po.Members, po.ProbeInterval = ms, 100*time.Millisecond
	c, err := vpool.New(po, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c, gpus
}

// placedGen is a generation through a pool and where it went.
type placedGen struct {
	*vramguard.Generation
	Placement vpool.Placement
}

func poolGenerate(t *testing.T, c *vpool.Pool, model string) placedGen {
	t.Helper()
	ctx, placed := vpool.WithPlacements(t.Context())
	g, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: model, Prompt: "a castle at dawn", Options: poolOpts(4)},
		vramguard.KeepAliveFor(time.Hour), nil)
	if err != nil {
		t.Fatalf("generate on %s: %v", model, err)
	}
	ps := placed()
	if len(ps) != 1 {
		t.Fatalf("generate on %s: placements %+v; want one", model, ps)
	}
	pl := ps[0]
	t.Logf("%s: %s on %s (need %d, free %d, evicted %v), loaded %v", model, pl.Reason, pl.Member, pl.Need, pl.Free, pl.Evicted, g.Loaded)
	return placedGen{g, pl}
}

// squeeze makes another program hold what is free on g beyond leave.
func squeeze(t *testing.T, g *vramguardtest.PSGPU, leave uint64) {
	t.Helper()
	snap, err := g.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if free := snap.Devices[0].Free; free > leave {
		if err := g.Reserve(t.Context(), "comfyui", free-leave); err != nil {
			t.Fatal(err)
		}
	}
}

func runners(t *testing.T, s *ollamatest.Server) []int {
	t.Helper()
	pids, err := s.RunnerPIDs()
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// unloadEverything unloads what the pool left (UnloadAll, then the
// protected models by name) and checks that no server lists a model.
func unloadEverything(t *testing.T, c *vpool.Pool, e *poolEnv, protected ...string) {
	t.Helper()
	reps, err := c.UnloadAll(t.Context())
	if err != nil {
		t.Fatalf("UnloadAll: %v", err)
	}
	for _, r := range reps {
		if !r.Verified && !r.Protected {
			t.Errorf("UnloadAll: %s not verified: %+v", r.Model, r)
		}
		// The runner check is tied to the members' servers (Servers on
		// the pool's transport), which run here unless external.
		if r.Verified && r.WasLoaded && !e.ss[0].External() && r.Checked&vramguard.CheckRunnerProcesses == 0 {
			t.Errorf("UnloadAll: %s verified without the runner check: %+v", r.Model, r)
		}
	}
	for _, m := range protected {
		if rep, err := c.UnloadModel(t.Context(), m); err != nil || !rep.Verified {
			t.Errorf("unload of protected %s by name: %+v, %v", m, rep, err)
		}
	}
	for i, s := range e.ss {
		if ms := lists(t, s); len(ms) != 0 {
			t.Errorf("gpu%d still lists %v after the pool's unloads", i, ms)
		}
	}
}

// Three servers: placement picks the member where the model is warm
// (loaded there by another program), then the device with the most room,
// then makes room where it costs least, then refuses, naming per device
// the free bytes, the holders and the models it may not unload (protected
// by the pool's options, leased by another client of the member's
// server). Nothing is left on any server.
func TestPoolPlacementOnRealServers(t *testing.T) {
	eachVersionPool(t, 3, func(t *testing.T, e *poolEnv) {
		eA, eB, eC := e.est[modelA], e.est[modelB], e.est[modelC]
		zA, zC := e.size[modelA], e.size[modelC]
		// gpu1 holds A and gpu2 will hold C; neither then has room for B
		// (half of A's and of C's size short), and another program holds
		// gpu0, so B makes room: on gpu1, where it costs A (less than C).
		t1, t2 := eB+zA/2, eB+zC/2
		t0 := t2
		possible(t, zA < zC, "%s lists %d bytes, %s %d: making room must cost less on the member of %s", modelA, zA, modelC, zC, modelA)
		possible(t, eC <= t2 && t1-zA < t2 && eB/2 < t2, "%s (estimate %d) must fit on gpu2 (%d bytes) and gpu2 have the most room", modelC, eC, t2)
		c, gpus := newPoolOn(t, e, []uint64{t0, t1, t2}, vpool.Options{}, vramguard.Options{Protected: []string{modelB}})
		squeeze(t, gpus[0], eB/2)

		rawLoad(t, e.ss[1], modelA)
		before := runners(t, e.ss[1])
		g := poolGenerate(t, c, modelA)
		if p := g.Placement; p.Member != "gpu1" || p.Reason != vpool.PlaceWarm || p.Free != t1-zA {
			t.Errorf("%s: %+v; want a reuse on gpu1 (%d bytes free), where another program loaded it, though gpu2 has more room", modelA, p, t1-zA)
		}
		// The same runner, not Generation.Loaded (a load_duration
		// threshold a busy machine can cross on a reuse), shows no load.
		if after := runners(t, e.ss[1]); !slices.Equal(before, after) {
			t.Errorf("gpu1's runners %v, before the call %v: the warm model was loaded again", after, before)
		}

		g = poolGenerate(t, c, modelC)
		if p := g.Placement; p.Member != "gpu2" || p.Reason != vpool.PlaceRoom || p.Need != eC || p.Free != t2 || !g.Loaded {
			t.Errorf("%s: %+v, loaded %v; want a load by room on gpu2 (%d free of %d needed)", modelC, p, g.Loaded, t2, eC)
		}

		g = poolGenerate(t, c, modelB)
		if p := g.Placement; p.Member != "gpu1" || p.Reason != vpool.PlaceMadeRoom || !slices.Equal(p.Evicted, names(modelA)) {
			t.Errorf("%s: %+v; want room made on gpu1 by unloading %s (%d bytes, against %s's %d on gpu2)", modelB, p, modelA, zA, modelC, zC)
		}
		for i, want := range [][]string{nil, names(modelB), names(modelC)} {
			if got := lists(t, e.ss[i]); !slices.Equal(got, want) {
				t.Errorf("gpu%d lists %v; want %v", i, got, want)
			}
		}

		// Another client of gpu2's server leases C; B on gpu1 is
		// protected; other programs take what is free beyond half of A.
		holder := newClient(t, e.ss[2], vramguard.Options{Leases: vramguard.LeaseOptions{Dir: e.leases}})
		lease, err := holder.HoldModel(t.Context(), modelC, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gpus {
			squeeze(t, g, eA/2)
		}
		pids := [][]int{runners(t, e.ss[0]), runners(t, e.ss[1]), runners(t, e.ss[2])}
		_, err = c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "x", Options: poolOpts(4)}, vramguard.KeepAliveFor(time.Hour), nil)
		checkRefusal(t, err, eA)
		for i, s := range e.ss {
			if got := runners(t, s); !slices.Equal(got, pids[i]) {
				t.Errorf("gpu%d's runners %v after the refusal, %v before: the refused load reached a server", i, got, pids[i])
			}
		}
		if err := lease.Release(); err != nil {
			t.Fatal(err)
		}
		unloadEverything(t, c, e, modelB)
	})
}

// checkRefusal checks the refusal of a load needing need bytes on the
// three members of TestPoolPlacementOnRealServers at its last step.
func checkRefusal(t *testing.T, err error, need uint64) {
	t.Helper()
	var pe *vpool.NoRoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.As(err, &pe) ||
		!errors.Is(err, vramguard.ErrProtected) || !errors.Is(err, vramguard.ErrLeased) {
		t.Fatalf("the load that fits nowhere: %v (kind %v); want KindOutOfMemory, a *vpool.NoRoomError, ErrProtected and ErrLeased", err, vramguard.KindOf(err))
	}
	t.Logf("refused: %v", err)
	if pe.Need != need || len(pe.Members) != 3 {
		t.Fatalf("NoRoomError need %d, %d members; want %d and 3", pe.Need, len(pe.Members), need)
	}
	held := func(m vpool.Side, name string) bool {
		return slices.ContainsFunc(m.Holders, func(h vramguard.MemoryHolder) bool { return h.Name == name && h.Bytes > 0 })
	}
	kept := func(m vpool.Side) []vramguard.KeptModel {
		if m.Room == nil {
			return nil
		}
		return m.Room.Kept
	}
	for i, m := range pe.Members {
		if m.Member != fmt.Sprintf("gpu%d", i) || m.Err != nil || m.Room == nil || m.Free > need/2 {
			t.Errorf("member %d: %+v; want a room refusal with at most %d bytes free", i, m, need/2)
		}
	}
	if m := pe.Members[0]; len(kept(m)) != 0 || !held(m, "comfyui") {
		t.Errorf("gpu0: kept %+v, holders %+v; want nothing kept (no model there) and comfyui named as the holder", kept(m), m.Holders)
	}
	if m := pe.Members[1]; len(kept(m)) != 1 || !kept(m)[0].Protected || !held(m, names(modelB)[0]) {
		t.Errorf("gpu1: kept %+v, holders %+v; want %s kept as protected and named as a holder", kept(m), m.Holders, modelB)
	}
	if m := pe.Members[2]; len(kept(m)) != 1 || len(kept(m)[0].Leases) != 1 || !held(m, names(modelC)[0]) {
		t.Errorf("gpu2: kept %+v, holders %+v; want %s kept by its lease and named as a holder", kept(m), m.Holders, modelC)
	}
	for _, want := range []string{"comfyui", "protected", "leased by"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
}

// The seed workflow (generator on B, refiner three passes and negative
// prompt on A), three times in one phase, on two members whose devices
// each hold either model but not both: each model is placed once by room
// on a member of its own and stays there (one runner per server for the
// whole phase: one load on each); End leaves both servers empty.
func TestPoolPhaseOnRealServers(t *testing.T) {
	eachVersionPool(t, 2, func(t *testing.T, e *poolEnv) {
		total := eitherNotBoth(t, e)
		var placed []string
		var mu sync.Mutex
		c, _ := newPoolOn(t, e, []uint64{total, total}, vpool.Options{OnPlace: func(_ context.Context, p vpool.Placement) {
			mu.Lock()
			defer mu.Unlock()
			placed = append(placed, fmt.Sprintf("%s@%s:%s", p.Model, p.Member, p.Reason))
		}}, vramguard.Options{})
		p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		g := p.Guard()
		// Loads are counted as the runners each server starts, not by
		// Generation.Loaded: a load_duration threshold took a warm step
		// for a load when a busy machine made it 11 ms.
		seen := []map[int]bool{{}, {}}
		for round := range 3 {
			for i, m := range []string{modelB, modelA, modelA, modelA, modelA} {
				if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: m, Prompt: fmt.Sprintf("round %d step %d: a castle", round, i), Options: poolOpts(8)}, nil); err != nil {
					t.Fatalf("round %d step %d (%s): %v", round, i, m, err)
				}
				for j, s := range e.ss {
					for _, pid := range runners(t, s) {
						seen[j][pid] = true
					}
				}
			}
		}
		if _, err := p.End(t.Context()); err != nil {
			t.Fatalf("Phase.End: %v", err)
		}
		want := []string{modelB + "@gpu0:room", modelA + "@gpu1:room"}
		if len(placed) != 15 || !slices.Equal(placed[:2], want) || slices.ContainsFunc(placed[2:], func(s string) bool { return !strings.HasSuffix(s, ":warm") }) {
			t.Errorf("placements %q; want %q, then all warm", placed, want)
		}
		for j := range e.ss {
			if len(seen[j]) != 1 {
				t.Errorf("gpu%d ran runners %v during the phase; want one (one load), for the whole phase", j, seen[j])
			}
			if ms := lists(t, e.ss[j]); len(ms) != 0 {
				t.Errorf("gpu%d lists %v after Phase.End", j, ms)
			}
		}
	})
}

// eitherNotBoth is a device size that holds either of A and B, by their
// estimates and listed sizes, but not both, in either order.
func eitherNotBoth(t *testing.T, e *poolEnv) uint64 {
	t.Helper()
	eA, eB, zA, zB := e.est[modelA], e.est[modelB], e.size[modelA], e.size[modelB]
	lo := max(eA, eB, zA, zB)
	hi := min(zA+eB, zB+eA) // with one loaded, less than the other's estimate is free
	possible(t, lo < hi, "a device that holds either model needs %d bytes, and one with %d or more holds both (estimates %d, %d; listed %d, %d)", lo, hi, eA, eB, zA, zB)
	return lo + (hi-lo)/2
}

// Two servers: a member killed during a generation fails that generation
// with a kind; the next load goes to the other member; the member,
// restarted without its models, is found by the probe and used again,
// its models learned anew from its listing (the one it had is loaded
// again, by room, not taken for warm).
func TestPoolMemberKilledOnRealServers(t *testing.T) {
	eachVersionPool(t, 2, func(t *testing.T, e *poolEnv) {
		skipIfExternal(t, e.ss[0], "kills and restarts the server")
		unit := max(e.est[modelA], e.est[modelB], e.size[modelA], e.size[modelB])
		c, _ := newPoolOn(t, e, []uint64{16 * unit, 8 * unit}, vpool.Options{}, vramguard.Options{})
		for _, s := range e.ss {
			if s.UsesStandin() {
				setKnobs(t, s, standin.Knobs{EOSAfter: 1 << 30}) // no end of its own: the long generation runs until killed
			}
		}
		first := make(chan struct{})
		var once sync.Once
		errc := make(chan error, 1)
		go func() {
			_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "a castle", Options: poolOpts(1 << 20)},
				vramguard.KeepAliveFor(time.Hour), func(vramguard.Chunk) error { once.Do(func() { close(first) }); return nil })
			errc <- err
		}()
		select {
		case <-first:
		case err := <-errc:
			t.Fatalf("the long generation ended before its first chunk: %v", err)
		}
		if st := c.Members(); st[0].InFlight[names(modelA)[0]] != 1 {
			t.Fatalf("members %+v; want %s in flight on gpu0 (the most room)", st, modelA)
		}
		if err := e.ss[0].Crash(); err != nil {
			t.Fatal(err)
		}
		err := <-errc
		var ve *vramguard.Error
		if err == nil || !errors.As(err, &ve) || !slices.Contains([]vramguard.Kind{vramguard.KindTransient, vramguard.KindModelCrash, vramguard.KindUnavailable}, ve.Kind) {
			t.Fatalf("the generation on the killed member: %v (kind %v); want a transient, crash or unavailable *vramguard.Error", err, vramguard.KindOf(err))
		}
		t.Logf("the generation on the killed member: %v (kind %v)", err, ve.Kind)

		if g := poolGenerate(t, c, modelB); g.Placement.Member != "gpu1" || !g.Loaded {
			t.Errorf("%s with gpu0 killed: %+v, loaded %v; want a load on gpu1", modelB, g.Placement, g.Loaded)
		}
		if st := c.Members(); st[0].Up || !slices.Contains(st[0].Models, names(modelA)[0]) || !st[1].Up {
			t.Errorf("members %+v; want gpu0 down, still counted as holding %s, gpu1 up", st, modelA)
		}
		// UnloadAll with gpu0 down (issue #35: it took its full timeout and
		// sent 99 unloads for gpu0's model): gpu0 costs one failed answer,
		// each model is reported once, and gpu1's is unloaded, verified.
		reps, err := c.UnloadAll(t.Context())
		var me *vpool.MemberError
		if !errors.As(err, &me) || me.Member != "gpu0" || !errors.Is(err, vpool.ErrUnreachable) {
			t.Errorf("UnloadAll with gpu0 down: %v; want a *pool.MemberError naming gpu0", err)
		}
		seen := map[string]vramguard.UnloadReport{}
		for _, r := range reps {
			if _, twice := seen[r.Model]; twice {
				t.Errorf("UnloadAll reported %s twice", r.Model)
			}
			seen[r.Model] = r
		}
		if r, ok := seen[names(modelA)[0]]; !ok || r.Verified || r.Attempts != 0 {
			t.Errorf("UnloadAll: %s (on gpu0, down) reported %+v; want once, unverified, no attempt counted", modelA, r)
		}
		if r, ok := seen[names(modelB)[0]]; !ok || !r.Verified || len(lists(t, e.ss[1])) != 0 {
			t.Errorf("UnloadAll: %s (on gpu1) reported %+v, gpu1 lists %v; want it unloaded, verified", modelB, r, lists(t, e.ss[1]))
		}

		if err := e.ss[0].Restart(t.Context()); err != nil {
			t.Fatal(err)
		}
		for st := c.Members(); !st[0].Up; st = c.Members() { // the next call that needs the members asks gpu0 again
			if _, err := c.Running(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := sleepCtx(t.Context(), 20*time.Millisecond); err != nil {
				t.Fatalf("gpu0 never found again after its restart: %v", err)
			}
		}
		if st := c.Members(); slices.Contains(st[0].Models, names(modelA)[0]) {
			t.Errorf("gpu0 back: %+v; want %s no longer counted (the restarted server lists nothing)", st[0], modelA)
		}
		if g := poolGenerate(t, c, modelA); g.Placement.Member != "gpu0" || g.Placement.Reason != vpool.PlaceRoom || !g.Loaded {
			t.Errorf("%s after gpu0's restart: %+v, loaded %v; want a load by room on gpu0 again", modelA, g.Placement, g.Loaded)
		}
		unloadEverything(t, c, e)
	})
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}
