package vramguard_test

// The composition oracle (issue #35, item 7): random schedules, from a
// printed seed, over pairs of features on the simulator (two phases and
// guards of one client, a budget that makes room, EnsureFree on either of
// two devices, another client's leases and warm models, other programs'
// memory, server faults), checked after every step. Each schedule is a
// sequence of steps of one to three actions that run side by side.
//
//	go test -run TestCompose -compose.n 10000          (the background run)
//	go test -run TestCompose -compose.seed 12345 -v    (a replay)

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

var (
	flagComposeN    = flag.Int("compose.n", 100, "composition oracle: schedules to play (CI's sweep: 100 from fresh seeds; make compose plays more)")
	flagComposeSeed = flag.Uint64("compose.seed", 0, "composition oracle: the first schedule's seed (0: from the clock, printed)")
	flagComposeOpen = flag.Bool("compose.open", false, "composition oracle: also draw the steps of the open finding (RELIABILITY.md): a generation beside EnsureFree")
)

// composeModels are the schedule's models and the device each is on.
var composeModels = []struct {
	name   string
	size   uint64
	device int
}{{"a", 2 * gib, 0}, {"b", 3 * gib, 1}, {"c", 4 * gib, 0}, {"d", 2 * gib, 1}}

// composeTotal is each of the two fake devices' size.
const composeTotal uint64 = 8 * gib

// composeDevice is the device of a model or an owner ("other0", "other1").
func composeDevice(name string) int {
	for _, m := range composeModels {
		if vramguard.NormalizeModelName(m.name) == vramguard.NormalizeModelName(name) {
			return m.device
		}
	}
	if strings.HasSuffix(name, "1") {
		return 1
	}
	return 0
}

// composeOp is one action of a step.
type composeOp struct {
	kind   string // guard, phase-start, phase-gen, phase-end, ensure, reserve, release, hold, unhold, other-warm, fault
	model  string
	phase  int
	device int
	bytes  uint64
}

func (o composeOp) String() string {
	switch o.kind {
	case "guard", "hold", "unhold", "other-warm", "fault":
		return o.kind + " " + o.model
	case "phase-start", "phase-end":
		return fmt.Sprintf("%s p%d", o.kind, o.phase)
	case "phase-gen":
		return fmt.Sprintf("phase-gen p%d %s", o.phase, o.model)
	case "ensure", "reserve":
		return fmt.Sprintf("%s dev%d %dMiB", o.kind, o.device, o.bytes>>20)
	}
	return fmt.Sprintf("%s dev%d", o.kind, o.device)
}

// composeSchedule draws a schedule of 4 to 9 steps from seed.
func composeSchedule(seed uint64) (steps [][]composeOp, budget bool) {
	rng := rand.New(rand.NewPCG(seed, 0x636f6d706f7365))
	budget = rng.IntN(2) == 0
	model := func() string { return composeModels[rng.IntN(len(composeModels))].name }
	for range 4 + rng.IntN(6) {
		var step []composeOp
		for range 1 + rng.IntN(3) {
			var o composeOp
			switch r := rng.IntN(20); {
			case r < 4:
				o = composeOp{kind: "guard", model: model()}
			case r < 6:
				o = composeOp{kind: "phase-start", phase: rng.IntN(2)}
			case r < 9:
				o = composeOp{kind: "phase-gen", phase: rng.IntN(2), model: model()}
			case r < 11:
				o = composeOp{kind: "phase-end", phase: rng.IntN(2)}
			case r < 14:
				o = composeOp{kind: "ensure", device: rng.IntN(2), bytes: uint64(3+rng.IntN(5)) * gib}
			case r < 15:
				o = composeOp{kind: "reserve", device: rng.IntN(2), bytes: uint64(1+rng.IntN(4)) * gib}
			case r < 16:
				o = composeOp{kind: "release", device: rng.IntN(2)}
			case r < 17:
				o = composeOp{kind: "hold", model: model()}
			case r < 18:
				o = composeOp{kind: "unhold", model: model()}
			case r < 19:
				o = composeOp{kind: "other-warm", model: model()}
			default:
				o = composeOp{kind: "fault", model: model()}
			}
			step = append(step, o)
		}
		// The open finding (RELIABILITY.md), drawn only with
		// -compose.open: EnsureFree does not count the loads in flight
		// beside it, which take the room it made, and it is refused after
		// its unloads (seed 1796171770862276545).
		isGen := func(o composeOp) bool { return o.kind == "guard" || o.kind == "phase-gen" || o.kind == "other-warm" }
		if !*flagComposeOpen && slices.ContainsFunc(step, func(o composeOp) bool { return o.kind == "ensure" }) {
			step = slices.DeleteFunc(step, isGen)
		}

		steps = append(steps, step)
	}
	return steps, budget
}

