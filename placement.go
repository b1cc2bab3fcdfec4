package vramguard

// Where a pool loads a model: a pure decision over what each member's
// server lists and its device reports (pool.go gathers the facts and acts).

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// ErrNoPlacement is wrapped by a *PlacementError: no member of a pool
// could take the model.
var ErrNoPlacement = errors.New("no member of the pool can take the model")

// PlacementError says why no member could take a model: per member, the
// need, the free bytes and the holders of the rest. It is the cause of a
// KindOutOfMemory error (KindUnavailable when no member answers).
type PlacementError struct {
	Model   string
	Need    uint64 // estimate plus headroom
	Members []MemberRoom
}

// MemberRoom is one member's side of a PlacementError.
type MemberRoom struct {
	Member string
	Device int
	// Down is set when the member's server does not answer; Err when its
	// server's listing or its device could not be read.
	Down bool
	Err  error
	Free uint64
	// Holders is the device's memory by holder (DeviceMemory.Holders).
	Holders []MemoryHolder
	// Kept are the models room-making may not unload there: protected,
	// leased by another program, or in use through the pool.
	Kept []KeptModel
}

func (e *PlacementError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s needs %s", e.Model, vramFormatBytes(e.Need))
	for _, m := range e.Members {
		fmt.Fprintf(&b, "; %s (device %d): ", m.Member, m.Device)
		switch {
		case m.Down:
			b.WriteString("down")
			continue
		case m.Err != nil:
			fmt.Fprintf(&b, "%v", m.Err)
			continue
		}
		fmt.Fprintf(&b, "%s free", vramFormatBytes(m.Free))
		var held []string
		for _, h := range m.Holders {
			if h.Kind == HolderRunner || h.Kind == HolderOther {
				held = append(held, fmt.Sprintf("%s %s", h.Name, vramFormatBytes(h.Bytes)))
			}
		}
		if len(held) > 0 {
			fmt.Fprintf(&b, ", held by %s", strings.Join(held, ", "))
		}
		for _, k := range m.Kept {
			fmt.Fprintf(&b, ", %s kept (%s)", k.Model, keptWhy(k))
		}
	}
	return b.String()
}

func keptWhy(k KeptModel) string {
	switch {
	case k.Protected:
		return "protected"
	case len(k.Leases) > 0:
		return "leased by " + k.Leases[0].String()
	default:
		return "in use"
	}
}

// Unwrap returns ErrNoPlacement, and ErrLeased or ErrProtected when a kept
// model stood in the way.
func (e *PlacementError) Unwrap() []error {
	errs := []error{ErrNoPlacement}
	var kept []KeptModel
	for _, m := range e.Members {
		kept = append(kept, m.Kept...)
	}
	if len(kept) > 0 {
		errs = append(errs, (&RoomError{Kept: kept}).Unwrap()...)
	}
	return errs
}

// memberView is what the decision knows of one member.
type memberView struct {
	up      bool
	warm    bool   // listed (or loading through the pool)
	free    uint64 // the device's free bytes, less loads placed and not listed yet
	loading int    // loads in flight through the pool
	// evictable are the runners on the device room-making may unload,
	// with the bytes the device shows for each.
	evictable []victim
	measured  bool // the device was read
}

type victim struct {
	model string
	bytes uint64
	own   bool // leased by the pool client itself (its phases, HoldModel)
}

// decision is where a model goes: member, why, and what to unload first.
type decision struct {
	member int
	reason PlaceReason
	evict  []string
}

// decide places a model needing need bytes (estimate plus headroom) on one
// of views; ok is false when none can take it. Warm first (the warm member
// with the most free memory), then room (most free, then fewer loads in
// flight, then the first listed), then making room where the bytes to
// unload are fewest (then fewer models, then the first listed).
func decide(views []memberView, need uint64) (d decision, ok bool) {
	best := -1
	for i, v := range views {
		if v.up && v.warm && (best < 0 || v.free > views[best].free) {
			best = i
		}
	}
	if best >= 0 {
		return decision{member: best, reason: PlaceWarm}, true
	}
	for i, v := range views {
		if !v.up || !v.measured || v.free < need {
			continue
		}
		if best < 0 || v.free > views[best].free || (v.free == views[best].free && v.loading < views[best].loading) {
			best = i
		}
	}
	if best >= 0 {
		return decision{member: best, reason: PlaceRoom}, true
	}
	// The pool's own phases' models go last: another member's room is
	// made first, as a phase keeps each model on its member.
	for _, own := range []bool{false, true} {
		var bestCost uint64
		var bestEvict []string
		for i, v := range views {
			if !v.up || !v.measured {
				continue
			}
			evict, cost, enough := victimsFor(v, need, own)
			if !enough {
				continue
			}
			if best < 0 || cost < bestCost || (cost == bestCost && len(evict) < len(bestEvict)) {
				best, bestCost, bestEvict = i, cost, evict
			}
		}
		if best >= 0 {
			return decision{member: best, reason: PlaceMadeRoom, evict: bestEvict}, true
		}
	}
	return decision{}, false
}

// victimsFor picks, from the member's evictable runners (the pool's own
// leased ones only with own), the set whose bytes reach what is missing at
// the least cost: the smallest single runner that is enough alone, else
// the largest first until enough.
func victimsFor(v memberView, need uint64, own bool) (evict []string, cost uint64, enough bool) {
	missing := need - min(need, v.free)
	vs := slices.DeleteFunc(slices.Clone(v.evictable), func(x victim) bool { return x.own && !own })
	slices.SortFunc(vs, func(a, b victim) int { return cmp.Or(cmp.Compare(a.bytes, b.bytes), cmp.Compare(a.model, b.model)) })
	for _, x := range vs {
		if x.bytes >= missing {
			return []string{x.model}, x.bytes, true
		}
	}
	for i := len(vs) - 1; i >= 0 && cost < missing; i-- {
		evict = append(evict, vs[i].model)
		cost += vs[i].bytes
	}
	return evict, cost, cost >= missing
}
