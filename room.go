package vramguard

// Room-making has one owner, this file. EnsureFree, the budget's MakeRoom,
// Phase.End's hand-over and a pool's placement (through EnsureFree) all ask it: what a device
// holds (roomView, from one snapshot and one listing), the one victim
// policy (planRoom, a pure function), the steps that carry a plan out
// (tenants' releases and verified unloads, each followed by a bounded wait
// for the device to show the memory), and the one "no room" error
// (RoomError).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/ollama/ollama/api"
)

// ErrUnattributed: the VRAM reader lists several devices but does not say
// which one a model's runner is on (it names no runner's model, or lists
// no processes). Room-making does not guess: such a model is kept
// (KeptModel.Unattributed), and a room that cannot be made without it is
// refused with a *RoomError wrapping ErrUnattributed. On a server with one
// device every model is on it, and Ollama's size_vram stands in for a
// runner the reader does not name. EnsureRequest.AllModels unloads such
// models too.
var ErrUnattributed = errors.New("the VRAM reader does not say which device the model is on")

// KeptModel is a listed model that room-making left, and why.
type KeptModel struct {
	Model     string
	SizeVRAM  int64 // as /api/ps lists it
	Protected bool  // named in Options.Protected
	Leases    []LeaseInfo
	// InUse: a generation of this client runs on it. A budget's
	// room-making and EnsureFree with KeepInUse (a pool's) keep it; EnsureFree and
	// Phase.End's hand-over take it last instead (EnsureFree cuts such a
	// generation while it is still loading, as its unloads do; the
	// hand-over waits for it).
	InUse bool
	// Unattributed: the reader cannot say which device it is on (see
	// ErrUnattributed).
	Unattributed bool
}

func (k KeptModel) why() string {
	var ws []string
	if k.Protected {
		ws = append(ws, "protected")
	}
	for _, l := range k.Leases {
		ws = append(ws, "leased by "+l.String())
	}
	if k.InUse {
		ws = append(ws, "in use")
	}
	if k.Unattributed {
		ws = append(ws, "the reader cannot tell which device it is on; AllModels would unload it")
	}
	return strings.Join(ws, ", ")
}

// RoomError is the one "no room" error: every call that did not get the
// free memory it needed on a device says so with it, whichever refused
// (EnsureFree, Budget, Budget.MakeRoom, Phase.End's hand-over, AwaitFree;
// package pool's refusal holds one per member), so one errors.As finds
// it. It names what was needed, what was free, who holds the rest, the
// models room-making kept and when to try again.
//
// Err is nil when the room was refused by arithmetic, before anything was
// unloaded (free memory plus everything that may be evicted cannot reach
// Need); otherwise it is why the wait for the device to show the room
// ended: the call's ctx's cause, or its timeout (ErrFirstChunkTimeout,
// ErrTotalTimeout, or a timeout of EnsureRequest.Timeout), so errors.Is
// sees it.
type RoomError struct {
	// Model is the model whose load was refused; "" for EnsureFree,
	// AwaitFree and a phase's hand-over.
	Model  string
	Device int
	Need   uint64 // bytes needed free: the request or estimate, plus headroom
	Free   uint64 // free bytes at the last reading
	Total  uint64 // the device's memory
	// Held is what Ollama's runners held on the device; set when a
	// budget refused (what its MaxBytes caps).
	Held uint64
	// Holders is the device's memory by holder at the last reading
	// (DeviceMemory.Holders: runners by model, other programs, what no
	// process accounts for, the free share); nil when the reader lists
	// no processes.
	Holders []MemoryHolder
	// Kept are the models room-making could not unload.
	Kept []KeptModel
	// Reserved are other holders' reservations on the device (Reserve,
	// a phase's hand-over, a load admitted elsewhere, room another client
	// is making: LeaseInfo), with what each has left: bytes that are free
	// to the driver but not to this call, and that room-making cannot
	// free. Holders names them too (HolderReserved) where the reader lists
	// processes.
	Reserved []LeaseInfo
	// RetryAfter is the time until the first lease among Kept, or the
	// first reservation among Reserved, ends; zero when none has an end.
	RetryAfter time.Duration
	// Budget is the budget that refused the load; nil when none did.
	Budget *Budget
	// Err is why the wait for the room ended (nil: refused before any
	// wait, by arithmetic; a tenant's refusal: see Tenant.Release): the
	// ctx's cause or the call's timeout, both
	// matched by errors.Is(err, context.DeadlineExceeded) when a deadline
	// passed. LastErr is the reader's error when the last reading failed.
	Err, LastErr error

	// slots is how many models were loaded or admitted when
	// Budget.MaxLoaded refused the load (no memory was measured); 0 for a
	// refusal for memory.
	slots int
}

func (e *RoomError) Error() string {
	var b strings.Builder
	switch {
	case e.slots > 0 && e.Budget != nil:
		fmt.Fprintf(&b, "%s needs one of the server's %d slots (Budget.MaxLoaded), and the %d models loaded or admitted are kept",
			e.Model, e.Budget.MaxLoaded, e.slots)
		if len(e.Kept) == 0 {
			b.WriteString(" (none listed: loads admitted and not listed yet hold them)")
		}
	case e.Model != "" && e.Budget != nil && e.Budget.Headroom > 0 && e.Need >= e.Budget.Headroom:
		fmt.Fprintf(&b, "%s needs %s on device %d (%s for the model, %s headroom)", e.Model, vramFormatBytes(e.Need), e.Device,
			vramFormatBytes(e.Need-e.Budget.Headroom), vramFormatBytes(e.Budget.Headroom))
		fmt.Fprintf(&b, "; %s free of %s", vramFormatBytes(e.Free), vramFormatBytes(e.Total))
	case e.Model != "":
		fmt.Fprintf(&b, "%s needs %s on device %d", e.Model, vramFormatBytes(e.Need), e.Device)
		fmt.Fprintf(&b, "; %s free of %s", vramFormatBytes(e.Free), vramFormatBytes(e.Total))
	default:
		fmt.Fprintf(&b, "device %d has %s free of %s, needs %s", e.Device, vramFormatBytes(e.Free), vramFormatBytes(e.Total), vramFormatBytes(e.Need))
	}
	if e.Budget != nil && e.Budget.MaxBytes > 0 && e.slots == 0 {
		fmt.Fprintf(&b, "; Ollama holds %s of a %s cap", vramFormatBytes(e.Held), vramFormatBytes(e.Budget.MaxBytes))
	}
	e.writeRest(&b)
	if e.Err != nil {
		fmt.Fprintf(&b, "; stopped waiting: %v", e.Err)
	}
	if e.LastErr != nil {
		fmt.Fprintf(&b, "; last reading failed: %v", e.LastErr)
	}
	return b.String()
}

