package vramguard_test

// The composition oracle's reservations (issue #45): free memory of a
// device kept for a recipient (OllamaClient.Reserve, a phase's hand-over,
// EnsureFree with EnsureRequest.Reservation), taken by the client under
// test and by the other client, released, extended, let expire (short
// TTLs) and consumed (the recipient, another program's process of the
// simulator, allocating with ReserveOptions.PID), beside a chat program:
// a third client with a budget on one device. These actions and options
// are drawn from a stream of their own, so that the actions of a seed
// printed before they came stay as they were (a step gains actions; a
// phase-start or an ensure may gain options).
//
// Two rules (composeWorld.checkRoom, composeWorld.checkReserved):
//
//   - reserve-room: a room that EnsureFree, a phase's hand-over or
//     Reserve reported was free to its caller outside other holders'
//     reservations at one of the call's own readings of the device.
//   - reserved-room-taken: no load a client admitted (a budget's check, a
//     pool's placement by room) after another holder's reservation was
//     taken lands in the bytes that reservation still has left.
//
// Findings of the library (RELIABILITY.md §9): a reservation that
// another program overdrew made room-making plan with bytes no
// unload frees (-compose.overdrawn=false excuses it again); and a client's
// new reservation may take the bytes of its own standing ones, by design
// for now (rule reservations-share-bytes, only with -compose.own).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

var flagComposeOwn = flag.Bool("compose.own", false, "composition oracle: the rule reservations-share-bytes (off: a client's reservations are its own calls' to use, a new reservation included; see RELIABILITY.md §9)")

var flagComposeOverdrawn = flag.Bool("compose.overdrawn", true, "composition oracle: no excuse for room-making beside a reservation overdrawn by another program (fixed in the library: DeviceMemory.Overdrawn; -compose.overdrawn=false restores the excuse)")

// composeRsvStream seeds the reservations' own stream ("reserve").
const composeRsvStream = 0x72657365727665

// composeRecipients is how many recipient processes a device may have in
// a schedule (their names are placed on the fake devices up front).
const composeRecipients = 48

// composeTTL draws a reservation's TTL: the default (two minutes), or one
// short enough to end within the schedule.
func composeTTL(rr *rand.Rand) time.Duration {
	return []time.Duration{0, 300 * time.Millisecond, time.Second, 3 * time.Second}[rr.IntN(4)]
}

// composeRsvExtras draws what reservations add to an action of the first
// stream: a phase's hand-over (PhaseOptions.NeedBytes, reserved unless
// NoReserve) and an EnsureFree's reservation.
func composeRsvExtras(rr *rand.Rand, o *composeOp) {
	switch o.kind {
	case "phase-start":
		if rr.IntN(2) == 0 {
			o.need, o.device = uint64(2+rr.IntN(4))*gib, rr.IntN(2)
			o.noReserve = rr.IntN(4) == 0
			o.ttl, o.pid = composeTTL(rr), rr.IntN(2) == 0
		}
	case "ensure":
		if rr.IntN(3) == 0 {
			o.reserve = true
			o.ttl, o.pid = composeTTL(rr), rr.IntN(2) == 0
		}
	}
}

// composeRsvOps draws the reservation actions a step gains: none, one or
// two.
func composeRsvOps(rr *rand.Rand) []composeOp {
	var ops []composeOp
	n := 0
	switch r := rr.IntN(20); {
	case r >= 15:
		n = 2
	case r >= 6:
		n = 1
	}
	for range n {
		var o composeOp
		switch r := rr.IntN(20); {
		case r < 6:
			o = composeOp{kind: "rsv-take", holder: []string{"main", "other"}[rr.IntN(2)], device: rr.IntN(2),
				bytes: uint64(1+rr.IntN(4)) * gib, ttl: composeTTL(rr), pid: rr.IntN(2) == 0}
		case r < 9:
			o = composeOp{kind: "rsv-release", slot: rr.IntN(8)}
		case r < 11:
			o = composeOp{kind: "rsv-extend", slot: rr.IntN(8), ttl: []time.Duration{time.Second, 3 * time.Second}[rr.IntN(2)]}
		case r < 14:
			o = composeOp{kind: "rsv-consume", slot: rr.IntN(8), all: rr.IntN(2) == 0}
		case r < 16:
			o = composeOp{kind: "rsv-done", device: rr.IntN(2)}
		default:
			o = composeOp{kind: "chat", model: composeModels[rr.IntN(len(composeModels))].name}
		}
		ops = append(ops, o)
	}
	return ops
}

