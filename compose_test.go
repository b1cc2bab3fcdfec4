package vramguard_test

// The composition oracle (issue #35, item 7): random schedules, from a
// printed seed, over pairs of features on the simulator (two phases and
// guards of one client, a budget that makes room, EnsureFree on either of
// two devices, generations beside it, another client's leases and warm
// models, other programs' memory, server faults), checked after every step;
// a third of the seeds play on a pool of two servers (package pool) instead
// of one server of two devices. Each schedule is a sequence of steps of one
// to three actions that run side by side, and since issue #45 up to two
// more of reservations (compose_reserve_test.go: taken, released, extended,
// let expire and consumed, beside a chat program with a budget), drawn from
// a stream of their own.
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
	"github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
)

var (
	flagComposeN    = flag.Int("compose.n", 100, "composition oracle: schedules to play (CI's sweep: 100 from fresh seeds; make compose plays more)")
	flagComposePool = flag.Bool("compose.pool", false, "composition oracle: every schedule on a pool of two servers (by default a third of the seeds)")
	flagComposeSeed = flag.Uint64("compose.seed", 0, "composition oracle: the first schedule's seed (0: from the clock, printed)")
	flagComposeAll  = flag.Bool("compose.all", false, "composition oracle: play every schedule, reporting each one that fails, instead of stopping at the first")
)

// composeModels are the schedule's models and the device each is on.
var composeModels = []struct {
	name   string
	size   uint64
	device int
}{{"a", 2 * gib, 0}, {"b", 3 * gib, 1}, {"c", 4 * gib, 0}, {"d", 2 * gib, 1}}

// composeTotal is each of the two fake devices' size.
const composeTotal uint64 = 8 * gib

// composeOp is one action of a step.
type composeOp struct {
	kind   string // guard, phase-start, phase-gen, phase-end, ensure, reserve, release, hold, unhold, other-warm, fault; rsv-take, rsv-release, rsv-extend, rsv-consume, rsv-done, chat
	model  string
	phase  int
	device int
	bytes  uint64

	// Reservations (compose_reserve_test.go), drawn from their own stream.
	holder    string        // rsv-take: main or other
	ttl       time.Duration // a reservation's TTL (0: two minutes); rsv-extend: the extension
	pid       bool          // the reservation names its recipient's process (consumed as it grows)
	slot      int           // rsv-release, rsv-extend, rsv-consume: which live reservation (modulo their number)
	all       bool          // rsv-consume: the recipient takes all it has left, not half
	reserve   bool          // ensure: with EnsureRequest.Reservation
	need      uint64        // phase-start: PhaseOptions.NeedBytes on device (0: none)
	noReserve bool          // phase-start: PhaseOptions.NoReserve
}

func (o composeOp) String() string {
	if strings.HasPrefix(o.kind, "rsv-") || o.kind == "chat" {
		return composeRsvString(o)
	}
	switch o.kind {
	case "guard", "hold", "unhold", "other-warm", "fault":
		return o.kind + " " + o.model
	case "phase-start", "phase-end":
		return fmt.Sprintf("%s p%d", o.kind, o.phase) + composeRsvString(o)
	case "phase-gen":
		return fmt.Sprintf("phase-gen p%d %s", o.phase, o.model)
	case "ensure", "reserve":
		return fmt.Sprintf("%s dev%d %dMiB", o.kind, o.device, o.bytes>>20) + composeRsvString(o)
	}
	return fmt.Sprintf("%s dev%d", o.kind, o.device)
}

// composeShape is a schedule's world: one server whose memory is two fake
// devices, with a budget on device 0 in half of them, or (a third of the
// seeds) a pool of two servers of one device each (package pool), where
// any model may be placed on either device.
// A chat program (a third client, with a budget and no room-making) loads
// on device chatDev.
type composeShape struct {
	budget, pool bool
	chatDev      int
}

func (sh composeShape) String() string {
	chat := fmt.Sprintf("; a chat program's budget on device %d", sh.chatDev)
	switch {
	case sh.pool:
		return "a pool of two servers" + chat
	case sh.budget:
		return "one server of two devices, a budget on device 0" + chat
	}
	return "one server of two devices" + chat
}