// writeRest writes the holders, the kept models and the retry-after.
func (e *RoomError) writeRest(b *strings.Builder) {
	if e.Holders == nil && e.Total > 0 {
		b.WriteString("; processes unknown")
	}
	writeHolders(b, e.Holders)
	if !slices.ContainsFunc(e.Holders, func(h MemoryHolder) bool { return h.Kind == HolderReserved }) {
		for _, r := range e.Reserved {
			fmt.Fprintf(b, "; reserved: %s", r.String())
		}
	}
	for _, k := range e.Kept {
		fmt.Fprintf(b, "; %s kept (%s)", k.Model, k.why())
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(b, "; retry after %v", e.RetryAfter.Round(time.Millisecond))
	}
}

// writeHolders writes "; held by " and the first vramHoldersShown holders
// of device memory (the free share left out).
func writeHolders(b *strings.Builder, hs []MemoryHolder) {
	n := 0
	for _, h := range hs {
		if h.Kind == HolderFree || h.Bytes == 0 {
			continue
		}
		switch {
		case n == 0:
			b.WriteString("; held by ")
		case n == vramHoldersShown:
			b.WriteString(" and more")
			return
		default:
			b.WriteString(", ")
		}
		n++
		b.WriteString(describeHolder(h))
	}
}

// describeHolder formats a share for a message:
// `tiny:latest (ollama runner, pid 101) 4.0 GiB`,
// `"python main.py" (pid 900) 18.0 GiB`, `unattributed 1.0 GiB`.
func describeHolder(h MemoryHolder) string {
	const maxName = 60
	name := h.Name
	if len(name) > maxName {
		name = name[:maxName] + "..."
	}
	orphan := ""
	if h.Orphaned {
		orphan = ", orphaned"
	}
	pid := fmt.Sprintf("pid %d", h.PID)
	switch {
	case h.Kind == HolderRunner && name == pid:
		return fmt.Sprintf("ollama runner (%s%s) %s", pid, orphan, vramFormatBytes(h.Bytes))
	case h.Kind == HolderRunner:
		return fmt.Sprintf("%s (ollama runner, %s%s) %s", quoteOdd(name), pid, orphan, vramFormatBytes(h.Bytes))
	case h.Kind == HolderOther && name == pid:
		return fmt.Sprintf("%s %s", pid, vramFormatBytes(h.Bytes))
	case h.Kind == HolderOther:
		return fmt.Sprintf("%q (%s) %s", name, pid, vramFormatBytes(h.Bytes))
	case h.Kind == HolderReserved:
		return fmt.Sprintf("reserved by %s %s", h.Name, vramFormatBytes(h.Bytes))
	default:
		return fmt.Sprintf("%s %s (held by the driver or by processes it does not list with their memory)", h.Kind, vramFormatBytes(h.Bytes))
	}
}