// composeRsvString is the text of a reservation action, or of the options
// reservations added to another; "" for none.
func composeRsvString(o composeOp) string {
	ttl := func() string {
		if o.ttl == 0 {
			return "ttl 2m"
		}
		return "ttl " + o.ttl.String()
	}
	pid := func() string {
		if o.pid {
			return " pid"
		}
		return ""
	}
	switch o.kind {
	case "rsv-take":
		return fmt.Sprintf("rsv-take %s dev%d %dMiB %s%s", o.holder, o.device, o.bytes>>20, ttl(), pid())
	case "rsv-release":
		return fmt.Sprintf("rsv-release #%d", o.slot)
	case "rsv-extend":
		return fmt.Sprintf("rsv-extend #%d %v", o.slot, o.ttl)
	case "rsv-consume":
		if o.all {
			return fmt.Sprintf("rsv-consume #%d all", o.slot)
		}
		return fmt.Sprintf("rsv-consume #%d half", o.slot)
	case "rsv-done":
		return fmt.Sprintf("rsv-done dev%d", o.device)
	case "chat":
		return "chat " + o.model
	case "phase-start":
		switch {
		case o.need == 0:
			return ""
		case o.noReserve:
			return fmt.Sprintf(" need %dMiB dev%d noreserve", o.need>>20, o.device)
		}
		return fmt.Sprintf(" need %dMiB dev%d reserve %s%s", o.need>>20, o.device, ttl(), pid())
	case "ensure":
		if o.reserve {
			return fmt.Sprintf(" reserve %s%s", ttl(), pid())
		}
	}
	return ""
}

// composeRsv is a reservation the schedule's clients took, as the oracle
// knows it.
type composeRsv struct {
	n      int    // in the order taken
	holder string // main, other
	device int    // the oracle's device (on a pool, the member's)
	bytes  uint64
	lease  *vramguard.Lease
	rcp    string // the recipient's owner name on the device's server; "" when it names none
	pid    uint32
	// t0 is when it stands from: the call that took it returned, or an
	// extension that may have come after its end did.
	t0, until time.Time
	relAt     time.Time // when a release (or an end the oracle learnt of) began; zero while none
	extending bool      // an extension is under way
	consumed  uint64    // what its recipient allocated
	rcpFreed  bool      // the recipient's memory was freed (the reservation had ended)
}

// standsThrough reports whether r certainly stood from from to to.
func (r *composeRsv) standsThrough(from, to time.Time) bool {
	return !r.t0.After(from) && (r.relAt.IsZero() || r.relAt.After(to)) && r.until.After(to)
}

// left is what r has left when its recipient holds held: its bytes less
// what the recipient allocated (ForBase is 0: the recipient held nothing
// when it was taken).
func (r *composeRsv) left(held uint64) uint64 {
	if r.pid == 0 {
		return r.bytes
	}
	return r.bytes - min(r.bytes, held)
}

// composeAlloc is one allocation of another program's memory (Server.Reserve).
type composeAlloc struct {
	owner      string
	device     int
	bytes      uint64
	start, end time.Time
}

// composeReading is one reading of a device by a reader under an action's
// context, as the device showed it (before any client took reservations
// out).
type composeReading struct {
	call   int
	device int
	free   uint64
	procs  map[uint32]uint64
}

// composeCallRec is a generation of an action, for the attribution of loads.
type composeCallRec struct {
	id         int
	client     string
	model      string
	start, end time.Time
}

// composeRoom is the room a successful action reported free to its
// caller: its device, its bytes and the holder whose reservations were
// its own.
type composeRoom struct {
	device   int
	need     uint64
	holder   string
	reserved bool // the action took a reservation of the room
}

