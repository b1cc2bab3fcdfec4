package vramguard

// Where a pool loads a model: a pure decision over what each member's
// server lists and its device reports (pool.go gathers the facts and acts).

// PlaceReason says why a pool chose a member for a model.
type PlaceReason string

// The reasons, in the order a pool tries them.
const (
	// PlaceWarm: the member's server lists the model (or is loading it
	// for this pool): no load. Of several such members, the one with the
	// most free memory.
	PlaceWarm PlaceReason = "warm"
	// PlaceRoom: of the members whose device has room for the model's
	// estimate plus PoolOptions.Headroom, the one with the most free
	// memory (ties: fewer loads in flight through the pool).
	PlaceRoom PlaceReason = "room"
	// PlaceMadeRoom: no device had room; models were unloaded, verified,
	// on the member where that cost least (the fewest bytes to load
	// again): never a protected model, one leased by another program or
	// one in use, and the pool's own leased models (its phases') only when
	// no member's room can be made without them.
	PlaceMadeRoom PlaceReason = "made room"
)

// Placement is a pool's decision for a call: Generation.Placement,
// Hooks.OnPlace and an INFO log line.
type Placement struct {
	Model  string
	Member string // PoolMember.Name
	Device int    // PoolMember.Device
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

// memberView is what the decision knows of one member.
type memberView struct {
	up      bool
	warm    bool // listed (or loading through the pool)
	loading int  // loads in flight through the pool
	// room is the member's device as room-making sees it (room.go), its
	// free bytes less the loads placed and not listed yet.
	room     roomView
	measured bool // the device was read
}

// decision is where a model goes: member, why, and what the plan unloads.
type decision struct {
	member int
	reason PlaceReason
	evict  []string
}

// decide places a model needing need bytes (estimate plus headroom) on one
// of views; ok is false when none can take it. Warm first (the warm member
// with the most free memory), then room (most free, then fewer loads in
// flight, then the first listed), then making room where room-making's
// plan (planRoom, the one victim policy) spares the pool's own leased
// models, then where it unloads the fewest bytes (then fewer models, then
// the first listed). The pool keeps only this choice of member; the plan
// and its steps are room-making's.
func decide(views []memberView, need uint64) (d decision, ok bool) {
	best := -1
	for i, v := range views {
		if v.up && v.warm && (best < 0 || v.room.free > views[best].room.free) {
			best = i
		}
	}
	if best >= 0 {
		return decision{member: best, reason: PlaceWarm}, true
	}
	for i, v := range views {
		if !v.up || !v.measured || v.room.free < need {
			continue
		}
		if best < 0 || v.room.free > views[best].room.free || (v.room.free == views[best].room.free && v.loading < views[best].loading) {
			best = i
		}
	}
	if best >= 0 {
		return decision{member: best, reason: PlaceRoom}, true
	}
	var bestPlan roomPlan
	for i, v := range views {
		if !v.up || !v.measured {
			continue
		}
		p := planRoom(v.room, need)
		if !p.enough {
			continue
		}
		if best < 0 || cheaper(p, bestPlan) {
			best, bestPlan = i, p
		}
	}
	if best >= 0 {
		return decision{member: best, reason: PlaceMadeRoom, evict: bestPlan.names()}, true
	}
	return decision{}, false
}

// cheaper orders two members' plans: one that spares the pool's own
// leased models first (a phase keeps each model on its member), then
// fewer bytes to load again, then fewer models.
func cheaper(a, b roomPlan) bool {
	if a.usesOwn != b.usesOwn {
		return !a.usesOwn
	}
	return a.cost < b.cost || (a.cost == b.cost && len(a.steps) < len(b.steps))
}