// Unwrap returns ErrOverBudget when a budget refused, ErrLeased when a
// kept model is leased or other holders' reservations are on the device
// (Reserved), ErrProtected and ErrUnattributed as the kept models apply,
// and Err and LastErr.
func (e *RoomError) Unwrap() []error {
	var errs []error
	if e.Budget != nil {
		errs = append(errs, ErrOverBudget)
	}
	kept := e.Kept
	if len(e.Reserved) > 0 || slices.ContainsFunc(kept, func(k KeptModel) bool { return len(k.Leases) > 0 }) {
		errs = append(errs, ErrLeased)
	}
	if slices.ContainsFunc(kept, func(k KeptModel) bool { return k.Protected }) {
		errs = append(errs, ErrProtected)
	}
	if slices.ContainsFunc(kept, func(k KeptModel) bool { return k.Unattributed }) {
		errs = append(errs, ErrUnattributed)
	}
	for _, err := range []error{e.Err, e.LastErr} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// retryAfter is the time from now until the earliest end among the leases
// of kept and the reservations of others on the device.
func retryAfter(kept []KeptModel, reserved []LeaseInfo, now time.Time) time.Duration {
	var first time.Time
	ends := slices.Clone(reserved)
	for _, k := range kept {
		ends = append(ends, k.Leases...)
	}
	for _, l := range ends {
		if !l.Until.IsZero() && (first.IsZero() || l.Until.Before(first)) {
			first = l.Until
		}
	}
	if first.IsZero() {
		return 0
	}
	return max(first.Sub(now), 0)
}

// roomTier orders the ways of making room.
type roomTier uint8

const (
	tierTenantFirst roomTier = iota // tenants with First
	tierModel                       // Ollama's models
	tierOwnModel                    // models this client leases itself (its phases', HoldModel's)
	tierBusyModel                   // models with a generation of this client in flight (waited for)
	tierTenantLast                  // the other tenants
)

// isTenant reports whether the tier asks tenants rather than unloads models.
func (t roomTier) isTenant() bool { return t == tierTenantFirst || t == tierTenantLast }

// roomCand is one way of making room on a device: a model to unload or a
// tenant to ask.
type roomCand struct {
	name    string
	bytes   uint64 // what it holds on the device
	known   bool   // bytes is known (always for a model)
	tier    roomTier
	tenant  int         // the tenant's id, for tenant tiers
	release releaseFunc // the tenant's Release
}

// roomRules are what keeps a model from room-making, gathered by the
// client for a room-making call.
type roomRules struct {
	protected func(model string) bool
	leases    []LeaseInfo     // other holders' live leases on the server
	inUse     map[string]bool // normalized: generations in flight
	// busyLast makes in-use models the last models to go (their
	// generations are waited for) instead of kept: for a caller that
	// demands the memory itself (EnsureFree, Phase.End's hand-over), not
	// for a load that would evict another's model (a budget, EnsureFree
	// with KeepInUse).
	busyLast bool
	own      map[string]bool // normalized: the caller's own leases
}

// roomView is what one device holds, as room-making sees it.
type roomView struct {
	device      int
	free, total uint64
	holders     []MemoryHolder // nil when the reader lists no processes
	cands       []roomCand
	kept        []KeptModel
	// unlisted is the memory of runners on the device whose model the
	// listing lacks: loading (Ollama lists a model once its load ends)
	// or leaving (the listing was read after the runner exited). Its
	// fate is not known from one reading. unlistedModels names them.
	unlisted       uint64
	unlistedModels []string
	// reserved are other holders' reservations on the device, already
	// taken out of free (the client's view); owed is what they have left
	// beyond the driver's free memory (DeviceMemory.Overdrawn): room-making
	// must free it too.
	reserved []LeaseInfo
	owed     uint64
}

// buildRoomView reads device from snap and the server's listing: each
// listed model counts for the device its runner's memory is on, by the
// reader's attribution (a runner split across devices with its share on
// each); on a snapshot of one device a model the reader does not name
// counts with Ollama's size_vram; on several it is kept as unattributed.
// A model that holds nothing on the device makes no room and is left out.
func buildRoomView(snap *VRAMSnapshot, d *DeviceMemory, listed []api.ProcessModelResponse, r roomRules, ts []tenantEntry) roomView {
	v := roomView{device: d.Index, free: d.Free, total: d.Total, reserved: d.Reserved, owed: d.Overdrawn}
	if d.ProcessesKnown {
		v.holders = d.Holders()
	}
	here := runnerBytes(d)
	elsewhere := map[string]bool{}
	for i := range snap.Devices {
		if o := &snap.Devices[i]; o.Index != d.Index {
			for k := range runnerBytes(o) {
				elsewhere[k] = true
			}
		}
	}
	multi := len(snap.Devices) > 1
	inList := map[string]bool{}
	for _, m := range listed {
		inList[NormalizeModelName(m.Model)] = true
	}
	for k, b := range here {
		if !inList[k] {
			v.unlisted += b
			v.unlistedModels = append(v.unlistedModels, k)
		}
	}
	for _, m := range listed {
		key := NormalizeModelName(m.Model)
		bytes, ok := here[key]
		switch {
		case ok:
		case elsewhere[key] || m.SizeVRAM <= 0:
			continue // on another device, or on the CPU: no room to make here
		case multi:
			v.kept = append(v.kept, KeptModel{Model: m.Model, SizeVRAM: m.SizeVRAM, Unattributed: true})
			continue
		default:
			bytes = uint64(m.SizeVRAM)
		}
		k := KeptModel{Model: m.Model, SizeVRAM: m.SizeVRAM, InUse: r.inUse[key] && !r.busyLast}
		k.Protected = r.protected != nil && r.protected(m.Model)
		for _, l := range r.leases {
			if l.Model == key {
				k.Leases = append(k.Leases, l)
			}
		}
		if k.Protected || len(k.Leases) > 0 || k.InUse {
			v.kept = append(v.kept, k)
			continue
		}
		tier := tierModel
		switch {
		case r.inUse[key]:
			tier = tierBusyModel
		case r.own[key]:
			tier = tierOwnModel
		}
		v.cands = append(v.cands, roomCand{name: m.Model, bytes: bytes, known: true, tier: tier})
	}
	for _, e := range ts {
		c := roomCand{name: e.t.Name, bytes: e.t.Bytes, tier: tierTenantLast, tenant: e.id, release: e.t.Release}
		if e.t.First {
			c.tier = tierTenantFirst
		}
		if c.bytes == 0 && e.t.PID != 0 {
			for _, p := range d.Processes {
				if p.PID == e.t.PID && p.UsedKnown {
					c.bytes += p.UsedBytes
				}
			}
		}
		c.known = c.bytes > 0
		v.cands = append(v.cands, c)
	}
	return v
}

// runnerBytes is the memory the device shows per runner's model, where
// the reader names it (the truth, not Ollama's estimate).
func runnerBytes(d *DeviceMemory) map[string]uint64 {
	out := map[string]uint64{}
	if !d.ProcessesKnown {
		return out
	}
	for _, pr := range d.Processes {
		if pr.Role == RoleOllamaRunner && pr.Model != "" && pr.UsedKnown {
			out[NormalizeModelName(pr.Model)] += pr.UsedBytes
		}
	}
	return out
}

// roomPlan is what planRoom chose: the steps, in order.
type roomPlan struct {
	steps []roomCand
	// enough: the free memory plus the known bytes of the steps reach
	// the need (true with no steps when the room is there).
	enough bool
	// unknown: a tenant of unknown size is among the steps, so only the
	// device can tell whether the room is made.
	unknown bool
	cost    uint64 // bytes of the models to unload (what must be loaded again)
	usesOwn bool   // a model of tierOwnModel is among the steps
}

// known is the bytes of the plan's steps whose size is known.
func (p roomPlan) known() uint64 {
	var n uint64
	for _, s := range p.steps {
		n += s.bytes
	}
	return n
}

// names returns the names of the plan's steps, in order.
func (p roomPlan) names() []string {
	var out []string
	for _, s := range p.steps {
		out = append(out, s.name)
	}
	return out
}

// planRoom is the victim policy, the only one: which of a device's
// candidates go, and in which order, so that need bytes are free. Tiers
// are taken in order (tenants with First, Ollama's idle models, the
// caller's own leased models, models with the caller's generations in
// flight where the caller allows it, the other tenants), each only while
// the room is still missing; within a tier the fewest bytes that make the room (fewer
// models on a tie), else all of the tier, largest first. Kept models are
// not candidates (buildRoomView left them out). When even every candidate
// cannot reach need, the plan is not enough: callers then unload nothing.
func planRoom(v roomView, need uint64) roomPlan {
	var p roomPlan
	need += v.owed // reserved bytes another process took come back first
	if v.free >= need {
		p.enough = true
		return p
	}
	missing := need - v.free
	for _, tier := range []roomTier{tierTenantFirst, tierModel, tierOwnModel, tierBusyModel, tierTenantLast} {
		var known, unknown []roomCand
		for _, c := range v.cands {
			switch {
			case c.tier != tier:
			case c.known:
				known = append(known, c)
			default:
				unknown = append(unknown, c)
			}
		}
		sel, got := fewestBytes(known, missing)
		p.steps = append(p.steps, sel...)
		missing -= min(missing, got)
		if missing == 0 {
			p.enough = true
			break
		}
		if len(unknown) > 0 {
			p.steps = append(p.steps, unknown...)
			p.unknown = true
		}
	}
	if p.enough {
		p.steps = pruneSteps(p.steps, need-v.free)
	}
	for _, s := range p.steps {
		if !s.tier.isTenant() {
			p.cost += s.bytes
		}
		p.usesOwn = p.usesOwn || s.tier == tierOwnModel
	}
	return p
}

// pruneSteps drops the unloads of an enough plan that its other steps
// make unneeded: a tier that could not make the room alone took all of
// itself, and a tenant asked after it may then free enough alone (the
// model would be unloaded, and loaded again, for nothing). Tenants' steps
// stay: their order is the caller's.
func pruneSteps(steps []roomCand, missing uint64) []roomCand {
	var sum uint64
	for _, s := range steps {
		if !s.known {
			return steps // what an unknown step frees cannot be counted
		}
		sum += s.bytes
	}
	out := slices.Clone(steps)
	for i := 0; i < len(out); {
		if !out[i].tier.isTenant() && sum-out[i].bytes >= missing {
			sum -= out[i].bytes
			out = slices.Delete(out, i, i+1)
			continue
		}
		i++
	}
	return out
}

// maxExactVictims bounds fewestBytes's exact search: a server holds a
// few models at a time (Ollama's default is three per GPU).
const maxExactVictims = 12

// fewestBytes is planRoom's choice within a tier: the subset of cs whose
// bytes reach missing with the fewest bytes (then the fewest members),
// exactly for up to maxExactVictims candidates (4,096 subsets, 0.1 ms;
// BenchmarkPlanRoom), else the smallest single one that is enough or the
// largest first until enough, pruned; when all of cs cannot reach
// missing, all of them, largest first.
func fewestBytes(cs []roomCand, missing uint64) ([]roomCand, uint64) {
	if missing == 0 || len(cs) == 0 {
		return nil, 0
	}
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b roomCand) int { return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(a.name, b.name)) })
	var total uint64
	for _, c := range cs {
		total += c.bytes
	}
	if total < missing {
		return cs, total
	}
	if len(cs) <= maxExactVictims {
		best, bestSum, bestN := 0, uint64(0), 0
		for mask := 1; mask < 1<<len(cs); mask++ {
			var sum uint64
			n := 0
			for i := range cs {
				if mask&(1<<i) != 0 {
					sum += cs[i].bytes
					n++
				}
			}
			if sum >= missing && (best == 0 || sum < bestSum || (sum == bestSum && n < bestN)) {
				best, bestSum, bestN = mask, sum, n
			}
		}
		var out []roomCand
		for i := range cs {
			if best&(1<<i) != 0 {
				out = append(out, cs[i])
			}
		}
		return out, bestSum
	}
	for i := len(cs) - 1; i >= 0; i-- { // the smallest that is enough alone
		if cs[i].bytes >= missing {
			return []roomCand{cs[i]}, cs[i].bytes
		}
	}
	var out []roomCand
	var sum uint64
	for _, c := range cs {
		if sum >= missing {
			break
		}
		out, sum = append(out, c), sum+c.bytes
	}
	for i := len(out) - 1; i >= 0; i-- { // prune what the others cover
		if sum-out[i].bytes >= missing {
			sum -= out[i].bytes
			out = slices.Delete(out, i, i+1)
		}
	}
	return out, sum
}