// composeRsvWorld is the reservations' side of a composeWorld, under its mu.
type composeRsvWorld struct {
	chat    *vramguard.OllamaClient
	chatDev int
	rsvs    []*composeRsv
	rcps    [2]int // recipients named per device
	// phaseRcp is the recipient named by each live phase's hand-over.
	phaseRcp [2]struct {
		name string
		pid  uint32
	}
	phaseOpts [2]composeOp   // the phase-start of each live phase
	allocs    []composeAlloc // other programs' allocations, recipients' included
	freed     map[string]time.Time
	others    [2]uint64 // what "other<dev>" holds of the device's share for other programs
	reads     []composeReading
	calls     []composeCallRec
	runs      map[int]int            // generations begun, per action
	admitted  map[int]int            // loads a budget admitted after a check, per action
	placedOn  map[int]map[int][2]int // a pool's placements per action and device: all, by room
}

// composeReader records every reading made under an action's context.
type composeReader struct {
	inner vramguard.VRAMReader
	dev   int // the oracle's device of the reader's device 0 (a pool's member); -1: device i is i
	w     *composeWorld
}

func (r composeReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	snap, err := r.inner.Snapshot(ctx)
	id, ok := ctx.Value(composeCall{}).(int)
	if err != nil || snap == nil || !ok {
		return snap, err
	}
	var rs []composeReading
	for i, d := range snap.Devices {
		dev := i
		if r.dev >= 0 {
			dev = r.dev
		}
		procs := map[uint32]uint64{}
		for _, p := range d.Processes {
			procs[p.PID] += p.UsedBytes
		}
		rs = append(rs, composeReading{call: id, device: dev, free: d.Free, procs: procs})
	}
	r.w.mu.Lock()
	r.w.rsv.reads = append(r.w.rsv.reads, rs...)
	r.w.mu.Unlock()
	return snap, err
}

var _ vramguard.VRAMReader = composeReader{}

// rsvHooks counts, per action, the generations begun and the loads a
// budget admitted after a check.
func (w *composeWorld) rsvHooks() vramguard.Hooks {
	id := func(ctx context.Context) int {
		if id, ok := ctx.Value(composeCall{}).(int); ok {
			return id
		}
		return -1
	}
	return vramguard.Hooks{
		OnCallStart: func(ctx context.Context, _ vramguard.CallStart) context.Context {
			w.mu.Lock()
			w.rsv.runs[id(ctx)]++
			w.mu.Unlock()
			return ctx
		},
		OnAdmission: func(ctx context.Context, e vramguard.AdmissionEvent) {
			if e.Err == nil {
				w.mu.Lock()
				w.rsv.admitted[id(ctx)]++
				w.mu.Unlock()
			}
		},
	}
}

// composeClientOf is the client whose generation an action is; "" for an
// action that generates nothing.
func composeClientOf(kind string) string {
	switch kind {
	case "guard", "phase-gen":
		return "main"
	case "other-warm":
		return "other"
	case "chat":
		return "chat"
	}
	return ""
}

// recipient names a new recipient process on dev (holding nothing yet),
// or returns "" when the schedule named them all.
func (w *composeWorld) recipient(dev int) (string, uint32) {
	w.mu.Lock()
	k := w.rsv.rcps[dev]
	w.rsv.rcps[dev]++
	w.mu.Unlock()
	if k >= composeRecipients {
		return "", 0
	}
	name := fmt.Sprintf("rcp%d-%d", dev, k)
	s := w.server(dev)
	if err := s.Reserve(name, 0); err != nil {
		return "", 0
	}
	for _, h := range s.Holders() {
		if h.Name == name {
			return name, h.PID
		}
	}
	return "", 0
}

