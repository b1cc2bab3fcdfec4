package pool

// Where a load goes: the facts of each member (its listing, its device),
// a pure choice over them (choose), and room-making on the chosen member's
// device through the pool client's own EnsureFree: the root owns the
// victim policy and the verified unloads; the pool only picks the member.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vramguard/vramguard"
)

// PlaceReason says why a pool chose a member for a model.
type PlaceReason string

// The reasons, in the order a pool tries them.
const (
	// PlaceWarm: the member's server lists the model (or is loading it
	// for this pool): no load. Of several such members, the one with the
	// most free memory.
	PlaceWarm PlaceReason = "warm"
	// PlaceRoom: of the members whose device has room for the model's
	// estimate plus Options.Headroom, the one with the most free memory
	// (ties: fewer loads in flight through the pool, then the first).
	PlaceRoom PlaceReason = "room"
	// PlaceMadeRoom: no device had room; the client's EnsureFree made it,
	// verified, on the member where that cost least (the fewest bytes to
	// load again, sparing the client's own leased models, its phases',
	// when a member's room can be made without them).
	PlaceMadeRoom PlaceReason = "made room"
)

// Placement is a pool's decision for a call: Options.OnPlace and
// WithPlacements (and an INFO log line when it loads).
type Placement struct {
	Model  string // as the call named it (MemberStatus.Models are normalized: "llama3.2:latest")
	Member string // Member.Name
	Device int    // the member's device in the pool client's numbering (Pool.Device)
	Reason PlaceReason
	// Need is the model's estimate plus the headroom, in bytes (0 for
	// PlaceWarm: nothing was estimated).
	Need uint64
	// Free is the member's free device memory when it was chosen (before
	// the load; for PlaceMadeRoom, before the unloads).
	Free uint64
	// Evicted lists the models PlaceMadeRoom unloaded, verified.
	Evicted []string
}

type placementsKey struct{}

type placements struct {
	mu sync.Mutex
	ps []Placement
}

// WithPlacements returns a context whose calls through a pool record their
// placements, and a function that returns them so far, in order: what a
// caller reads after GenerateStreaming to know where the call went. Every
// call made with the context (or one derived from it) adds to the same
// record; a call refused before it was placed adds none. Both are safe
// for concurrent use.
func WithPlacements(ctx context.Context) (context.Context, func() []Placement) {
	r := &placements{}
	return context.WithValue(ctx, placementsKey{}, r), func() []Placement {
		r.mu.Lock()
		defer r.mu.Unlock()
		return append([]Placement(nil), r.ps...)
	}
}

// view is what the choice knows of one member.
type view struct {
	up       bool
	warm     bool // listed (or loading through the pool)
	measured bool // the device was read
	loading  int  // loads in flight through the pool
	free     uint64
	side     Side // what a refusal says of it
	plan     plan // a dry run's plan, when room must be made
}

// plan is what the client's EnsureFree would do on a member's device.
type plan struct {
	ok      bool     // the room can be made
	models  []string // the models it would unload
	cost    uint64   // their bytes: what must be loaded again
	usesOwn bool     // made without KeepOwn: it may unload the client's own leased models
}

// choose places a model needing need bytes; ok is false when no member
// can take it. Warm first (the warm member with the most free memory),
// then room (most free, then fewer loads in flight, then the first), then
// making room where the plan spares the client's own leased models, then
// where it unloads the fewest bytes (then fewer models, then the first).
func choose(vs []view, need uint64) (i int, reason PlaceReason, ok bool) {
	best := -1
	for i, v := range vs {
		if v.up && v.warm && (best < 0 || v.free > vs[best].free) {
			best = i
		}
	}
	if best >= 0 {
		return best, PlaceWarm, true
	}
	for i, v := range vs {
		if !v.up || !v.measured || v.free < need {
			continue
		}
		if best < 0 || v.free > vs[best].free || (v.free == vs[best].free && v.loading < vs[best].loading) {
			best = i
		}
	}
	if best >= 0 {
		return best, PlaceRoom, true
	}
	for i, v := range vs {
		if v.up && v.measured && v.plan.ok && (best < 0 || cheaper(v.plan, vs[best].plan)) {
			best = i
		}
	}
	if best >= 0 {
		return best, PlaceMadeRoom, true
	}
	return -1, "", false
}

func cheaper(a, b plan) bool {
	if a.usesOwn != b.usesOwn {
		return !a.usesOwn
	}
	return a.cost < b.cost || (a.cost == b.cost && len(a.models) < len(b.models))
}

