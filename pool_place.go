package vramguard

// The pool gathers the facts placement.go decides on, and acts on the
// decision: room-making on the chosen member, the report.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
)

// poolPlaceOp is the Op of a pool's placement errors.
const poolPlaceOp = "place"

// placeModel chooses the member a call on model goes to, making room there
// when the decision says so. The model is estimated only when no member
// is warm.
func (p *pool) placeModel(ctx context.Context, model string, numCtx int) (*poolMember, Placement, error) {
	const op = poolPlaceOp
	select {
	case p.place <- struct{}{}:
	case <-ctx.Done():
		return nil, Placement{}, newError(op, model, KindCanceled, context.Cause(ctx))
	}
	defer func() { <-p.place }()
	views, rooms := p.survey(ctx, NormalizeModelName(model))
	if ctx.Err() != nil {
		return nil, Placement{}, newError(op, model, KindCanceled, context.Cause(ctx))
	}
	if d, ok := decide(views, 0); ok && d.reason == PlaceWarm {
		return p.placed(ctx, d, model, 0, views)
	}
	need, err := p.need(ctx, views, model, numCtx)
	if err != nil {
		return nil, Placement{}, err
	}
	d, ok := decide(views, need)
	if ok && d.reason == PlaceMadeRoom {
		evicted, err := p.makeRoom(ctx, p.members[d.member], need)
		if err != nil {
			return nil, Placement{}, err
		}
		d.evict = evicted
	}
	if ok {
		return p.placed(ctx, d, model, need, views)
	}
	for i := range rooms {
		rooms[i].Need = need
	}
	perr := &RoomError{Model: model, Need: need, Devices: rooms}
	kind := KindOutOfMemory
	if !anyUp(views) {
		kind = KindUnavailable
	}
	return nil, Placement{}, newError(op, model, kind, perr)
}

// survey lists every member that is up and reads its device: what the
// decision knows of each (views), and what a refusal says of it (rooms).
func (p *pool) survey(ctx context.Context, key string) ([]memberView, []RoomError) {
	views := make([]memberView, len(p.members))
	rooms := make([]RoomError, len(p.members))
	var wg sync.WaitGroup
	for i, m := range p.members {
		rooms[i] = RoomError{Member: m.name, Device: m.device}
		if !m.isUp() {
			rooms[i].Err = newError(poolPlaceOp, "", KindUnavailable, errors.New("down: it did not answer, and has not answered a probe since"))
			continue
		}
		wg.Go(func() { p.surveyOne(ctx, m, key, &views[i], &rooms[i]) })
	}
	wg.Wait()
	return views, rooms
}

// surveyOne lists one member and reads its device, within the pool's
// answer timeout: a member whose server does not answer in time is down.
func (p *pool) surveyOne(ctx context.Context, m *poolMember, key string, v *memberView, room *RoomError) {
	actx, cancel := context.WithTimeoutCause(ctx, p.answerTimeout,
		fmt.Errorf("pool member %s did not answer within %v", m.name, p.answerTimeout))
	defer cancel()
	listed, err := m.list(actx, true)
	if err == nil {
		// A device that does not answer in time leaves the member
		// unmeasured (room.Err says why): still warm, never placed by room.
		v.up = true
		v.warm = m.holds(key)
		p.measure(actx, m, listed, v, room)
		return
	}
	switch {
	case ctx.Err() != nil:
		room.Err = context.Cause(ctx)
	case actx.Err() != nil:
		p.down(m, context.Cause(actx))
		room.Err = newError(poolPlaceOp, "", KindUnavailable, context.Cause(actx))
	default:
		p.failed(m, err)
		room.Err = err
		if connFailed(err) {
			room.Err = newError(poolPlaceOp, "", KindUnavailable, err)
		}
	}
}

// need is the model's estimate, read from the first member that answers,
// plus the headroom (0 when no member answers: nothing can be placed).
func (p *pool) need(ctx context.Context, views []memberView, model string, numCtx int) (uint64, error) {
	for i, v := range views {
		if v.up {
			est, err := p.members[i].c.EstimateModel(ctx, model, numCtx)
			if err != nil {
				return 0, err
			}
			return uint64(max(est.Total, 0)) + p.headroom, nil
		}
	}
	return 0, nil
}