// keep records a reservation taken by holder on dev, standing from now.
func (w *composeWorld) keep(l *vramguard.Lease, holder string, dev int, rcp string, pid uint32) {
	if l == nil {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	r := &composeRsv{n: len(w.rsv.rsvs), holder: holder, device: dev, bytes: l.Info().Bytes, lease: l, t0: now, until: l.Info().Until.Round(0)}
	if pid != 0 {
		r.rcp, r.pid = rcp, pid
	}
	w.rsv.rsvs = append(w.rsv.rsvs, r)
}

// pick is the live reservation slot names (modulo their number), nil when
// none is live; ok filters.
func (w *composeWorld) pick(slot int, ok func(*composeRsv) bool) *composeRsv {
	var live []*composeRsv
	for _, r := range w.rsv.rsvs {
		if r.relAt.IsZero() && ok(r) {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[slot%len(live)]
}

// shareRoom is what other programs may hold on dev (see the reserve action).
func (w *composeWorld) shareRoom(dev int) uint64 {
	if w.pool {
		return composeTotal - 4*gib
	}
	room := composeTotal
	for _, m := range composeModels {
		if m.device == dev {
			room -= m.size
		}
	}
	return room
}

// runRsv plays a reservation action.
func (w *composeWorld) runRsv(ctx context.Context, o composeOp, r *composeResult) {
	switch o.kind {
	case "rsv-take":
		c, dev := w.c, o.device
		if o.holder == "other" {
			c = w.other
			if w.pool {
				o.device, dev = 1, 0 // the other client's server is the second member
			}
		}
		var rcp string
		var pid uint32
		if o.pid {
			rcp, pid = w.recipient(o.device)
		}
		l, err := c.Reserve(ctx, dev, o.bytes, vramguard.ReserveOptions{For: "render " + o.holder, PID: pid, TTL: o.ttl})
		r.err = err
		if err == nil {
			w.keep(l, o.holder, o.device, rcp, pid)
			r.room = &composeRoom{device: o.device, need: o.bytes, holder: o.holder, reserved: true}
		}
	case "rsv-release":
		w.mu.Lock()
		rv := w.pick(o.slot, func(*composeRsv) bool { return true })
		if rv != nil {
			rv.relAt = time.Now()
		}
		w.mu.Unlock()
		if rv == nil {
			r.skipped = true
			break
		}
		r.err = rv.lease.Release()
	case "rsv-extend":
		now := time.Now()
		w.mu.Lock()
		rv := w.pick(o.slot, func(rv *composeRsv) bool { return !rv.extending && rv.until.After(now.Add(100*time.Millisecond)) })
		var old time.Time
		if rv != nil {
			rv.extending, old = true, rv.until
		}
		w.mu.Unlock()
		if rv == nil {
			r.skipped = true
			break
		}
		err := rv.lease.Extend(o.ttl)
		end := time.Now()
		w.mu.Lock()
		rv.extending = false
		switch {
		case err == nil:
			if !end.Before(old) {
				rv.t0 = end // written after its old end: readings between may have seen it ended
			}
			rv.until = rv.lease.Info().Until.Round(0) // the wall clock's, as the lease directory judges it
		case errors.Is(err, vramguard.ErrClosed):
			// Ended meanwhile: its TTL, or its holder saw it consumed.
			if rv.relAt.IsZero() {
				rv.relAt = now
			}
			err = nil
		}
		w.mu.Unlock()
		r.err = err
	case "rsv-consume":
		now := time.Now()
		w.mu.Lock()
		rv := w.pick(o.slot, func(rv *composeRsv) bool { return rv.pid != 0 && rv.until.After(now) && rv.consumed < rv.bytes })
		var b uint64
		if rv != nil {
			b = rv.bytes - rv.consumed
			if !o.all {
				b = min(b, (rv.bytes+1)/2)
			}
			room := w.shareRoom(rv.device)
			b = min(b, room-min(room, w.reserved[rv.device]))
			w.reserved[rv.device] += b
			rv.consumed += b
		}
		w.mu.Unlock()
		if b == 0 {
			r.skipped = true
			break
		}
		err := w.server(rv.device).Reserve(rv.rcp, b)
		end := time.Now()
		w.mu.Lock()
		if err != nil {
			r.skipped = true // no room in the server's ledger
			w.reserved[rv.device] -= b
			rv.consumed -= b
		} else {
			w.rsv.allocs = append(w.rsv.allocs, composeAlloc{owner: rv.rcp, device: rv.device, bytes: b, start: now, end: end})
		}
		w.mu.Unlock()
	case "rsv-done":
		// The renders whose reservations ended free their memory.
		now := time.Now()
		w.mu.Lock()
		var done []*composeRsv
		for _, rv := range w.rsv.rsvs {
			ended := !rv.relAt.IsZero() || (!rv.extending && rv.until.Before(now))
			if rv.device == o.device && rv.pid != 0 && rv.consumed > 0 && !rv.rcpFreed && ended {
				rv.rcpFreed = true
				done = append(done, rv)
			}
		}
		w.mu.Unlock()
		if len(done) == 0 {
			r.skipped = true
			break
		}
		for _, rv := range done {
			w.server(rv.device).Release(rv.rcp)
			w.mu.Lock()
			w.reserved[rv.device] -= rv.consumed
			w.rsv.freed[rv.rcp] = time.Now()
			w.mu.Unlock()
		}
	case "chat":
		_, r.err = w.rsv.chat.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: o.model, Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
	}
}

// checkRoom is the rule reserve-room for the actions of a step: a room
// EnsureFree, a hand-over or Reserve reported was free, at one of the
// call's own readings of its device, outside the reservations of other
// holders that stood throughout the call.
func (w *composeWorld) checkRoom(add func(rule, format string, args ...any), ids []int, results []composeResult) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	checks := 0
	for i, r := range results {
		if r.room == nil || r.err != nil || r.skipped {
			continue
		}
		checks++
		end := r.start.Add(r.elapsed)
		var others, own []*composeRsv
		for _, rv := range w.rsv.rsvs {
			switch {
			case rv.device != r.room.device || !rv.standsThrough(r.start, end):
			case rv.holder != r.room.holder:
				others = append(others, rv)
			case *flagComposeOwn && r.room.reserved:
				// With -compose.own, a room reserved is also checked against
				// the holder's own reservations: Reserve says two
				// reservations never share bytes.
				own = append(own, rv)
			}
		}
		// The most a reading of the call showed free outside rs.
		best := func(rs []*composeRsv) (int64, int) {
			b, read := int64(-1<<62), 0
			for _, rd := range w.rsv.reads {
				if rd.call != ids[i] || rd.device != r.room.device {
					continue
				}
				read++
				avail := int64(rd.free)
				for _, rv := range rs {
					avail -= int64(rv.left(rd.procs[rv.pid]))
				}
				b = max(b, avail)
			}
			return b, read
		}
		if b, read := best(others); read == 0 || b < int64(r.room.need) {
			add("reserve-room", "%v (%s) reported %d MiB free on device %d, but at its %d readings at most %d MiB were free outside the reservations of others that stood throughout: %s",
				r.op, r.room.holder, r.room.need>>20, r.room.device, read, b>>20, composeRsvsString(others))
		} else if b, read := best(append(others, own...)); len(own) > 0 && b < int64(r.room.need) {
			add("reservations-share-bytes", "%v (%s) reserved %d MiB on device %d, but at its %d readings at most %d MiB were free outside the reservations that stood throughout, its holder's own included: %s",
				r.op, r.room.holder, r.room.need>>20, r.room.device, read, b>>20, composeRsvsString(append(others, own...)))
		}
	}
	return checks
}

func composeRsvsString(rs []*composeRsv) string {
	var b []string
	for _, r := range rs {
		b = append(b, fmt.Sprintf("#%d %s %dMiB (consumed %dMiB) from %s until %s", r.n, r.holder, r.bytes>>20, r.consumed>>20,
			r.t0.Format("04:05.000"), r.until.Format("04:05.000")))
	}
	return fmt.Sprint(b)
}

// composeRunner is one runner of a device, as the server's events date
// it: its load ended at tl (its memory was held from before), its model's
// previous runner went at tlo (zero: none did), and it went at end (zero:
// it has not). Runners still loading are left out: what they hold is
// excused.
type composeRunner struct {
	model        string
	bytes        uint64
	tlo, tl, end time.Time
}

// heldAt reports whether the runner certainly held its memory at at.
func (cr composeRunner) heldAt(at time.Time) bool {
	return !cr.tl.After(at) && (cr.end.IsZero() || cr.end.After(at))
}

// runners lists the runners of dev the server's events show, loaded ones.
func (w *composeWorld) runners(dev int) []composeRunner {
	size, on := map[string]uint64{}, map[string]int{}
	for _, m := range composeModels {
		size[vramguard.NormalizeModelName(m.name)] = m.size
		on[vramguard.NormalizeModelName(m.name)] = m.device
	}
	var out []composeRunner
	cur := map[string]int{}        // model -> its runner's index in out, while it is there
	gone := map[string]time.Time{} // model -> when its last runner went
	for _, ev := range w.server(dev).Events("") {
		m := vramguard.NormalizeModelName(ev.Model)
		if !w.pool && on[m] != dev {
			continue
		}
		switch ev.Kind {
		case vramguardtest.EventLoaded:
			if i, ok := cur[m]; ok && out[i].end.IsZero() {
				out[i].end = ev.At // not seen to go: it went before this load at the latest
			}
			cur[m] = len(out)
			out = append(out, composeRunner{model: m, bytes: size[m], tlo: gone[m], tl: ev.At})
		case vramguardtest.EventUnloaded, vramguardtest.EventLoadFailed, vramguardtest.EventCrashed, vramguardtest.EventEvicted:
			if i, ok := cur[m]; ok && out[i].end.IsZero() {
				out[i].end = ev.At
			}
			delete(cur, m)
			gone[m] = ev.At
		}
	}
	return out
}

// admittedBy reports whether a runner on dev was admitted by client x
// after t0: every generation on its model that ran between its previous
// runner's end and its load's end (one of them loaded it) is x's, began
// after t0, and had its load admitted after a check on dev (a budget's
// check for each of its generations; a pool's placement by room, or after
// making room, for each placement on dev). A load whose generations
// cannot be told apart is no admission: it is excused.
func (w *composeWorld) admittedBy(x string, dev int, cr composeRunner, t0 time.Time) bool {
	found := false
	for _, c := range w.rsv.calls {
		if c.model != cr.model || c.start.After(cr.tl) || c.end.Before(cr.tlo) {
			continue
		}
		if c.client != x || c.start.Before(t0) {
			return false
		}
		if w.pool && x == "main" {
			p := w.rsv.placedOn[c.id][dev]
			if p[0] == 0 {
				continue // placed elsewhere, or refused: it loaded nothing here
			}
			if p[1] != p[0] {
				return false
			}
		} else if runs := w.rsv.runs[c.id]; runs == 0 || w.rsv.admitted[c.id] != runs {
			return false
		}
		found = true
	}
	return found
}

// admitters are the clients whose loads on dev are admitted after a check
// (a budget on dev; a pool's placements).
func (w *composeWorld) admitters(dev int, shape composeShape) []string {
	var xs []string
	if w.pool || (shape.budget && dev == 0) {
		xs = append(xs, "main")
	}
	if dev == w.rsv.chatDev {
		xs = append(xs, "chat")
	}
	return xs
}

// checkReserved is the rule reserved-room-taken, after a step, at the
// step's end and at the end of each load of the step: on each device, for
// each client x that admits loads there and each reservation R of another
// holder that stands then, when runners admitted by x after R was taken
// hold memory there,
//
//	total - pre(R) - admitted(R, x) >= the bytes left of the reservations
//	of holders other than x that stand then and were taken no later than R
//
// where pre(R) is the memory certainly held then since before R was taken
// (runners whose load ended before, other programs' allocations made
// before and not freed since). Each such load's admission read the
// device after R was taken, with pre(R) on it, x's earlier admitted loads
// on it or counted as in flight, and those reservations taken out; what
// others took since is excused (another program, a load admitted before,
// an unchecked load, a recipient), and a recipient's allocations are
// counted as taken from its reservation once they began.
func (w *composeWorld) checkReserved(add func(rule, format string, args ...any), shape composeShape, stepStart time.Time) int {
	now := time.Now()
	checks := 0
	for dev := range 2 {
		rs := w.runners(dev)
		ats := []time.Time{now}
		for _, cr := range rs {
			if cr.tl.After(stepStart) {
				ats = append(ats, cr.tl)
			}
		}
		w.mu.Lock()
		for _, x := range w.admitters(dev, shape) {
			adm := map[int]bool{} // runners admitted by x, by R
			for _, rv := range w.rsv.rsvs {
				if rv.holder == x || rv.device != dev {
					continue
				}
				clear(adm)
				for i, cr := range rs {
					if !cr.tl.Before(rv.t0) && w.admittedBy(x, dev, cr, rv.t0) {
						adm[i] = true
					}
				}
				if len(adm) == 0 {
					continue
				}
				for _, at := range ats {
					if rv.t0.After(at) || !rv.standsThrough(rv.t0, at) {
						continue
					}
					var pre, held uint64
					var admitted []string
					for i, cr := range rs {
						switch {
						case !cr.heldAt(at):
						case cr.tl.Before(rv.t0):
							pre += cr.bytes
						case adm[i]:
							held += cr.bytes
							admitted = append(admitted, fmt.Sprintf("%s %dMiB loaded %s", cr.model, cr.bytes>>20, cr.tl.Format("04:05.000")))
						}
					}
					if len(admitted) == 0 {
						continue
					}
					checks++
					for _, a := range w.rsv.allocs {
						if a.device == dev && a.end.Before(rv.t0) && w.rsv.freed[a.owner].Before(a.start) {
							pre += a.bytes
						}
					}
					var left uint64
					var kept []*composeRsv
					for _, o := range w.rsv.rsvs {
						if o.holder != x && o.device == dev && !o.t0.After(rv.t0) && o.standsThrough(o.t0, at) {
							left += o.left(w.allocated(o.rcp, at))
							kept = append(kept, o)
						}
					}
					if pre+held+left > composeTotal {
						add("reserved-room-taken", "device %d at %s: %s admitted %v after reservation #%d was taken; %d MiB held since before it, %d MiB of reservations left (%s): %d MiB over the device's %d",
							dev, at.Format("04:05.000"), x, admitted, rv.n, pre>>20, left>>20, composeRsvsString(kept), (pre+held+left-composeTotal)>>20, composeTotal>>20)
					}
				}
			}
		}
		w.mu.Unlock()
	}
	return checks
}

// allocated is what recipient rcp's allocations that began before at add
// up to (at least what it held at any reading before at).
func (w *composeWorld) allocated(rcp string, at time.Time) uint64 {
	var n uint64
	for _, a := range w.rsv.allocs {
		if rcp != "" && a.owner == rcp && a.start.Before(at) {
			n += a.bytes
		}
	}
	return n
}

// rsvTaken reports whether an action of step took memory, or a
// reservation of another holder than the client under test, on one of
// devs: the room made there may be gone, and nothing can keep it. A
// recipient's allocation may be on either device; so may a chat
// program's load on a pool. The chat program's generation counts whether
// or not its hooks were told of a load (seed 1796421632800791638: the
// room EnsureFree made on device 0 was taken by a load of a, and the chat
// program's a was the only load of the step there).
func rsvTaken(step []composeOp, devs map[int]bool, pool bool) bool {
	on := map[string]int{}
	for _, m := range composeModels {
		on[m.name] = m.device
	}
	return slices.ContainsFunc(step, func(o composeOp) bool {
		switch o.kind {
		case "rsv-take":
			dev := o.device
			if o.holder == "other" && pool {
				dev = 1
			}
			return o.holder == "other" && devs[dev]
		case "rsv-consume":
			return true
		case "chat":
			return pool || devs[on[o.model]]
		}
		return false
	})
}

// overdrawn reports whether one of the readings of action call on devs
// showed less free memory than the reservations of holders other than the
// client under test had left there (another program, or a load no
// admission checked, took some of their bytes). The client's view then
// shows the device with nothing free, not with less than nothing, and
// room-making plans with memory no unload frees: the open finding of seed
// 1796422898705029008, which evicted-then-refused excuses unless
// -compose.overdrawn.
func (w *composeWorld) overdrawn(call int, devs map[int]bool, from, to time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, rd := range w.rsv.reads {
		if rd.call != call || !devs[rd.device] {
			continue
		}
		var left uint64
		for _, rv := range w.rsv.rsvs {
			ended := rv.until
			if !rv.relAt.IsZero() && rv.relAt.Before(ended) {
				ended = rv.relAt
			}
			if rv.holder != "main" && rv.device == rd.device && !rv.t0.After(to) && ended.After(from) {
				left += rv.left(rd.procs[rv.pid])
			}
		}
		if rd.free < left {
			return true
		}
	}
	return false
}