// quoteOdd quotes a name from some process's argv when it holds a space
// or an unprintable rune.
func quoteOdd(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return r == ' ' || !unicode.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

// roomRequest is one room-making call.
type roomRequest struct {
	op, model string
	device    int
	need      uint64
	interval  time.Duration // between device readings
	// timeout bounds each wait: for leases, and for the device to show
	// the memory after a step.
	timeout    time.Duration
	waitLeases bool
	dryRun     bool
	all        bool // EnsureRequest.AllModels
	mode       unloadMode
	// forLoad is, for a budget's admission, the model whose load the room
	// is for: a wait for the room also ends (errListedMeanwhile) when the
	// server lists it, loaded meanwhile by another party, since a listed
	// model is no load.
	forLoad string
	// keep: the caller turns the hold keepRoom took on the room into the
	// reservation it was asked for, then ends it; makeRoom leaves the
	// hold in EnsureReport.keep when it made the room.
	keep bool
}

// maxKeepPlans bounds how often room-making plans again when the device
// changed between its plan and the hold on the room (keepRoom).
const maxKeepPlans = 2

// maxRoomRounds bounds the steps of one room-making call: one per tier,
// and one more for a model another program loaded meanwhile.
const maxRoomRounds = 5

// ownRules are the client's own for an unload of mode: Options.Protected,
// other holders' leases (none with mode.force), its generations in flight
// (kept for a budget, last otherwise), its leases (last); and for a
// phase's hand-over (mode.phase), the models its other live phases keep,
// as leases of theirs.
func (c *OllamaClient) ownRules(mode unloadMode) func() roomRules {
	return func() roomRules {
		r := roomRules{protected: c.isProtected, inUse: c.book.inFlightModels(), own: c.ownLeased(), busyLast: mode.cause != CauseBudget && !mode.keepInUse}
		if !mode.force {
			r.leases = c.heldLeases("")
		}
		if mode.phase != nil {
			r.leases = append(r.leases, c.phaseHolds(mode.phase)...)
		}
		if mode.keepOwn {
			r.leases = append(r.leases, c.ownLeases()...)
		}
		return r
	}
}

// makeRoom is room-making: it plans on a fresh view of the device, refuses
// at once (nothing unloaded) when the plan cannot reach the need, and
// otherwise carries the plan out step by step (a tier at a time, each
// followed by a wait, bounded by rq.timeout, for the device to show what
// the step freed, then a new view and plan), runs the release step (the
// tenants on no device, then the GC: releaseVRAM), and waits
// for the room. A wait that ends is the *RoomError of KindOutOfMemory
// naming the holders, with the cause kept.
func (c *OllamaClient) makeRoom(ctx context.Context, rq roomRequest) (rep *EnsureReport, err error) {
	start := time.Now()
	rep = &EnsureReport{Source: SourceNone}
	returned := false
	defer func() {
		// The hold on the room ends with the call, a panic (a reader's, a
		// tenant's) included, unless the caller turns it into its
		// reservation.
		if rep.keep != nil && (!returned || err != nil || !rq.keep) {
			c.endKeep(rep.keep)
			rep.keep = nil
		}
	}()
	err = c.makeRoomSteps(ctx, rq, rep)
	returned = true
	rep.Elapsed = time.Since(start)
	return rep, err
}

func (c *OllamaClient) makeRoomSteps(ctx context.Context, rq roomRequest, rep *EnsureReport) error {
	if rq.all {
		return c.makeRoomAll(ctx, rq, rep)
	}
	v, p, err := c.firstPlan(ctx, rq, rep, nil)
	for plans := 1; err == nil && !rq.dryRun && len(p.steps) > 0; plans++ {
		// The room is kept host-wide from before the first step (keepRoom):
		// what the steps free is this call's, not the first admission's
		// elsewhere that reads the device before this call does.
		var fresh bool
		if rep.keep, fresh = c.keepRoom(ctx, rq, p); fresh {
			break
		}
		if plans > maxKeepPlans {
			// Memory taken between each plan and its hold: refused before
			// anything is unloaded, as a plan that cannot make the room is.
			re := v.refusal(rq)
			re.Err = fmt.Errorf("the device changed between each of %d plans and the hold on its room (another program allocating)", plans)
			return newError(rq.op, rq.model, KindOutOfMemory, re)
		}
		c.log.Debug("room-making: the device changed since the plan; planning again", "device", rq.device, "need", rq.need)
		v, p, err = c.firstPlan(ctx, rq, rep, nil)
	}
	if err != nil || rq.dryRun || len(p.steps) == 0 {
		return err
	}
	var errs []error
	released := map[int]bool{}
	for round := 0; len(p.steps) > 0 && round < maxRoomRounds; round++ {
		group := firstGroup(p.steps)
		// After the plan's last unloads the final wait shows the room; a
		// tenant's release is looked at again (it may have given less).
		last := len(group) == len(p.steps) && p.enough && !group[0].tier.isTenant()
		target, err := c.roomStep(ctx, rq, rep, v, group, released)
		if err != nil {
			errs = append(errs, err)
			if !group[0].tier.isTenant() {
				return errors.Join(errs...) // an unload not verified: the room is not known
			}
			if ctx.Err() != nil && tenantRefusal(errs) != nil {
				break // the call's bound ended in a tenant's release: refused below
			}
		}
		if last {
			break // the final wait, after the release step, shows the room
		}
		if target > 0 { // a tenant's release was waited for already
			if _, werr := c.awaitRoom(ctx, rq, v, rep, target, v.owed); werr != nil {
				return errors.Join(append([]error{werr}, errs...)...)
			}
		}
		if v, _, err = c.viewRoom(ctx, rq, released); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if p = planRoom(v, rq.need); !p.enough && !p.unknown && len(errs) == 0 {
			// The rest of the plan no longer makes the room (another
			// holder leased a model it counted on, another program took
			// memory): planned as at the start, which waits for leases
			// (WaitForLeases), runners leaving and loads landing, and
			// otherwise refuses at once, naming what keeps the room,
			// instead of waiting out the bound for memory nothing frees.
			first := *rep
			v, p, err = c.firstPlan(ctx, rq, rep, released)
			rep.FreeBefore, rep.Plan = first.FreeBefore, first.Plan
			if err != nil {
				return err
			}
		}
	}
	if refused := tenantRefusal(errs); refused != nil {
		if err := c.refusedRoom(ctx, rq, v, rep, refused); err != nil {
			others := slices.DeleteFunc(slices.Clone(errs), func(e error) bool { return e == refused })
			return errors.Join(append([]error{err}, others...)...)
		}
	}
	rr, err := c.releaseVRAM(ctx, false) // the tenants on this device were the plan's to ask
	rep.Release = rr
	if err != nil {
		errs = append(errs, err)
	}
	if _, werr := c.awaitRoom(ctx, rq, v, rep, rq.need, 0); werr != nil {
		errs = append([]error{werr}, errs...) // the outcome first: KindOf reads it
	}
	return errors.Join(errs...)
}

// tenantRefusal is the first of errs by which a tenant refused its
// memory (Tenant.Release failing with KindRefused) or kept it past the
// call's bound (a Release that ended with KindTimeout or a deadline);
// nil when none did.
func tenantRefusal(errs []error) error {
	for _, err := range errs {
		if errors.Is(err, KindRefused) || errors.Is(err, KindTimeout) {
			return err
		}
	}
	return nil
}

// tenantTimedOut says whether a tenant's Release ended because a deadline
// passed: its own KindTimeout, or context.DeadlineExceeded in its chain.
func tenantTimedOut(err error) bool {
	return errors.Is(err, KindTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// refusedRoom is the end of a plan in which a tenant refused or timed
// out: one reading of the device, and when it lacks the room, the
// *RoomError at once (no wait for memory the tenant keeps), its
// RetryAfter raised to the refusal's: of KindOutOfMemory for a refusal,
// of KindTimeout for a tenant whose release the call's bound ended (the
// reading then taken under context.WithoutCancel(ctx), for at most
// rq.timeout, when ctx itself is done).
func (c *OllamaClient) refusedRoom(ctx context.Context, rq roomRequest, v roomView, rep *EnsureReport, refused error) error {
	kind := KindOutOfMemory
	if !errors.Is(refused, KindRefused) {
		kind = KindTimeout
		if ctx.Err() != nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), rq.timeout)
			defer cancel()
		}
	}
	snap, d, err := c.readDevice(ctx, rq)
	if err != nil {
		if kind == KindTimeout {
			re := v.refusal(rq)
			re.Err, re.LastErr = refused, err
			return newError(rq.op, rq.model, kind, re)
		}
		return err
	}
	rep.Snapshot, rep.Source, rep.FreeAfter = snap, snap.Source, d.Free
	if d.Free >= rq.need {
		return nil
	}
	re := v.refusal(rq)
	re.Free, re.Total, re.Err = d.Free, d.Total, refused
	if d.ProcessesKnown {
		re.Holders = d.Holders()
	}
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(refused, &ra) {
		re.RetryAfter = max(re.RetryAfter, ra.RetryAfter())
	}
	return newError(rq.op, rq.model, kind, re)
}