// composeCall tags the context of one action, so that the unloads it
// caused (the hooks get the call's context) are tied to it.
type composeCall struct{}

// composeUnload is one unload the main client's hooks saw.
type composeUnload struct {
	call   int // the action whose context it ran under; -1 for none
	model  string
	cause  vramguard.UnloadCause
	sent   bool // it sent a request (not a model a lease or phase kept)
	failed bool
}

// composeWorld is one schedule's servers, clients and what they did.
type composeWorld struct {
	s        *vramguardtest.Server
	c        *vramguard.OllamaClient // the client under test
	other    *vramguard.OllamaClient // another client, with leases of its own
	phases   [2]*vramguard.Phase
	starting [2]bool     // a phase-start of that phase is under way
	used     [2][]string // the models each live phase generated with
	held     map[string]*vramguard.Lease
	// reserved is what the other programs hold on each device.
	reserved [2]uint64
	loads    []composeLoad // the loads both clients' hooks were told

	mu      sync.Mutex
	unloads []composeUnload
}

func (w *composeWorld) hooks(client string) vramguard.Hooks {
	return vramguard.Hooks{
		OnCallEnd: func(_ context.Context, e vramguard.CallEnd) {
			if e.Generation != nil && e.Generation.Loaded {
				w.mu.Lock()
				w.loads = append(w.loads, composeLoad{client: client, model: vramguard.NormalizeModelName(e.Model),
					start: e.Start, end: e.Start.Add(e.Elapsed), d: e.Generation.Metrics.LoadDuration})
				w.mu.Unlock()
			}
		},
		OnUnloadEnd: func(ctx context.Context, e vramguard.UnloadEnd) {
			id, ok := ctx.Value(composeCall{}).(int)
			if !ok {
				id = -1
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			w.unloads = append(w.unloads, composeUnload{call: id, model: vramguard.NormalizeModelName(e.Model), cause: e.Cause,
				sent: e.Report.Attempts > 0, failed: e.Err != nil})
		},
	}
}

// composeLoad is a generation that reported its load, which client ran
// it, and when the call ran.
type composeLoad struct {
	client     string
	model      string
	start, end time.Time
	d          time.Duration // the load_duration reported
}

// composeLoadCount is the fewest loads the clients' reports can stand
// for: generations of one model that ran at once may all have waited for
// one load, since Ollama reports a load to every request that waited for
// it and Generation.Loaded is true for each (RELIABILITY.md, the open
// finding of seed 1796171620578333446). Calls that overlap, directly or
// through others, count once.
func composeLoadCount(ls []composeLoad) int {
	slices.SortFunc(ls, func(a, b composeLoad) int { return a.start.Compare(b.start) })
	n := 0
	ends := map[string]time.Time{} // model -> the end of its current cluster of overlapping calls
	for _, l := range ls {
		if e, ok := ends[l.model]; ok && l.start.Before(e) {
			if l.end.After(e) {
				ends[l.model] = l.end
			}
			continue
		}
		n++
		ends[l.model] = l.end
	}
	return n
}

// composeTaking marks, in composeWorld.held, a lease an action is taking.
var composeTaking = new(vramguard.Lease)

// composeResult is how one action ended.
type composeResult struct {
	op      composeOp
	err     error
	start   time.Time
	elapsed time.Duration
	skipped bool
}

// composeBound is the longest an action may take: the client's timeouts
// (every wait is bounded by them) plus a margin for a busy machine.
const composeBound = 3*time.Second + 10*time.Second

func (w *composeWorld) run(ctx context.Context, id int, o composeOp) composeResult {
	ctx = context.WithValue(ctx, composeCall{}, id)
	start := time.Now()
	r := composeResult{op: o, start: start}
	req := func(m string) *vramguard.GenerateRequest { return &vramguard.GenerateRequest{Model: m, Prompt: "x"} }
	switch o.kind {
	case "guard":
		g := vramguard.Guard{Client: w.c}
		_, r.err = g.Generate(ctx, req(o.model), nil)
	case "phase-start":
		w.mu.Lock()
		taken := w.starting[o.phase] || w.phases[o.phase] != nil
		w.starting[o.phase] = true
		w.mu.Unlock()
		if taken {
			r.skipped = true
			break
		}
		p, err := w.c.StartPhase(ctx, fmt.Sprintf("p%d", o.phase), vramguard.PhaseOptions{Timeout: 3 * time.Second})
		r.err = err
		w.mu.Lock()
		w.starting[o.phase] = false
		if err == nil {
			w.phases[o.phase], w.used[o.phase] = p, nil
		}
		w.mu.Unlock()
	case "phase-gen":
		w.mu.Lock()
		p := w.phases[o.phase]
		w.mu.Unlock()
		if p == nil {
			r.skipped = true
			break
		}
		g := p.Guard()
		_, r.err = g.Generate(ctx, req(o.model), nil)
		if r.err == nil {
			w.mu.Lock()
			if w.phases[o.phase] == p && !slices.Contains(w.used[o.phase], o.model) {
				w.used[o.phase] = append(w.used[o.phase], o.model)
			}
			w.mu.Unlock()
		}
	case "phase-end":
		w.mu.Lock()
		p := w.phases[o.phase]
		w.phases[o.phase], w.used[o.phase] = nil, nil
		w.mu.Unlock()
		if p == nil {
			r.skipped = true
			break
		}
		_, r.err = p.End(ctx)
	case "ensure":
		_, r.err = w.c.EnsureFree(ctx, vramguard.EnsureRequest{Device: o.device, Bytes: o.bytes, Timeout: time.Second})
	case "reserve":
		// Another program takes no more than the device's models leave
		// it: the fake devices share one server's ledger, and a device
		// whose holders add up past its size (which no GPU shows) would
		// make room-making's arithmetic plan for memory no unload frees.
		room := composeTotal
		for _, m := range composeModels {
			if m.device == o.device {
				room -= m.size
			}
		}
		w.mu.Lock()
		b := min(o.bytes, room-min(room, w.reserved[o.device]))
		w.reserved[o.device] += b
		w.mu.Unlock()
		if b == 0 {
			r.skipped = true
			break
		}
		if err := w.s.Reserve(fmt.Sprintf("other%d", o.device), b); err != nil {
			r.skipped = true // no room in the server's ledger: the other program's failure, not the library's
			w.mu.Lock()
			w.reserved[o.device] -= b
			w.mu.Unlock()
		}
	case "release":
		w.s.Release(fmt.Sprintf("other%d", o.device))
		w.mu.Lock()
		w.reserved[o.device] = 0
		w.mu.Unlock()
	case "hold":
		w.mu.Lock()
		taken := w.held[o.model] != nil
		if !taken {
			w.held[o.model] = composeTaking
		}
		w.mu.Unlock()
		if taken {
			r.skipped = true
			break
		}
		l, err := w.other.HoldModel(ctx, o.model, time.Minute)
		r.err = err
		w.mu.Lock()
		if err == nil {
			w.held[o.model] = l
		} else {
			delete(w.held, o.model)
		}
		w.mu.Unlock()
	case "unhold":
		w.mu.Lock()
		l := w.held[o.model]
		if l != nil && l != composeTaking {
			delete(w.held, o.model)
		} else {
			l = nil // none, or one another action is still taking
		}
		w.mu.Unlock()
		if l == nil {
			r.skipped = true
			break
		}
		r.err = l.Release()
	case "other-warm":
		_, r.err = w.other.GenerateStreaming(ctx, req(o.model), vramguard.KeepAliveFor(time.Minute), nil)
	case "fault":
		r.err = w.s.FailNext(o.model, vramguardtest.Busy())
	}
	r.elapsed = time.Since(start)
	return r
}

// allowed reports whether an action's error is one the schedule may meet:
// no room (typed), a server fault it injected, a lease that keeps a model,
// a phase that ended under a concurrent action.
func composeAllowed(err error) bool {
	var re *vramguard.RoomError
	return err == nil || errors.As(err, &re) || errors.Is(err, vramguard.KindTransient) ||
		errors.Is(err, vramguard.KindOutOfMemory) || errors.Is(err, vramguard.KindRefused) ||
		errors.Is(err, vramguard.ErrPhaseEnded) || errors.Is(err, vramguard.KindUnverified)
}

// composeViolation is one broken guarantee: the rule and what showed it.
type composeViolation struct{ rule, detail string }

// playCompose plays the schedule of seed and returns its violations.
func playCompose(t *testing.T, seed uint64) ([]composeViolation, int) {
	steps, budget := composeSchedule(seed)
	return playSteps(t, steps, budget)
}

// playSteps plays steps in a new world (with a budget on device 0 when
// budget is set) and returns the violations and how many checks it made.
func playSteps(t *testing.T, steps [][]composeOp, budget bool) ([]composeViolation, int) {
	var models []vramguardtest.ModelConfig
	on := map[string]int{"other0": 0, "other1": 1}
	for _, m := range composeModels {
		models = append(models, vramguardtest.ModelConfig{Name: m.name, Size: m.size, LoadLatency: 40 * time.Millisecond, Chunks: 2})
		on[m.name] = m.device
	}
	s := newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib}, models...)
	reader := &vramguardtest.MultiGPU{Server: s, Totals: []uint64{composeTotal, composeTotal}, On: on}
	dir := leaseDir(t)
	w := &composeWorld{s: s, held: map[string]*vramguard.Lease{}}
	opts := vramguard.Options{VRAM: reader, Leases: vramguard.LeaseOptions{Dir: dir}, Hooks: w.hooks("main"),
		UnloadTimeout: 3 * time.Second, CleanupTimeout: 3 * time.Second, VRAMPollInterval: 5 * time.Millisecond,
		Timeouts: vramguard.Timeouts{FirstChunk: 3 * time.Second, Total: 3 * time.Second}}
	if budget {
		opts.Budget = &vramguard.Budget{Device: 0, MakeRoom: true}
	}
	if os.Getenv("COMPOSE_LOG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	var err error
	opts.Host, opts.PollInterval = s.URL().String(), 5*time.Millisecond
	if w.c, err = vramguard.NewClient(opts); err != nil {
		t.Fatal(err)
	}
	otherOpts := opts
	otherOpts.Budget, otherOpts.Hooks = nil, vramguard.Hooks{OnCallEnd: w.hooks("other").OnCallEnd}
	if w.other, err = vramguard.NewClient(otherOpts); err != nil {
		t.Fatal(err)
	}

	var vs []composeViolation
	checks := 0
	add := func(step int, rule, format string, args ...any) {
		vs = append(vs, composeViolation{rule, fmt.Sprintf("step %d: ", step) + fmt.Sprintf(format, args...)})
	}
	id := 0
	for si, step := range steps {
		w.mu.Lock()
		before, loadsBefore := len(w.unloads), len(w.loads)
		// The models each live phase used at the step's start: none of
		// them may be unloaded by a guard's cleanup or another phase's End.
		kept := map[string]int{}
		for p := range w.phases {
			if w.phases[p] != nil {
				for _, m := range w.used[p] {
					kept[vramguard.NormalizeModelName(m)] = p
				}
			}
		}
		w.mu.Unlock()
		ensureDevs := map[int]bool{}
		ids := make([]int, len(step))
		results := make([]composeResult, len(step))
		var wg sync.WaitGroup
		for i, o := range step {
			ids[i] = id
			id++
			if o.kind == "ensure" {
				ensureDevs[o.device] = true
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = w.run(t.Context(), ids[i], o)
			}()
		}
		wg.Wait()
		w.mu.Lock()
		unloads := slices.Clone(w.unloads[before:])
		stepLoads := slices.Clone(w.loads[loadsBefore:])
		w.mu.Unlock()
		callStart := map[int]time.Time{}
		for i, r := range results {
			callStart[ids[i]] = r.start
		}
		refused := map[int]bool{}
		for i, r := range results {
			checks += 3 // bound, error, refusal
			if r.elapsed > composeBound {
				add(si, "wait-over-bound", "%v took %v (bound %v)", r.op, r.elapsed, composeBound)
			}
			if testing.Verbose() && r.err != nil {
				t.Logf("step %d: %v: %v", si, r.op, r.err)
			}
			if !composeAllowed(r.err) {
				add(si, "unexpected-error", "%v: %v", r.op, r.err)
			}
			var re *vramguard.RoomError
			if errors.As(r.err, &re) {
				refused[ids[i]] = true
				if len(re.Holders) == 0 {
					add(si, "refusal-names-no-holder", "%v refused naming no holder: %v", r.op, r.err)
				}
			}
		}
		for _, u := range unloads {
			if !u.sent {
				continue
			}
			checks += 2 // device (or phase's hold), refusal after eviction
			dev := composeDevice(u.model)
			switch u.cause {
			case vramguard.CauseEnsureFree:
				if !ensureDevs[dev] {
					add(si, "evicted-on-another-device", "EnsureFree on %v unloaded %s, on device %d", keys(ensureDevs), u.model, dev)
				}
			case vramguard.CauseBudget:
				if dev != 0 {
					add(si, "evicted-on-another-device", "the budget of device 0 unloaded %s, on device %d", u.model, dev)
				}
			case vramguard.CauseGuard, vramguard.CausePhaseEnd:
				if p, ok := kept[u.model]; ok {
					ended := slices.ContainsFunc(step, func(o composeOp) bool { return o.kind == "phase-end" && o.phase == p })
					if !ended {
						add(si, "phase-model-unloaded", "%s unloaded by %q while phase p%d keeps it", u.model, u.cause, p)
					}
				}
			}
			// Another program that takes memory on the device in the same
			// step can take the room made: no library can keep it out. Nor
			// does EnsureFree hold a load that begins while it runs, this
			// client's included (seed 1796234028231654201; RELIABILITY.md):
			// it waits for the loads in flight when it begins.
			taken := slices.ContainsFunc(step, func(o composeOp) bool { return o.kind == "reserve" && o.device == dev }) ||
				(u.cause == vramguard.CauseEnsureFree && slices.ContainsFunc(stepLoads, func(l composeLoad) bool {
					return composeDevice(l.model) == dev && l.start.After(callStart[u.call])
				}))
			if refused[u.call] && !taken {
				add(si, "evicted-then-refused", "%s unloaded (%s) by an action whose admission then refused it", u.model, u.cause)
			}
		}
	}

	checks += 2 // nothing left, loads balance
	// The end: every phase ended, every lease released, both clients
	// closed; nothing of theirs stays and the loads balance.
	for p := range w.phases {
		if w.phases[p] != nil {
			if _, err := w.phases[p].End(t.Context()); err != nil && !composeAllowed(err) {
				add(len(steps), "unexpected-error", "final End p%d: %v", p, err)
			}
		}
	}
	for _, l := range w.held {
		if err := l.Release(); err != nil {
			add(len(steps), "unexpected-error", "release a lease: %v", err)
		}
	}
	for _, c := range []*vramguard.OllamaClient{w.c, w.other} {
		if err := c.Close(); err != nil && !composeAllowed(err) {
			add(len(steps), "unexpected-error", "Close: %v", err)
		}
	}
	// A model a request sent with keep-alive 0 leaves as the server
	// expires it (UnloadDelay later), not at once: the check waits for
	// that, within a bound.
	wctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	err = s.WaitFor(wctx, func() bool { return len(s.Running()) == 0 })
	cancel()
	if r := s.Running(); err != nil && len(r) > 0 {
		add(len(steps), "left-resident", "2 s after both clients closed: %v", r)
	}
	// Every load the server made is one a generation reported (none
	// missed), and the reports stand for no more loads than it made.
	w.mu.Lock()
	all := slices.Clone(w.loads)
	w.mu.Unlock()
	if n, lo, hi := s.Loads(""), composeLoadCount(all), len(all); n < lo || n > hi {
		add(len(steps), "loads-unbalanced", "the server loaded %d times, the clients' hooks were told %d (%d counting calls that ran at once once): %s", n, hi, lo, composeLoadsString(all))
	}
	// One client is never told of more loads of a model than the server
	// made: calls of one client that waited for one load report it once
	// (seed 1796171620578333446 counted it per waiter).
	checks++
	perClient := map[[2]string]int{}
	for _, l := range all {
		perClient[[2]string{l.client, l.model}]++
	}
	for k, told := range perClient {
		if n := s.Loads(k[1]); told > n {
			add(len(steps), "loads-unbalanced", "client %s was told of %d loads of %s, the server made %d: %s", k[0], told, k[1], n, composeLoadsString(all))
		}
	}
	return vs, checks
}