// composeSchedule draws a schedule of 4 to 9 steps from seed.
func composeSchedule(seed uint64) (steps [][]composeOp, shape composeShape) {
	rng := rand.New(rand.NewPCG(seed, 0x636f6d706f7365))
	shape.budget = rng.IntN(2) == 0
	// The pool is drawn from a stream of its own, so that the steps of a
	// seed printed before it came stay as they were.
	if rand.New(rand.NewPCG(seed, 0x706f6f6c)).IntN(3) == 0 || *flagComposePool {
		shape = composeShape{pool: true}
	}
	// So are the reservations (compose_reserve_test.go).
	rr := rand.New(rand.NewPCG(seed, composeRsvStream))
	shape.chatDev = rr.IntN(2)
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
			composeRsvExtras(rr, &o)
			step = append(step, o)
		}
		step = append(step, composeRsvOps(rr)...)
		steps = append(steps, step)
	}
	return steps, shape
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
	// canceled is how many of this client's generations the unload cut
	// while they loaded (UnloadReport.CanceledLoads): each may have
	// caused a load the server made and no generation reported.
	canceled int
}

// composeWorld is one schedule's servers, clients and what they did.
type composeWorld struct {
	sims     []*vramguardtest.Server // the server, or the pool's two (device i is sims[i]'s)
	pool     bool
	c        *vramguard.OllamaClient // the client under test (a pool's own client)
	other    *vramguard.OllamaClient // another client, with leases of its own
	phases   [2]*vramguard.Phase
	starting [2]bool     // a phase-start of that phase is under way
	used     [2][]string // the models each live phase generated with
	held     map[string]*vramguard.Lease
	// reserved is what the other programs hold on each device.
	reserved [2]uint64
	loads    []composeLoad // the loads both clients' hooks were told
	rsv      composeRsvWorld

	mu      sync.Mutex
	unloads []composeUnload
	placed  []composePlace // a pool's placements
}

// composePlace is one placement of the pool under test.
type composePlace struct {
	call   int // the action whose call was placed
	model  string
	device int
	at     time.Time
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
				sent: e.Report.Attempts > 0, failed: e.Err != nil, canceled: e.Report.CanceledLoads})
		},
	}
}