// firstPlan takes the first view and plan, fills in what the report says
// before anything is done, and refuses a plan that cannot make the room
// (waiting for leases instead, with rq.waitLeases, under ctx and
// rq.timeout). released are the tenants the call asked already (nil at
// its start), which no plan asks again.
func (c *OllamaClient) firstPlan(ctx context.Context, rq roomRequest, rep *EnsureReport, released map[int]bool) (roomView, roomPlan, error) {
	var deadline <-chan time.Time
	rechecked, loadsAwaited := false, false
	for waited := false; ; waited = true {
		v, snap, err := c.viewRoom(ctx, rq, released)
		if errors.Is(err, errListedMeanwhile) {
			return v, roomPlan{}, err
		}
		if err != nil && !(waited && ctx.Err() == nil && KindOf(err) != KindNotFound && KindOf(err) != KindInvalidInput) {
			return v, roomPlan{}, err
		}
		var re *RoomError
		var p roomPlan
		if err == nil {
			if !waited {
				rep.FreeBefore, rep.Snapshot, rep.Source = v.free, snap, snap.Source
			}
			rep.FreeAfter, rep.Kept, rep.RetryAfter = v.free, v.kept, retryAfter(v.kept, v.reserved, time.Now())
			p = planRoom(v, rq.need)
			rep.Plan = p.names()
			if p.enough || p.unknown {
				return v, p, nil
			}
			re = v.refusal(rq)
			rep.Plan = nil // nothing would be done
			if !rechecked && v.unlisted > 0 && v.free+p.known()+v.unlisted >= rq.need+v.owed {
				// A runner on the device that the listing lacks is loading
				// or leaving, and if leaving its memory would make the
				// room: wait for it (bounded) and look again, rather than
				// refuse what the driver is about to give back.
				// A loading one is listed when its load ends: the wait ends
				// then too, and the room is planned with it.
				rechecked = true
				wctx, stop := c.untilListed(ctx, v.unlistedModels, rq.interval)
				_, _ = c.awaitBounded(wctx, rq, min(v.total, v.free+v.unlisted), v.owed)
				stop()
				if ctx.Err() == nil {
					continue
				}
			}
			if ids, loads := loadReservations(v.reserved); !loadsAwaited && !rq.dryRun && len(ids) > 0 && v.free+p.known()+v.unlisted+loads >= rq.need+v.owed {
				// Another program's load in flight holds a reservation
				// (ReserveOptions.Load) that keeps the room: it ends once
				// the load lands, and the loaded model is then planned like
				// any other. Wait for it (bounded) rather than refuse.
				loadsAwaited = true
				c.awaitReservationsEnd(ctx, rq, ids)
				if ctx.Err() == nil {
					continue
				}
			}
			if !rq.waitLeases || !errors.Is(re, ErrLeased) || rq.dryRun {
				return v, p, newError(rq.op, rq.model, KindOutOfMemory, re)
			}
		} else {
			// A listing that fails while it waits (v0.17.4 answers 500
			// during an unload) is looked at again at the next poll.
			c.log.Debug("room-making: reading failed while waiting for leases", "err", err)
		}
		if deadline == nil {
			t := time.NewTimer(rq.timeout)
			defer t.Stop()
			deadline = t.C
		}
		c.log.Debug("room-making waits for leases", "device", rq.device, "need", rq.need)
		var cause error
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-deadline:
			cause = fmt.Errorf("leases still held after %v (EnsureRequest.Timeout, else Options.UnloadTimeout): %w", rq.timeout, context.DeadlineExceeded)
		case <-time.After(rq.interval):
			continue
		}
		if re == nil {
			re = &RoomError{Model: rq.model, Device: rq.device, Need: rq.need, LastErr: err}
		}
		re.Err = cause
		return v, p, newError(rq.op, rq.model, KindOutOfMemory, re)
	}
}