// placeModel chooses the member a call on model goes to, making room there
// when no member has it, and counts the call in flight there (the caller
// ends it). The model is estimated only when no member is warm.
//
// It cannot deadlock on the room-making it asks of the client: the
// placement turn it holds is taken by no request that room-making sends
// (listings, /api/show, unloads, each bounded by the answer timeout), and
// KeepInUse keeps every model a call of this client runs on when the plan
// is made. A call on a model the plan unloads, begun after the plan,
// waits for the turn before its request goes out: the unload does not wait
// for it (EnsureRequest.KeepInUse waits only for calls sent), and it is
// placed once the turn is free (TestPoolCallOnAPlannedVictimDoesNotStall).
//
// A load it places (by room, or after making room) is reserved host-wide
// on the member's device until the member answers (the returned Lease,
// nil for a warm model or where leases are off): another program's
// hand-over on the host counts the load before the member's runner
// shows it, as it counts a budget's admitted load.
func (t *transport) placeModel(ctx context.Context, model string, numCtx int) (*member, *vramguard.Lease, error) {
	const op = "place"
	select {
	case t.place <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, &vramguard.Error{Op: op, Model: model, Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	defer func() { <-t.place }()
	key := vramguard.NormalizeModelName(model)
	vs := t.survey(ctx, key)
	if ctx.Err() != nil {
		return nil, nil, &vramguard.Error{Op: op, Model: model, Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	if i, reason, ok := choose(vs, 0); ok && reason == PlaceWarm {
		m, err := t.placed(ctx, Placement{Model: model, Member: t.members[i].name, Device: i, Reason: reason, Free: vs[i].free})
		return m, nil, err
	}
	need, err := t.need(ctx, vs, model, numCtx)
	if err != nil {
		return nil, nil, err
	}
	t.honourReservations(ctx, vs)
	if _, _, ok := choose(vs, need); !ok {
		// Room-making spares the client's own leased models (its phases')
		// while another member's room can be made without them.
		if !t.plans(ctx, vs, need, true) {
			t.plans(ctx, vs, need, false)
		}
	}
	i, reason, ok := choose(vs, need)
	if !ok {
		sides := make([]Side, len(vs))
		kind := vramguard.KindUnavailable
		for j, v := range vs {
			sides[j] = v.side
			sides[j].Need = need
			if v.up {
				kind = vramguard.KindOutOfMemory
			}
		}
		return nil, nil, &vramguard.Error{Op: op, Model: model, Kind: kind, Err: &NoRoomError{Model: model, Need: need, Members: sides}}
	}
	pl := Placement{Model: model, Member: t.members[i].name, Device: i, Reason: reason, Need: need, Free: vs[i].free}
	var res *vramguard.Lease
	if reason == PlaceMadeRoom {
		var evicted []string
		evicted, res, err = t.makeRoom(ctx, t.members[i], model, need, !vs[i].plan.usesOwn)
		if err != nil {
			return nil, nil, err
		}
		pl.Evicted = evicted
	} else if res, err = t.reserveLoad(ctx, t.members[i], model, need); err != nil {
		return nil, nil, err
	}
	m, err := t.placed(ctx, pl)
	if err != nil {
		t.endLoadReservation(res, model)
		return nil, nil, err
	}
	return m, res, nil
}

// loadReservation is the reservation a load placed by the pool holds:
// its bytes, for its model, until the member answers (the library's
// default TTL bounds one whose release failed).
func (t *transport) loadReservation(model string) *vramguard.ReserveOptions {
	if t.leasesOff {
		return nil
	}
	key := vramguard.NormalizeModelName(model)
	return &vramguard.ReserveOptions{For: "load of " + key + " placed by a pool", Load: key}
}

// reserveLoad reserves need bytes on m's device for the load of model the
// pool placed there by room. Another holder that took the room since the
// survey refuses the placement with the *RoomError of the reservation's
// reading, under the lease directory's lock; a reservation that cannot be
// taken for any other reason (the lease directory refused) leaves the
// load placed without one, logged.
func (t *transport) reserveLoad(ctx context.Context, m *member, model string, need uint64) (*vramguard.Lease, error) {
	opts := t.loadReservation(model)
	if opts == nil {
		return nil, nil
	}
	res, err := t.c.Reserve(ctx, m.index, need, *opts)
	var re *vramguard.RoomError
	switch {
	case errors.As(err, &re):
		return nil, &vramguard.Error{Op: "place", Model: model, Kind: vramguard.KindOutOfMemory, Err: &MemberError{Member: m.name, Err: err}}
	case err != nil && vramguard.KindOf(err) == vramguard.KindCanceled:
		return nil, err
	case err != nil:
		t.log.Warn("pool: load placed without a host-wide reservation", "model", model, "member", m.name, "err", err)
		return nil, nil
	}
	return res, nil
}

// endLoadReservation releases a placed load's reservation (nil: none).
func (t *transport) endLoadReservation(res *vramguard.Lease, model string) {
	if res == nil {
		return
	}
	if err := res.Release(); err != nil {
		t.log.Warn("pool: a load's reservation was not released; it ends at its TTL", "model", model, "err", err)
	}
}

// honourReservations takes other holders' reservations on each measured
// member's device (vramguard.OllamaClient.Reserve, another program's
// hand-over) out of its free memory, as the pool client's own view of the
// devices shows them (the snapshot of a dry run of its EnsureFree), so
// that a load is never placed into bytes kept for someone else. A view
// that cannot be read leaves the members as surveyed: the dry runs of
// room-making, and the member's own admission, still honour them.
func (t *transport) honourReservations(ctx context.Context, vs []view) {
	first := slices.IndexFunc(vs, func(v view) bool { return v.up && v.measured })
	if first < 0 {
		return
	}
	rep, _ := t.c.EnsureFree(ctx, vramguard.EnsureRequest{Device: first, DryRun: true})
	if rep == nil || rep.Snapshot == nil {
		return
	}
	for i := range vs {
		d := rep.Snapshot.Device(i)
		if d == nil || !vs[i].measured || len(d.Reserved) == 0 {
			continue
		}
		var left uint64
		for _, r := range d.Reserved {
			left += r.Bytes - min(r.Taken, r.Bytes)
		}
		vs[i].free -= min(vs[i].free, left)
		vs[i].side.Free = vs[i].free
		if d.ProcessesKnown {
			vs[i].side.Holders = d.Holders()
		}
	}
}

// survey lists every member that answers and reads its device, side by
// side, each within the answer timeout.
func (t *transport) survey(ctx context.Context, key string) []view {
	vs := make([]view, len(t.members))
	var wg sync.WaitGroup
	for i, m := range t.members {
		vs[i].side = Side{Member: m.name, Device: i}
		wg.Go(func() { t.surveyOne(ctx, m, key, &vs[i]) })
	}
	wg.Wait()
	return vs
}

func (t *transport) surveyOne(ctx context.Context, m *member, key string, v *view) {
	if !t.ready(ctx, m) {
		v.side.Err = &MemberError{Member: m.name, Err: fmt.Errorf("%w: down, it has not answered since", ErrUnreachable)}
		return
	}
	actx, cancel := context.WithTimeoutCause(ctx, t.answerTimeout,
		fmt.Errorf("pool member %s did not answer within %v", m.name, t.answerTimeout))
	defer cancel()
	if _, err := m.list(actx); err != nil {
		switch {
		case ctx.Err() != nil:
			v.side.Err = context.Cause(ctx)
		case actx.Err() != nil:
			t.down(m, context.Cause(actx))
			v.side.Err = &MemberError{Member: m.name, Err: fmt.Errorf("%w: %v", ErrUnreachable, context.Cause(actx))}
		default:
			t.failed(m, err)
			v.side.Err = &MemberError{Member: m.name, Err: err}
			if connFailed(err) {
				v.side.Err = &MemberError{Member: m.name, Err: fmt.Errorf("%w: %v", ErrUnreachable, err)}
			}
		}
		return
	}
	v.up = true
	v.warm = m.holds(key)
	d, err := m.device1(actx)
	if err != nil {
		// Unmeasured: still warm, never placed by room.
		v.side.Err = &MemberError{Member: m.name, Err: err}
		return
	}
	v.measured = true
	m.mu.Lock()
	var pending uint64
	for _, b := range m.pending {
		pending += b
	}
	v.loading = len(m.pending)
	m.mu.Unlock()
	v.free = d.Free - min(d.Free, pending)
	v.side.Free, v.side.Total = v.free, d.Total
	if d.ProcessesKnown {
		v.side.Holders = d.Holders()
	}
}

// device1 reads the member's own device.
func (m *member) device1(ctx context.Context) (*vramguard.DeviceMemory, error) {
	snap, err := m.vram.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	d := snap.Device(m.device)
	if d == nil {
		return nil, fmt.Errorf("the VRAM reader lists no device %d", m.device)
	}
	return d, nil
}

// need is the model's estimate (the client's EstimateModel, which asks
// the first member that answers) plus the headroom; 0 when no member
// answers: nothing can be placed.
func (t *transport) need(ctx context.Context, vs []view, model string, numCtx int) (uint64, error) {
	for _, v := range vs {
		if v.up {
			est, err := t.c.EstimateModel(ctx, model, numCtx)
			if err != nil {
				return 0, err
			}
			return uint64(max(est.Total, 0)) + t.headroom, nil
		}
	}
	return 0, nil
}

// plans asks the client's EnsureFree, as a dry run, what making room for
// need (plus the loads placed and not listed yet) would unload on each
// member's device, keeping the client's own leased models when keepOwn;
// a refusal is that member's side of the pool's. It reports whether a
// member's room can be made.
func (t *transport) plans(ctx context.Context, vs []view, need uint64, keepOwn bool) bool {
	any := false
	for i := range vs {
		v := &vs[i]
		if !v.up || !v.measured {
			continue
		}
		rq := t.roomRequest(t.members[i], need, true)
		rq.KeepOwn = keepOwn
		rep, err := t.c.EnsureFree(ctx, rq)
		if err != nil {
			v.plan = plan{}
			v.side.Room = roomOf(err)
			if v.side.Room == nil {
				v.side.Err = err
			}
			continue
		}
		any = true
		v.side.Room, v.side.Err = nil, nil
		v.plan = plan{ok: true, usesOwn: !keepOwn}
		sizes := map[string]uint64{}
		for _, r := range t.members[i].lastListing() {
			sizes[vramguard.NormalizeModelName(r.Model)] = uint64(max(r.SizeVRAM, 0))
		}
		for _, name := range rep.Plan {
			key := vramguard.NormalizeModelName(name)
			if b, ok := sizes[key]; ok {
				v.plan.models = append(v.plan.models, name)
				v.plan.cost += b
			}
		}
	}
	return any
}

func (t *transport) roomRequest(m *member, need uint64, dry bool) vramguard.EnsureRequest {
	m.mu.Lock()
	for _, b := range m.pending {
		need += b
	}
	m.mu.Unlock()
	return vramguard.EnsureRequest{Device: m.index, Bytes: need, DryRun: dry, KeepInUse: true}
}

// makeRoom makes room on m's device for model's load with the client's
// EnsureFree and returns the models it unloaded, verified, and the load's
// reservation: the room made becomes it in one step (EnsureRequest.
// Reservation), so no other holder's admission comes between.
func (t *transport) makeRoom(ctx context.Context, m *member, model string, need uint64, keepOwn bool) ([]string, *vramguard.Lease, error) {
	rq := t.roomRequest(m, need, false)
	rq.KeepOwn = keepOwn
	rq.Reservation = t.loadReservation(model)
	rep, err := t.c.EnsureFree(ctx, rq)
	var (
		evicted []string
		res     *vramguard.Lease
	)
	if rep != nil {
		res = rep.Reservation
		for _, r := range rep.Evicted {
			if r.Verified {
				evicted = append(evicted, r.Model)
			}
		}
	}
	if err != nil && rq.Reservation != nil && res == nil && vramguard.KindOf(err) == vramguard.KindUnavailable && rep != nil && rep.FreeAfter >= rq.Bytes+rq.Reserve {
		// The room is made; the reservation alone failed (the lease
		// directory refused): the load goes without one, as a load
		// placed by room does.
		t.log.Warn("pool: load placed without a host-wide reservation", "model", model, "member", m.name, "err", err)
		err = nil
	}
	if err != nil {
		t.endLoadReservation(res, model)
		return evicted, nil, &vramguard.Error{Op: "place", Kind: vramguard.KindOf(err), Err: &MemberError{Member: m.name, Err: err}}
	}
	return evicted, res, nil
}

// placed records and reports the decision, and counts the call in flight
// on the member (the caller ends it) before the next placement, which
// then finds the model warm there, not gone from a listing taken while
// it loads.
func (t *transport) placed(ctx context.Context, pl Placement) (*member, error) {
	m := t.members[pl.Device]
	key := vramguard.NormalizeModelName(pl.Model)
	m.mu.Lock()
	// Until a listing of the member says otherwise, the model counts as
	// resident there: if the member stops answering, an unload of it is
	// not verified by its absence from a listing that predates the load.
	m.seq++
	m.placed[key] = m.seq
	m.inflight[key]++
	if pl.Reason != PlaceWarm {
		m.pending[key] = pl.Need
	}
	m.mu.Unlock()
	if pl.Reason != PlaceWarm {
		t.log.Info("placed", "model", pl.Model, "member", m.name, "reason", string(pl.Reason), "need", pl.Need, "free", pl.Free, "evicted", pl.Evicted)
	}
	if r, ok := ctx.Value(placementsKey{}).(*placements); ok {
		r.mu.Lock()
		r.ps = append(r.ps, pl)
		r.mu.Unlock()
	}
	if t.onPlace != nil {
		t.onPlace(ctx, pl)
	}
	return m, nil
}

func roomOf(err error) *vramguard.RoomError {
	var re *vramguard.RoomError
	if errors.As(err, &re) {
		return re
	}
	return nil
}