// server is the simulator that holds device dev's memory.
func (w *composeWorld) server(dev int) *vramguardtest.Server {
	if w.pool {
		return w.sims[dev]
	}
	return w.sims[0]
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
	room    *composeRoom // the room it reported free to its caller (rule reserve-room)
	// handover is a phase-end's hand-over device plus one; 0 for none.
	handover int
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
		po := vramguard.PhaseOptions{Timeout: 3 * time.Second}
		var rcp string
		var pid uint32
		if o.need > 0 {
			// A hand-over to a next stage, reserved unless NoReserve.
			po.NeedBytes, po.Device, po.NoReserve = o.need, o.device, o.noReserve
			po.Reserve = vramguard.ReserveOptions{TTL: o.ttl}
			if o.pid && !o.noReserve {
				rcp, pid = w.recipient(o.device)
				po.Reserve.PID = pid
			}
		}
		p, err := w.c.StartPhase(ctx, fmt.Sprintf("p%d", o.phase), po)
		r.err = err
		w.mu.Lock()
		w.starting[o.phase] = false
		if err == nil {
			w.phases[o.phase], w.used[o.phase] = p, nil
			w.rsv.phaseOpts[o.phase] = o
			w.rsv.phaseRcp[o.phase].name, w.rsv.phaseRcp[o.phase].pid = rcp, pid
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
		po, rcp := w.rsv.phaseOpts[o.phase], w.rsv.phaseRcp[o.phase]
		w.mu.Unlock()
		if p == nil {
			r.skipped = true
			break
		}
		r.handover = po.device + 1
		if po.need == 0 {
			r.handover = 0
		}
		var rep *vramguard.PhaseReport
		rep, r.err = p.End(ctx)
		if rep != nil && rep.Handover != nil {
			w.keep(rep.Handover.Reservation, "main", po.device, rcp.name, rcp.pid)
			if r.err == nil {
				r.room = &composeRoom{device: po.device, need: po.need, holder: "main", reserved: rep.Handover.Reservation != nil}
			}
		}
	case "ensure":
		rq := vramguard.EnsureRequest{Device: o.device, Bytes: o.bytes, Timeout: time.Second}
		var rcp string
		var pid uint32
		if o.reserve {
			if o.pid {
				rcp, pid = w.recipient(o.device)
			}
			rq.Reservation = &vramguard.ReserveOptions{For: "ensure", PID: pid, TTL: o.ttl}
		}
		var rep *vramguard.EnsureReport
		rep, r.err = w.c.EnsureFree(ctx, rq)
		if rep != nil {
			w.keep(rep.Reservation, "main", o.device, rcp, pid)
		}
		if r.err == nil {
			r.room = &composeRoom{device: o.device, need: o.bytes, holder: "main", reserved: o.reserve}
		}
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
		if w.pool {
			room = composeTotal - 4*gib // on a pool's device any model may go: the largest still fits
		}
		w.mu.Lock()
		b := min(o.bytes, room-min(room, w.reserved[o.device]))
		w.reserved[o.device] += b
		w.rsv.others[o.device] += b
		w.mu.Unlock()
		if b == 0 {
			r.skipped = true
			break
		}
		owner := fmt.Sprintf("other%d", o.device)
		err := w.server(o.device).Reserve(owner, b)
		w.mu.Lock()
		if err != nil {
			r.skipped = true // no room in the server's ledger: the other program's failure, not the library's
			w.reserved[o.device] -= b
			w.rsv.others[o.device] -= b
		} else {
			w.rsv.allocs = append(w.rsv.allocs, composeAlloc{owner: owner, device: o.device, bytes: b, start: start, end: time.Now()})
		}
		w.mu.Unlock()
	case "release":
		owner := fmt.Sprintf("other%d", o.device)
		w.server(o.device).Release(owner)
		w.mu.Lock()
		// Recipients (reservations' consumers) keep theirs.
		w.reserved[o.device] -= w.rsv.others[o.device]
		w.rsv.others[o.device] = 0
		w.rsv.freed[owner] = time.Now()
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
		// On a pool, the next request for the model on either server.
		for _, s := range w.sims {
			if r.err = s.FailNext(o.model, vramguardtest.Busy()); r.err != nil {
				break
			}
		}
	default:
		w.runRsv(ctx, o, &r)
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
	steps, shape := composeSchedule(seed)
	return playSteps(t, steps, shape)
}

// playSteps plays steps in a new world of shape and returns the
// violations and how many checks it made.
func playSteps(t *testing.T, steps [][]composeOp, shape composeShape) ([]composeViolation, int) {
	var models []vramguardtest.ModelConfig
	on := map[string]int{"other0": 0, "other1": 1}
	for dev := range 2 {
		for k := range composeRecipients {
			on[fmt.Sprintf("rcp%d-%d", dev, k)] = dev
		}
	}
	for _, m := range composeModels {
		models = append(models, vramguardtest.ModelConfig{Name: m.name, Size: m.size, LoadLatency: 40 * time.Millisecond, Chunks: 2})
		on[m.name] = m.device
	}
	dir := leaseDir(t)
	w := &composeWorld{held: map[string]*vramguard.Lease{}, pool: shape.pool}
	w.rsv = composeRsvWorld{chatDev: shape.chatDev, freed: map[string]time.Time{}, runs: map[int]int{},
		admitted: map[int]int{}, placedOn: map[int]map[int][2]int{}}
	opts := vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}, Hooks: vramguard.JoinHooks(w.hooks("main"), w.rsvHooks()),
		UnloadTimeout: 3 * time.Second, CleanupTimeout: 3 * time.Second, VRAMPollInterval: 5 * time.Millisecond,
		Timeouts: vramguard.Timeouts{FirstChunk: 3 * time.Second, Total: 3 * time.Second}, PollInterval: 5 * time.Millisecond}
	if os.Getenv("COMPOSE_LOG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	otherOpts := opts
	otherOpts.Hooks = vramguard.JoinHooks(vramguard.Hooks{OnCallEnd: w.hooks("other").OnCallEnd}, w.rsvHooks())
	// The chat program: a budget on its device, no room-making.
	chatOpts := opts
	chatOpts.Hooks = vramguard.JoinHooks(vramguard.Hooks{OnCallEnd: w.hooks("chat").OnCallEnd}, w.rsvHooks())
	chatOpts.Budget = &vramguard.Budget{Device: shape.chatDev}
	var err error
	if shape.pool {
		// Two servers of one 8 GiB device each, every model on both: the
		// client under test is a pool over them; the other client talks
		// to the second one, whose leases the pool honours.
		po := pool.Options{ProbeInterval: 20 * time.Millisecond, OnPlace: func(ctx context.Context, p pool.Placement) {
			w.mu.Lock()
			defer w.mu.Unlock()
			id, ok := ctx.Value(composeCall{}).(int)
			if !ok {
				id = -1
			}
			w.placed = append(w.placed, composePlace{call: id, model: vramguard.NormalizeModelName(p.Model), device: p.Device, at: time.Now()})
			if w.rsv.placedOn[id] == nil {
				w.rsv.placedOn[id] = map[int][2]int{}
			}
			n := w.rsv.placedOn[id][p.Device]
			n[0]++
			if p.Reason != pool.PlaceWarm {
				n[1]++
			}
			w.rsv.placedOn[id][p.Device] = n
		}}
		for i := range 2 {
			// StrictVRAM: a device holds no more than its size (a load
			// that does not fit evicts idle models, as Ollama's scheduler
			// does, or fails), or room-making would plan with memory no
			// unload frees (seed 1796286505048659010: the other client's
			// three models took 9 GiB of device 1's 8).
			s := newSim(t, vramguardtest.Config{TotalVRAM: composeTotal, StrictVRAM: true}, models...)
			w.sims = append(w.sims, s)
			po.Members = append(po.Members, pool.Member{Name: fmt.Sprintf("gpu%d", i), Host: s.URL().String(), VRAM: composeReader{s.GPU(), i, w}})
		}
		p, err := pool.New(po, opts)
		if err != nil {
			t.Fatal(err)
		}
		w.c = p.OllamaClient
		otherOpts.Host, otherOpts.VRAM = w.sims[1].URL().String(), composeReader{w.sims[1].GPU(), 1, w}
		chatOpts.Host, chatOpts.VRAM = w.sims[shape.chatDev].URL().String(), composeReader{w.sims[shape.chatDev].GPU(), shape.chatDev, w}
		chatOpts.Budget.Device = 0
	} else {
		s := newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib}, models...)
		w.sims = []*vramguardtest.Server{s}
		opts.VRAM = composeReader{&vramguardtest.MultiGPU{Server: s, Totals: []uint64{composeTotal, composeTotal}, On: on}, -1, w}
		if shape.budget {
			opts.Budget = &vramguard.Budget{Device: 0, MakeRoom: true}
		}
		opts.Host = s.URL().String()
		if w.c, err = vramguard.NewClient(opts); err != nil {
			t.Fatal(err)
		}
		otherOpts.Host, otherOpts.VRAM = opts.Host, opts.VRAM
		chatOpts.Host, chatOpts.VRAM = opts.Host, opts.VRAM
	}
	if w.other, err = vramguard.NewClient(otherOpts); err != nil {
		t.Fatal(err)
	}
	if w.rsv.chat, err = vramguard.NewClient(chatOpts); err != nil {
		t.Fatal(err)
	}

	var vs []composeViolation
	checks := 0
	timedOut := 0 // generations that timed out: each may have sent its request and caused a load
	add := func(step int, rule, format string, args ...any) {
		vs = append(vs, composeViolation{rule, fmt.Sprintf("step %d: ", step) + fmt.Sprintf(format, args...)})
	}
	id := 0
	for si, step := range steps {
		w.mu.Lock()
		before, loadsBefore, placedBefore := len(w.unloads), len(w.loads), len(w.placed)
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
		// Where each model is at the step's start: its device, or on a
		// pool the devices whose servers list it.
		where := map[string]map[int]bool{}
		for _, m := range composeModels {
			where[vramguard.NormalizeModelName(m.name)] = map[int]bool{m.device: true}
		}
		if w.pool {
			where = map[string]map[int]bool{}
			for dev, s := range w.sims {
				for _, r := range s.Running() {
					m := vramguard.NormalizeModelName(r.Model)
					if where[m] == nil {
						where[m] = map[int]bool{}
					}
					where[m][dev] = true
				}
			}
		}
		ensureDevs := map[int]bool{}
		stepStart := time.Now()
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
		for i, r := range results {
			if cl := composeClientOf(r.op.kind); cl != "" && !r.skipped {
				w.rsv.calls = append(w.rsv.calls, composeCallRec{id: ids[i], client: cl, model: vramguard.NormalizeModelName(r.op.model),
					start: r.start, end: r.start.Add(r.elapsed)})
			}
			if r.handover > 0 {
				ensureDevs[r.handover-1] = true // the hand-over's room-making
			}
		}
		unloads := slices.Clone(w.unloads[before:])
		stepLoads := slices.Clone(w.loads[loadsBefore:])
		placed := slices.Clone(w.placed[placedBefore:])
		w.mu.Unlock()
		// A pool places a model during the step: it is then on that
		// device too. placedBy is the devices each call was placed on
		// (room-making for a placement is EnsureFree on that device).
		placedBy := map[int]map[int]bool{}
		for _, p := range placed {
			if where[p.model] == nil {
				where[p.model] = map[int]bool{}
			}
			where[p.model][p.device] = true
			if placedBy[p.call] == nil {
				placedBy[p.call] = map[int]bool{}
			}
			placedBy[p.call][p.device] = true
		}
		// The other client loads on the second server.
		for _, o := range step {
			if m := vramguard.NormalizeModelName(o.model); w.pool && (o.kind == "other-warm" || o.kind == "chat") {
				if where[m] == nil {
					where[m] = map[int]bool{}
				}
				if o.kind == "chat" {
					where[m][shape.chatDev] = true // so does the chat program, on its server
				} else {
					where[m][1] = true
				}
			}
		}
		on := func(m string, devs map[int]bool) bool {
			for d := range where[vramguard.NormalizeModelName(m)] {
				if devs[d] {
					return true
				}
			}
			return false
		}
		callStart := map[int]time.Time{}
		opOf := map[int]composeOp{}
		for i, r := range results {
			callStart[ids[i]] = r.start
			opOf[ids[i]] = r.op
		}
		// EnsureFree's unloads cut this client's generations still
		// loading the model they unload (ErrUnloadedWhileLoading, counted
		// in the report's CanceledLoads), as its doc says, one begun while
		// the room is being made included (seed 1796234223918391502).
		cut := map[string]int{}
		for _, u := range unloads {
			if u.cause == vramguard.CauseEnsureFree {
				cut[u.model] += u.canceled
			}
		}
		// A pool's placement that made room, whose room a load the
		// library did not admit (the other client's, the chat program's
		// on another model) took in the same step: nothing keeps that load
		// out, and the placement's wait for the room, bounded like the
		// call (3 s), may end by the call's own timeout rather than by a
		// refusal (seed 1796446303649953027: the other client's c landed
		// in the room the placement of b had made on device 1).
		roomTaken := map[int]bool{}
		for _, u := range unloads {
			// The placement is reported once its room is made: one that
			// waited out the call made it where its victim was.
			asked := placedBy[u.call]
			if asked == nil && w.pool {
				asked = where[u.model]
			}
			if u.cause != vramguard.CauseEnsureFree || asked == nil {
				continue
			}
			roomTaken[u.call] = roomTaken[u.call] || slices.ContainsFunc(stepLoads, func(l composeLoad) bool {
				return on(l.model, asked) && l.end.After(callStart[u.call]) && (l.client == "other" || l.client == "chat")
			})
		}
		refused := map[int]bool{}
		for i, r := range results {
			checks += 3 // bound, error, refusal
			if r.elapsed > composeBound {
				add(si, "wait-over-bound", "%v took %v (bound %v)", r.op, r.elapsed, composeBound)
			}
			if errors.Is(r.err, vramguard.KindTimeout) && composeClientOf(r.op.kind) != "" {
				timedOut++
			}
			if testing.Verbose() && r.err != nil {
				t.Logf("step %d: %v: %v", si, r.op, r.err)
			}
			if errors.Is(r.err, vramguard.ErrUnloadedWhileLoading) && (r.op.kind == "guard" || r.op.kind == "phase-gen") {
				checks++ // the cut is one an unload of this step counted
				if m := vramguard.NormalizeModelName(r.op.model); cut[m] > 0 {
					cut[m]--
				} else {
					add(si, "unexpected-error", "%v: %v, cut by no EnsureFree of this step that counted it", r.op, r.err)
				}
			} else if errors.Is(r.err, vramguard.KindTimeout) && r.op.kind != "ensure" && !*flagComposeOverdrawn && w.overdrawn(ids[i], map[int]bool{0: true, 1: true}, r.start, r.start.Add(r.elapsed)) {
				// A budget's room-making beside an overdrawn reservation
				// waits out the call's timeouts: the open finding of seed
				// 1796423270133015021 (compose_reserve_test.go).
			} else if errors.Is(r.err, vramguard.KindTimeout) && roomTaken[ids[i]] {
				// Its placement's room taken by a load nothing admitted:
				// above.
			} else if !composeAllowed(r.err) {
				add(si, "unexpected-error", "%v: %v", r.op, r.err)
			}
			var re *vramguard.RoomError
			var pe *pool.NoRoomError
			if errors.As(r.err, &pe) {
				refused[ids[i]] = true
			}
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
			// The devices the unload was asked for: an EnsureFree's, or
			// on a pool the device its call was placed on.
			asked := map[int]bool{}
			switch u.cause {
			case vramguard.CauseEnsureFree:
				asked = ensureDevs
				if devs := placedBy[u.call]; devs != nil {
					asked = devs
				} else if w.pool && opOf[u.call].kind != "ensure" {
					// A pool's placement that made room and was never
					// reported (its call's timeout ended it first): the
					// device it chose is not known from outside, so the
					// eviction is not judged (seed 1796448686287330042;
					// before it 1796424548631993112). Reported ones are.
					asked = where[u.model]
				}
				if !on(u.model, asked) {
					add(si, "evicted-on-another-device", "EnsureFree on %v unloaded %s, on device %v", keys(asked), u.model, keys(where[u.model]))
				}
			case vramguard.CauseBudget:
				asked = map[int]bool{0: true}
				if !on(u.model, asked) {
					add(si, "evicted-on-another-device", "the budget of device 0 unloaded %s, on device %v", u.model, keys(where[u.model]))
				}
			case vramguard.CauseGuard, vramguard.CausePhaseEnd:
				asked = where[u.model]
				if p, ok := kept[u.model]; ok {
					ended := slices.ContainsFunc(step, func(o composeOp) bool { return o.kind == "phase-end" && o.phase == p })
					if !ended {
						add(si, "phase-model-unloaded", "%s unloaded by %q while phase p%d keeps it", u.model, u.cause, p)
					}
				}
			default:
				asked = where[u.model]
			}
			// Another program that takes memory on the device in the same
			// step can take the room made: no library can keep it out. So
			// can a load of the other client (another program's) still
			// loading when the room-making began (seed
			// 1796286917260230928, on a pool). Nor does EnsureFree hold a
			// load of this client's that begins while it runs (seed
			// 1796234028231654201; RELIABILITY.md): it waits for the calls
			// begun before it, those still being admitted included
			// (TestEnsureFreeWaitsForOwnLoadsInFlight,
			// TestEnsureFreeWaitsForCallsBeingAdmitted: seed
			// 1796287416702493421), but the oracle cannot tell from outside
			// which of two calls of one step the library saw begin first.
			// So can another holder's reservation, or a reservation's
			// recipient allocating, in the same step; and a load of the
			// chat program, as one of the other client's. A lease the
			// other client takes in the same step on a model of the device
			// keeps a later step of the plan from being carried out (seed
			// 1796442412968310332: EnsureFree planned b, then its own
			// phase's d; the other client's hold on d came between):
			// nothing keeps another holder from leasing.
			taken := slices.ContainsFunc(step, func(o composeOp) bool {
				return o.kind == "reserve" && asked[o.device] || o.kind == "hold" && on(o.model, asked)
			}) ||
				rsvTaken(step, asked, w.pool) ||
				slices.ContainsFunc(stepLoads, func(l composeLoad) bool {
					return on(l.model, asked) && l.end.After(callStart[u.call]) &&
						(l.client == "other" || l.client == "chat" || u.cause == vramguard.CauseEnsureFree)
				})
			// Only room-making evicts for an admission: a guard's cleanup
			// runs under the context of the last of its model's users,
			// which may be a call refused beside one that loaded it.
			makesRoom := u.cause == vramguard.CauseEnsureFree || u.cause == vramguard.CauseBudget
			if refused[u.call] && makesRoom && !taken && !*flagComposeOverdrawn && w.overdrawn(u.call, asked, stepStart, time.Now()) {
				continue // the open finding of seed 1796422898705029008 (compose_reserve_test.go)
			}
			if refused[u.call] && makesRoom && !taken {
				add(si, "evicted-then-refused", "%s unloaded (%s) by an action whose admission then refused it", u.model, u.cause)
			}
		}
		addf := func(rule, format string, args ...any) { add(si, rule, format, args...) }
		checks += w.checkRoom(addf, ids, results)
		checks += w.checkReserved(addf, shape, stepStart)
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
	for _, c := range []*vramguard.OllamaClient{w.c, w.other, w.rsv.chat} {
		if err := c.Close(); err != nil && !composeAllowed(err) {
			add(len(steps), "unexpected-error", "Close: %v", err)
		}
	}
	// A model a request sent with keep-alive 0 leaves as the server
	// expires it (UnloadDelay later), not at once: the check waits for
	// that, within a bound.
	wctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	for dev, s := range w.sims {
		err = s.WaitFor(wctx, func() bool { return len(s.Running()) == 0 })
		if r := s.Running(); err != nil && len(r) > 0 {
			add(len(steps), "left-resident", "2 s after both clients closed, server %d: %v", dev, r)
		}
	}
	cancel()
	// Every load the server made is one a generation reported (none
	// missed), and the reports stand for no more loads than it made.
	w.mu.Lock()
	all := slices.Clone(w.loads)
	// A generation an unload cut while it loaded was told no load, but
	// the server may have made one (it finishes a load whose request
	// went, as v0.6.5 does): the unload's report counted it.
	cutLoads := 0
	for _, u := range w.unloads {
		cutLoads += u.canceled
	}
	w.mu.Unlock()
	n := 0
	for _, s := range w.sims {
		n += s.Loads("")
	}
	// So was one that timed out once its request went (seed
	// 1796423270133015021: admitted at the end of its budget's wait, its
	// load ended with its total timeout).
	if lo, hi := composeLoadCount(all), len(all); n < lo || n > hi+cutLoads+timedOut {
		add(len(steps), "loads-unbalanced", "the server loaded %d times, the clients' hooks were told %d (%d counting calls that ran at once once), %d generations were cut while they loaded and %d timed out: %s", n, hi, lo, cutLoads, timedOut, composeLoadsString(all))
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
		n := 0
		for _, s := range w.sims {
			n += s.Loads(k[1])
		}
		if told > n {
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
	steps, checks, pools, failed := 0, 0, 0, 0
	for i := range n {
		sd := seed + uint64(i)
		sched, shape := composeSchedule(sd)
		if shape.pool {
			pools++
		}
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
			fmt.Fprintf(&b, "  world: %v\n", shape)
			for si, st := range sched {
				fmt.Fprintf(&b, "  step %d: %v\n", si, st)
			}
			for _, v := range vs {
				fmt.Fprintf(&b, "  VIOLATION %s: %s\n", v.rule, v.detail)
			}
			replay := fmt.Sprintf("go test -run 'TestCompose$' -compose.seed %d -compose.n 1 -v", sd)
			if *flagComposePool {
				replay += " -compose.pool"
			}
			if *flagComposeOwn {
				replay += " -compose.own"
			}
			if *flagComposeOverdrawn {
				replay += " -compose.overdrawn"
			}
			if *flagComposeAll {
				failed++
				t.Errorf("compose: seed %d failed (replay: %s)\n%s", sd, replay, b.String())
				continue
			}
			t.Fatalf("compose: seed %d failed (replay: %s)\n%s", sd, replay, b.String())
		}
	}
	t.Logf("compose: %d schedules (%d on a pool), %d steps, %d checks, %d schedules with violations in %v; seeds %d..%d", n, pools, steps, checks, failed, time.Since(start).Round(time.Millisecond), seed, seed+uint64(n)-1)
}