// loadReservations are the ids of the reservations among rs that stand for
// loads in flight (LeaseInfo.Load), and the bytes they have left.
func loadReservations(rs []LeaseInfo) (ids []string, bytes uint64) {
	for _, r := range rs {
		if r.Load != "" {
			ids = append(ids, r.ID)
			bytes += r.Bytes - min(r.Taken, r.Bytes)
		}
	}
	return ids, bytes
}

// awaitReservationsEnd reads the device every rq.interval, within
// rq.timeout and ctx, until none of the reservations ids is on it. A wait
// that ends first, or a reading that fails, ends it: the plan that follows
// says what the device holds.
func (c *OllamaClient) awaitReservationsEnd(ctx context.Context, rq roomRequest, ids []string) {
	ctx, cancel := context.WithTimeout(ctx, rq.timeout)
	defer cancel()
	for {
		snap, err := c.view(ctx)
		if err != nil {
			return
		}
		d := snap.Device(rq.device)
		if d == nil || !slices.ContainsFunc(d.Reserved, func(r LeaseInfo) bool { return slices.Contains(ids, r.ID) }) {
			return
		}
		if sleepCtx(ctx, rq.interval) != nil {
			c.log.Debug("room-making: loads in flight did not land in time; planned without them", "device", rq.device, "timeout", rq.timeout)
			return
		}
	}
}

// viewRoom reads the device and, when it lacks the room, the server's
// listing and what keeps models.
func (c *OllamaClient) viewRoom(ctx context.Context, rq roomRequest, released map[int]bool) (roomView, *VRAMSnapshot, error) {
	snap, d, err := c.readDevice(ctx, rq)
	if err != nil {
		return roomView{}, snap, err
	}
	if d.Free >= rq.need {
		return roomView{device: d.Index, free: d.Free, total: d.Total, reserved: d.Reserved}, snap, nil
	}
	listed, err := c.running(ctx)
	if err != nil {
		return roomView{}, snap, err
	}
	if rq.forLoad != "" && findRunning(listed, rq.forLoad) != nil {
		// Loaded meanwhile by another party: no load needs the room, and
		// the model is not evicted to make it.
		return roomView{}, snap, errListedMeanwhile
	}
	ts := slices.DeleteFunc(c.tenants.on(rq.device), func(e tenantEntry) bool { return released[e.id] })
	for i := range ts {
		if ts[i].t.Size != nil {
			ts[i].t.Bytes, ts[i].t.PID = c.tenantSize(ctx, ts[i].t), 0
		}
	}
	return buildRoomView(snap, d, listed, c.ownRules(rq.mode)(), ts), snap, nil
}

// tenantSize asks a tenant with Size what it can give back now: zero
// (unknown) when it fails or panics, or says more than MaxBytes.
func (c *OllamaClient) tenantSize(ctx context.Context, t Tenant) (n uint64) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Warn("tenant's Size panicked; its size is unknown", "tenant", t.Name, "panic", r)
			n = 0
		}
	}()
	n, err := t.Size(ctx)
	if err != nil || n > maxBytes {
		c.log.Debug("tenant's size unknown", "tenant", t.Name, "bytes", n, "err", err)
		return 0
	}
	return n
}

// readDevice takes a snapshot and finds rq's device in it: KindNotFound
// when the reader does not list it, KindInvalidInput when it has less
// memory in all than rq needs.
func (c *OllamaClient) readDevice(ctx context.Context, rq roomRequest) (*VRAMSnapshot, *DeviceMemory, error) {
	snap, err := c.view(ctx)
	if err == nil && snap == nil {
		err = errors.New("reader returned no snapshot")
	}
	if err != nil {
		return nil, nil, readerError(ctx, rq.op, rq.model, err)
	}
	d := snap.Device(rq.device)
	switch {
	case d == nil:
		return snap, nil, newError(rq.op, rq.model, KindNotFound, fmt.Errorf("no device %d among the %d the VRAM reader (%s) reports", rq.device, len(snap.Devices), snap.Source))
	case rq.need > d.Total:
		return snap, nil, invalid(rq.op, rq.model, "needs %s but device %d has %s in total", vramFormatBytes(rq.need), rq.device, vramFormatBytes(d.Total))
	}
	return snap, d, nil
}