func composeLoadsString(ls []composeLoad) string {
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%s %s ran %s-%s, load %v; ", l.client, l.model, l.start.Format("05.000"), l.end.Format("05.000"), l.d.Round(time.Millisecond))
	}
	return b.String()
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func keys(m map[int]bool) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestCompose plays -compose.n schedules from -compose.seed (fresh seeds
// each run by default, printed) and fails on the first with a violation,
// naming its seed and schedule.
func TestCompose(t *testing.T) {
	seed := *flagComposeSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	n := *flagComposeN
	start := time.Now()
	steps, checks := 0, 0
	for i := range n {
		sd := seed + uint64(i)
		sched, _ := composeSchedule(sd)
		var vs []composeViolation
		ok := t.Run(fmt.Sprint(sd), func(t *testing.T) {
			var c int
			vs, c = playCompose(t, sd)
			checks += c
			if len(vs) > 0 {
				t.Fail()
			}
		})
		steps += len(sched)
		if !ok || len(vs) > 0 {
			var b strings.Builder
			for si, st := range sched {
				fmt.Fprintf(&b, "  step %d: %v\n", si, st)
			}
			for _, v := range vs {
				fmt.Fprintf(&b, "  VIOLATION %s: %s\n", v.rule, v.detail)
			}
			t.Fatalf("compose: seed %d failed (replay: go test -run 'TestCompose$' -compose.seed %d -compose.n 1 -v)\n%s", sd, sd, b.String())
		}
	}
	t.Logf("compose: %d schedules, %d steps, %d checks, 0 violations in %v; seeds %d..%d", n, steps, checks, time.Since(start).Round(time.Millisecond), seed, seed+uint64(n)-1)
}