// measure fills in a member's device as room-making sees it (free
// memory less the loads placed and not listed yet, what may be unloaded
// there and what is kept), from its device and its listing.
func (p *pool) measure(ctx context.Context, m *poolMember, listed []api.ProcessModelResponse, v *memberView, room *RoomError) {
	snap, err := m.vram.Snapshot(ctx)
	var d *DeviceMemory
	if err == nil {
		if d = snap.Device(m.device); d == nil {
			err = errors.New("the VRAM reader lists no such device")
		}
	}
	if err != nil {
		room.Err = err
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
	v.room = buildRoomView(snap, d, listed, p.rulesFor(m)(), nil)
	v.room.free -= min(v.room.free, pending)
	room.Free, room.Total, room.Holders, room.Kept = v.room.free, d.Total, v.room.holders, v.room.kept
}

// rulesFor are what keeps a model on member m from room-making: the
// pool's protected models, leases of other programs (other pools',
// whose leases name their pool's address, included), the pool's
// requests in flight there; the pool's own leases go last.
func (p *pool) rulesFor(m *poolMember) func() roomRules {
	return func() roomRules {
		m.mu.Lock()
		inUse := make(map[string]bool, len(m.inflight))
		for k, n := range m.inflight {
			inUse[k] = n > 0
		}
		m.mu.Unlock()
		return roomRules{protected: m.c.isProtected, inUse: inUse, own: p.c.ownLeased(),
			leases: append(m.c.heldLeases(""), p.c.heldLeases("")...)}
	}
}

// makeRoom makes room for need bytes (plus the loads placed on m and not
// on the device yet) on m's device through room-making (room.go), with
// the pool's rules, and returns the models it unloaded. The pool client
// records the evictions as its own, so that a model's next load names
// the cause (ReloadEvicted).
func (p *pool) makeRoom(ctx context.Context, m *poolMember, need uint64) ([]string, error) {
	m.mu.Lock()
	for _, b := range m.pending {
		need += b
	}
	m.mu.Unlock()
	rep, err := m.c.ensureFreeRules(ctx, EnsureRequest{Device: m.device, Bytes: need},
		unloadMode{keepLoads: true, cause: CauseBudget}, p.rulesFor(m), false)
	var evicted []string
	if rep != nil {
		for _, r := range rep.Evicted {
			if r.Verified && r.WasLoaded {
				p.c.churn.unloaded(r.Model, CauseBudget, time.Now())
			}
			if r.Verified {
				evicted = append(evicted, r.Model)
			}
		}
	}
	var re *RoomError
	if errors.As(err, &re) {
		re.Member = m.name
	}
	return evicted, err
}

// placed records and reports the decision, and counts the call in flight
// on the member (the caller ends it) before the next placement, which
// then finds the model warm there, not gone from a listing taken while
// it loads.
func (p *pool) placed(ctx context.Context, d decision, model string, need uint64, views []memberView) (*poolMember, Placement, error) {
	m := p.members[d.member]
	pl := Placement{Model: model, Member: m.name, Device: m.device, Reason: d.reason, Need: need, Free: views[d.member].room.free, Evicted: d.evict}
	key := NormalizeModelName(model)
	m.mu.Lock()
	// Until a listing of the member says otherwise, the model counts as
	// resident there: if the member stops answering, an unload of it is
	// not verified by its absence from a listing that predates the load
	// or was taken while it loaded.
	m.placed[key] = true
	m.inflight[key]++
	if d.reason != PlaceWarm {
		m.pending[key] = need
	}
	m.mu.Unlock()
	if d.reason != PlaceWarm {
		p.log.Info("placed", "model", model, "member", m.name, "reason", string(d.reason), "need", need, "free", pl.Free, "evicted", d.evict)
	}
	hookCtx(p.c, p.c.opts.Hooks.OnPlace, ctx, pl)
	return m, pl, nil
}

func anyUp(vs []memberView) bool {
	for _, v := range vs {
		if v.up {
			return true
		}
	}
	return false
}

// MemberStatus is one member of a pool, as OllamaClient.Members reports it.
type MemberStatus struct {
	Name   string
	Host   string
	Device int
	// Up is false while the member's server does not answer (it is asked
	// again every PoolOptions.ProbeInterval).
	Up bool
	// Models are the models the member listed last, and the ones placed
	// there that no listing has shown or ruled out yet (a load in flight;
	// while the member is down, every one placed there since it last
	// answered); InFlight the pool's requests on each model there now.
	Models   []string
	InFlight map[string]int
}

// Members reports the members of a pool client (NewPool) in their order;
// nil for a client of one server. It reads nothing from the servers.
func (c *OllamaClient) Members() []MemberStatus {
	if c.pool == nil {
		return nil
	}
	out := make([]MemberStatus, 0, len(c.pool.members))
	for _, m := range c.pool.members {
		m.mu.Lock()
		st := MemberStatus{Name: m.name, Host: m.c.host, Device: m.device, Up: m.up, InFlight: maps.Clone(m.inflight)}
		for _, r := range m.lastLocked() {
			st.Models = append(st.Models, NormalizeModelName(r.Model))
		}
		m.mu.Unlock()
		out = append(out, st)
	}
	return out
}

// ownLeased is the set of models (normalized) this client holds leases on:
// its phases' and HoldModel's.
func (c *OllamaClient) ownLeased() map[string]bool {
	c.leases.mu.Lock()
	defer c.leases.mu.Unlock()
	out := make(map[string]bool, len(c.leases.held))
	for l := range c.leases.held {
		out[NormalizeModelName(l.info.Model)] = true
	}
	return out
}