// refusal is the *RoomError of a room that v cannot make.
func (v roomView) refusal(rq roomRequest) *RoomError {
	return &RoomError{Model: rq.model, Device: v.device, Need: rq.need, Free: v.free, Total: v.total,
		Holders: v.holders, Kept: v.kept, Reserved: v.reserved, RetryAfter: retryAfter(v.kept, v.reserved, time.Now())}
}

// firstGroup is the plan's first tier: the steps carried out together.
func firstGroup(steps []roomCand) []roomCand {
	n := 1
	for n < len(steps) && steps[n].tier == steps[0].tier {
		n++
	}
	return steps[:n]
}

// roomStep carries out one tier of a plan: the unloads (verified, side by
// side), returning the free memory to wait for before the next view, or
// the tenants' releases (one after another, each waited for and verified
// on the device), returning 0.
func (c *OllamaClient) roomStep(ctx context.Context, rq roomRequest, rep *EnsureReport, v roomView, group []roomCand, released map[int]bool) (uint64, error) {
	if !group[0].tier.isTenant() {
		target := v.free
		for _, s := range group {
			target += s.bytes
		}
		target = min(target, rq.need+v.owed) // the room, the debt paid first (debtFree)
		names := make([]string, len(group))
		for i, s := range group {
			names[i] = s.name
		}
		c.log.Debug("making room", "device", rq.device, "need", rq.need, "free", v.free, "owed", v.owed, "unload", names)
		reps, err := c.unloadMany(ctx, names, rq.mode)
		rep.Evicted = append(rep.Evicted, reps...)
		return target, err
	}
	var errs []error
	base := v.free // free as the waits count it, the plan's debt counted back (debtFree)
	for _, s := range group {
		released[s.tenant] = true
		tr, after := c.releaseTenant(ctx, rq, s, v.free, base, v.owed)
		rep.Tenants = append(rep.Tenants, tr)
		if tr.Err != nil {
			kind := KindInternal
			switch {
			case errors.Is(tr.Err, KindRefused):
				kind = KindRefused
			case tenantTimedOut(tr.Err):
				kind = KindTimeout
			case KindOf(tr.Err) != KindUnknown:
				kind = KindOf(tr.Err)
			}
			errs = append(errs, newError(rq.op, "", kind, fmt.Errorf("tenant %s: %w", s.name, tr.Err)))
		}
		v.free, base = tr.FreeAfter, after
	}
	return 0, errors.Join(errs...)
}

// releaseTenant asks one tenant for its memory, its Release bounded by
// rq.timeout (for a budget's load by ctx alone), and waits, within
// rq.timeout, for the device to show it: s.bytes more than before or the
// room, whichever is less; for a tenant of unknown size the room itself.
// before is the view's free memory; base is what the wait counts as free
// then, the plan's debt owed counted back (debtFree), and after is that
// count once the tenant released.
func (c *OllamaClient) releaseTenant(ctx context.Context, rq roomRequest, s roomCand, before, base, owed uint64) (_ TenantRelease, after uint64) {
	start := time.Now()
	tr := TenantRelease{Name: s.name, FreeBefore: before, FreeAfter: before}
	c.log.Debug("asking a tenant for memory", "tenant", s.name, "device", rq.device, "bytes", s.bytes)
	// The release (a tenant that waits for its own work, say) is bounded
	// like every wait of the call: by rq.timeout as well as ctx; for a
	// budget's load (rq.forLoad) by ctx alone, which carries the
	// generation's own timeouts.
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if rq.forLoad == "" {
		rctx, cancel = context.WithTimeoutCause(ctx, rq.timeout,
			fmt.Errorf("tenant %s did not release within %v (EnsureRequest.Timeout, else Options.UnloadTimeout): %w", s.name, rq.timeout, context.DeadlineExceeded))
	}
	tr.Err = runRelease(rctx, s.release)
	cancel()
	after = base
	if tr.Err != nil { // no wait for a release that failed: one reading says what it left
		if snap, err := c.view(ctx); err == nil {
			if d := snap.Device(rq.device); d != nil {
				tr.FreeAfter, after = d.Free, debtFree(d, owed)
			}
		}
		tr.Elapsed = time.Since(start)
		return tr, after
	}
	// What it gives back, but never more than the room (the debt paid
	// first): a tenant that overstates its bytes (past the device's
	// total) is still verified by the room it makes.
	target := rq.need + owed
	if s.known {
		target = min(base+s.bytes, target)
	}
	snap, err := c.awaitBounded(ctx, rq, target, owed)
	if d := snap.Device(rq.device); d != nil {
		tr.FreeAfter, after = d.Free, debtFree(d, owed)
	}
	tr.Verified = err == nil && after > base
	tr.Elapsed = time.Since(start)
	return tr, after
}

// awaitRoom waits, within rq.timeout and ctx, for target free bytes on
// the device, counted with the debt owed back (debtFree: a plan's step
// that pays others' overdrawn reservations shows nothing free in the view
// until it is paid; 0 for the room itself). When the wait ends first, the error is KindOutOfMemory with
// the *RoomError of the last reading (the wait's cause kept in Err).
func (c *OllamaClient) awaitRoom(ctx context.Context, rq roomRequest, v roomView, rep *EnsureReport, target, owed uint64) (*VRAMSnapshot, error) {
	waitStart := time.Now()
	snap, err := c.awaitBounded(ctx, rq, target, owed)
	// The event and the error speak of the view, not of the debt the wait
	// counted back (debtFree): what it waited for, in the view's terms.
	ev := VRAMWaitEvent{Device: rq.device, Server: c.host, Need: target - min(target, owed), Waited: time.Since(waitStart), Err: err}
	free, known := uint64(0), false
	if snap != nil {
		rep.Snapshot, rep.Source = snap, snap.Source
		if d := snap.Device(rq.device); d != nil {
			rep.FreeAfter, ev.Free = d.Free, d.Free
			free, known = d.Free, true
		}
	}
	var re *RoomError
	if errors.As(err, &re) {
		if known {
			re.Free = free
		}
		re.Model, re.Need, re.Kept, re.RetryAfter = rq.model, rq.need, v.kept, retryAfter(v.kept, v.reserved, time.Now())
		err = newError(rq.op, rq.model, KindOutOfMemory, re)
		ev.Err = err
	}
	hookCtx(c, c.opts.Hooks.OnVRAMWait, ctx, ev)
	return snap, err
}

// awaitBounded is AwaitFree for target bytes within rq.timeout, whose
// passing is the cause (it wraps context.DeadlineExceeded and names the
// bound).
func (c *OllamaClient) awaitBounded(ctx context.Context, rq roomRequest, target, owed uint64) (*VRAMSnapshot, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, rq.timeout,
		fmt.Errorf("the device did not show it within %v (EnsureRequest.Timeout, else Options.UnloadTimeout): %w", rq.timeout, context.DeadlineExceeded))
	defer cancel()
	if rq.forLoad != "" {
		var stop func()
		ctx, stop = c.untilListed(ctx, []string{rq.forLoad}, rq.interval)
		defer stop()
	}
	var r VRAMReader = viewReader{c}
	var dr *debtReader
	if owed > 0 {
		dr = &debtReader{c: c, device: rq.device, owed: owed}
		r = dr
	}
	snap, err := AwaitFree(ctx, r, AwaitRequest{Device: rq.device, Bytes: target, PollInterval: rq.interval})
	if dr != nil && snap != nil {
		snap = dr.last // as the client's view shows it, not as the wait counted it
	}
	if err != nil && errors.Is(context.Cause(ctx), errListedMeanwhile) {
		return snap, errListedMeanwhile
	}
	return snap, err
}

// debtFree is d's free memory with owed bytes of debt counted back: what a
// plan that began with others' reservations owed bytes past the driver's
// free memory (roomView.owed, DeviceMemory.Overdrawn) counts as free. The
// view shows nothing free until that debt is paid, so a wait for what a
// step frees measures the step in these terms, and never waits for bytes
// the step was planned to pay the debt with (composition oracle seed
// 1796437259495622033: room-making unloaded a model beside a reservation
// overdrawn by 2 GiB and waited its bound for the view to show the model's
// 2 GiB).
func debtFree(d *DeviceMemory, owed uint64) uint64 {
	if d.Overdrawn > 0 {
		return owed - min(owed, d.Overdrawn) // the view's Free is 0 then
	}
	return d.Free + owed
}

// debtReader is the client's view with a plan's debt counted back on one
// device (debtFree), for AwaitFree; last is its last snapshot as the view
// showed it (AwaitFree reads one at a time).
type debtReader struct {
	c      *OllamaClient
	device int
	owed   uint64
	last   *VRAMSnapshot
}

func (r *debtReader) Snapshot(ctx context.Context) (*VRAMSnapshot, error) {
	snap, err := r.c.view(ctx)
	if err != nil || snap == nil {
		return snap, err
	}
	r.last = snap
	out := *snap
	out.Devices = slices.Clone(snap.Devices)
	if d := out.Device(r.device); d != nil {
		d.Free, d.Overdrawn = debtFree(d, r.owed), 0
	}
	return &out, nil
}

// errListedMeanwhile ends a budget's wait for room when the server lists
// the model the room is for (roomRequest.forLoad).
var errListedMeanwhile = errors.New("the model was loaded meanwhile")

// untilListed returns ctx canceled with errListedMeanwhile once the
// server lists one of models (looked at every interval); stop ends the
// watch. With no models it watches nothing.
func (c *OllamaClient) untilListed(ctx context.Context, models []string, interval time.Duration) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if len(models) == 0 {
		return ctx, func() { cancel(nil) }
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if ms, err := c.running(ctx); err == nil && slices.ContainsFunc(models, func(m string) bool { return findRunning(ms, m) != nil }) {
				cancel(errListedMeanwhile)
				return
			}
		}
	}()
	return ctx, func() { cancel(nil); <-done }
}

// makeRoomAll is EnsureRequest.AllModels: every listed model not kept,
// whatever its device, then the release step (the tenants on no device)
// and, with a reader, the wait for
// the room.
// allModelsOrder is the plan of EnsureRequest.AllModels: every listed model
// not kept, in the victim policy's order (planRoom's tiers: idle models,
// then this client's own leased ones, then those with its generations in
// flight; within a tier the fewest bytes to load again first, then the
// name), so that a caller that needs one model gone (a slot) takes the
// first.
func allModelsOrder(v roomView, listed []api.ProcessModelResponse) []string {
	type victim struct {
		name string
		tier roomTier
		size int64
	}
	var vs []victim
	for _, m := range listed {
		i := slices.IndexFunc(v.cands, func(c roomCand) bool { return c.name == m.Model })
		if i < 0 {
			continue // kept
		}
		vs = append(vs, victim{m.Model, v.cands[i].tier, m.Size})
	}
	slices.SortStableFunc(vs, func(a, b victim) int {
		return cmp.Or(cmp.Compare(a.tier, b.tier), cmp.Compare(a.size, b.size), strings.Compare(a.name, b.name))
	})
	out := make([]string, len(vs))
	for i, x := range vs {
		out[i] = x.name
	}
	return out
}

func (c *OllamaClient) makeRoomAll(ctx context.Context, rq roomRequest, rep *EnsureReport) error {
	if c.opts.VRAM != nil {
		snap, d, err := c.readDevice(ctx, rq)
		if err != nil {
			return err
		}
		rep.FreeBefore, rep.FreeAfter, rep.Snapshot, rep.Source = d.Free, d.Free, snap, snap.Source
	}
	listed, err := c.running(ctx)
	if err != nil {
		return err
	}
	// Every model counts, whatever its device and its size_vram (a CPU
	// server lists 0, which room-making on a device skips): one device
	// holding all, each model at least a byte, so that the rules that keep
	// a model (protected, leased, in use) apply to every one.
	one := &VRAMSnapshot{Devices: []DeviceMemory{{}}}
	all := slices.Clone(listed)
	for i := range all {
		all[i].SizeVRAM = max(all[i].SizeVRAM, 1)
	}
	v := buildRoomView(one, &one.Devices[0], all, c.ownRules(rq.mode)(), nil)
	for i := range v.kept {
		if j := slices.IndexFunc(listed, func(m api.ProcessModelResponse) bool { return m.Model == v.kept[i].Model }); j >= 0 {
			v.kept[i].SizeVRAM = listed[j].SizeVRAM // as /api/ps lists it
		}
	}
	rep.Kept, rep.RetryAfter = v.kept, retryAfter(v.kept, v.reserved, time.Now())
	rep.Plan = allModelsOrder(v, listed)
	if rq.dryRun {
		return nil
	}
	var errs []error
	if len(rep.Plan) > 0 {
		reps, err := c.unloadMany(ctx, rep.Plan, rq.mode)
		rep.Evicted = reps
		errs = append(errs, err)
	}
	rr, err := c.releaseVRAM(ctx, false)
	rep.Release = rr
	errs = append(errs, err)
	if c.opts.VRAM != nil {
		_, err := c.awaitRoom(ctx, rq, v, rep, rq.need, 0)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
