package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
)

// admitPoll is how often a load kept out by leases looks again while it
// waits (-admit-wait).
const admitPoll = 250 * time.Millisecond

// verdict is the admission's answer for one request.
type verdict struct {
	load       bool     // the model is not resident: the request loads it
	cause      string   // why it was absent (a load)
	causeBy    string   // who or what made it leave
	checked    []string // what the admission checked
	notChecked []string // what it could not check, and why
	made       []string // what it unloaded to make room, verified
	refusal    *refusal
	unlock     func() // releases the admission lock (a load); nil otherwise
	unknown    bool   // the server does not have the model (it answers 404 itself)
	// need is the load's estimate when memory was checked (0 otherwise):
	// what forward reserves host-wide until the load is answered.
	need uint64
}

func (v *verdict) summary() string {
	if v.unknown {
		return "model not found: nothing admitted"
	}
	if !v.load {
		return "resident"
	}
	s := "load; checked: " + orNone(v.checked)
	if len(v.notChecked) > 0 {
		s += "; not checked: " + strings.Join(v.notChecked, ", ")
	}
	if len(v.made) > 0 {
		s += "; unloaded to make room: " + strings.Join(v.made, ", ")
	}
	return s
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

// refusal is the 503's body: the model, why, and the blockers, as
// llama-swap's lease refusals name them.
type refusal struct {
	Error      string    `json:"error"`
	Model      string    `json:"model"`
	Reason     string    `json:"reason"` // "leased", "reserved", "no slot", "no room", "in use", "failed"
	Blockers   []blocker `json:"blockers"`
	RetryAfter float64   `json:"retry_after_seconds"`
	// RetryAfterKnown is false when no blocker says when it ends: the
	// Retry-After is the gate's -retry-after.
	RetryAfterKnown bool     `json:"retry_after_known"`
	Need            *uint64  `json:"need_bytes,omitempty"`
	Free            *uint64  `json:"free_bytes,omitempty"`
	Checked         []string `json:"checked"`
	NotChecked      []string `json:"not_checked,omitempty"`
	status          int
	retry           time.Duration
}

// blocker is one thing that keeps a load out.
type blocker struct {
	Kind  string `json:"kind"` // "lease", "protected", "in use", "holder", "tenant"
	Model string `json:"model,omitempty"`
	// Holder names who: a lease's program and pid (and, for a lease taken
	// through the gate, the HTTP client that took it), a process's command.
	Holder string     `json:"holder,omitempty"`
	PID    int        `json:"pid,omitempty"`
	Until  *time.Time `json:"until,omitempty"`
	Bytes  uint64     `json:"bytes,omitempty"`
}

// admit decides whether a request for model may go on. A request for a
// resident model always may. A load is checked against Ollama's slots
// (-max-loaded) and, with a GPU reader, the device's memory; each way it
// may make room (verified unloads of idle, unleased, unprotected models),
// wait for leases (-admit-wait) or refuse. dry answers without changing
// anything and without taking the admission lock.
func (g *gate) admit(ctx context.Context, model string, numCtx int, client string, dry bool) *verdict {
	name := vramguard.NormalizeModelName(model)
	v := &verdict{}
	resident, err := g.resident(ctx)
	if err != nil {
		return &verdict{refusal: failed(name, "Ollama's /api/ps", err)}
	}
	if slices.Contains(resident, name) {
		return v
	}
	if !dry {
		g.admitMu.Lock()
		v.unlock = g.admitMu.Unlock
		defer func() {
			// A panic below (net/http recovers it) must not leave every
			// later load waiting for the lock.
			if r := recover(); r != nil {
				v.unlock()
				panic(r)
			}
		}()
		// Another load may have landed while this one waited its turn.
		if resident, err = g.resident(ctx); err != nil {
			v.unlock()
			return &verdict{refusal: failed(name, "Ollama's /api/ps", err)}
		}
		if slices.Contains(resident, name) {
			v.unlock()
			return &verdict{}
		}
	}
	// A model the server does not have loads nothing: Ollama answers 404
	// itself, and no room is made for it. With a GPU reader the estimate
	// the memory check needs is that look (one /api/show, made once per
	// admission, not once per look while it waits for leases).
	var est *vramguard.ModelEstimate
	var err2 error
	if g.reader != nil {
		est, err2 = g.client.EstimateModel(ctx, name, numCtx)
	} else {
		_, err2 = g.client.API().Show(ctx, &api.ShowRequest{Model: name})
	}
	if err2 != nil {
		if v.unlock != nil {
			v.unlock()
		}
		var se api.StatusError
		if vramguard.KindOf(err2) == vramguard.KindNotFound || errors.As(err2, &se) && se.StatusCode == http.StatusNotFound {
			return &verdict{unknown: true}
		}
		return &verdict{refusal: failed(name, "the model's /api/show", err2)}
	}
	v.load = true
	v.cause, v.causeBy = g.causeOf(name)
	deadline := time.Now().Add(g.cfg.admitWait)
	for {
		ref := g.check(ctx, v, name, est, client, resident, dry)
		if ref == nil {
			return v
		}
		if ref.Reason != "leased" || !time.Now().Before(deadline) || dry {
			if v.unlock != nil {
				v.unlock()
			}
			v.refusal = ref
			return v
		}
		select {
		case <-ctx.Done():
			if v.unlock != nil {
				v.unlock()
			}
			v.refusal = ref
			return v
		case <-time.After(min(admitPoll, time.Until(deadline))):
		}
		v.checked, v.notChecked, v.made = nil, nil, nil
		if resident, err = g.resident(ctx); err != nil {
			v.unlock()
			return &verdict{refusal: failed(name, "Ollama's /api/ps", err)}
		}
		if slices.Contains(resident, name) {
			v.unlock()
			return &verdict{}
		}
	}
}

// check runs the admission's checks once; nil means admitted.
// est is the model's estimate, nil without a GPU reader.
func (g *gate) check(ctx context.Context, v *verdict, name string, est *vramguard.ModelEstimate, client string, resident []string, dry bool) *refusal {
	if g.cfg.maxLoaded > 0 {
		v.checked = append(v.checked, "slots")
		if len(resident) >= g.cfg.maxLoaded {
			if ref := g.freeSlot(ctx, v, name, client, resident, dry); ref != nil {
				return ref
			}
		}
	} else {
		v.notChecked = append(v.notChecked, "slots (-max-loaded not set: Ollama's own limit decides what the load evicts)")
	}
	if g.reader == nil {
		v.notChecked = append(v.notChecked, "memory (no GPU reader)", "reservations (no GPU reader: they keep measured memory)")
		return nil
	}
	v.checked = append(v.checked, "memory", "reservations")
	v.need = uint64(est.Total)
	req := vramguard.EnsureRequest{
		Device:    g.cfg.device,
		Bytes:     uint64(est.Total),
		Reserve:   g.cfg.reserve,
		DryRun:    dry || !g.cfg.makeRoom,
		KeepOwn:   true, // the gate's own leases are HTTP clients': kept as any other's
		KeepInUse: true,
	}
	if !req.DryRun {
		// Room-making keeps the gate's own client's generations only:
		// a plan that would unload a model the gate is forwarding a
		// request on is refused instead (it would wait for that request,
		// or cut it).
		plan := req
		plan.DryRun = true
		rep, err := g.client.EnsureFree(ctx, plan)
		if err != nil {
			return g.roomRefusal(name, err, v)
		}
		var busy []blocker
		for _, p := range rep.Plan {
			if n := g.inUse(p); n > 0 {
				busy = append(busy, blocker{Kind: "in use", Model: vramguard.NormalizeModelName(p), Holder: fmt.Sprintf("%d requests through the gate", n)})
			}
		}
		if len(busy) > 0 {
			ref := &refusal{Model: name, Reason: "in use", status: http.StatusServiceUnavailable, Blockers: busy,
				Checked: v.checked, NotChecked: v.notChecked}
			ref.Error = fmt.Sprintf("vramgate: the room for %s needs models that requests through the gate are using: %s", name, describe(busy))
			ref.setRetry(0, g.cfg.retryAfter)
			return ref
		}
		if len(rep.Plan) == 0 {
			return nil // the room is there: the real call would read the device again to do nothing
		}
	}
	rep, err := g.client.EnsureFree(ctx, req)
	if err != nil {
		return g.roomRefusal(name, err, v)
	}
	if req.DryRun && len(rep.Plan) > 0 {
		if !g.cfg.makeRoom {
			// The room is there only if something goes first, and the
			// gate may not make it: Ollama would evict on its own, or fail.
			free := rep.FreeBefore
			need := uint64(est.Total) + g.cfg.reserve
			ref := &refusal{Model: name, Reason: "no room", status: http.StatusServiceUnavailable, Need: &need, Free: &free,
				Checked: v.checked, NotChecked: v.notChecked, Blockers: []blocker{}}
			for _, p := range rep.Plan {
				ref.Blockers = append(ref.Blockers, blocker{Kind: "would unload", Model: p})
			}
			if rep.Snapshot != nil {
				if dev := rep.Snapshot.Device(g.cfg.device); dev != nil {
					ref.Blockers = append(ref.Blockers, holderBlockers(dev.Holders())...)
					ref.Blockers = append(ref.Blockers, reservationBlockers(dev.Reserved)...)
				}
			}
			ref.Blockers = append(ref.Blockers, g.reserveBlocker()...)
			ref.Error = fmt.Sprintf("vramgate: %s needs %d bytes free on device %d, %d are: only unloading %s would make the room (vramgate -make-room lets the gate do it)",
				name, need, g.cfg.device, free, strings.Join(rep.Plan, ", "))
			ref.setRetry(0, g.cfg.retryAfter)
			return ref
		}
		for _, p := range rep.Plan {
			v.made = append(v.made, "would unload "+p)
		}
	}
	for _, e := range rep.Evicted {
		v.made = append(v.made, e.Model)
		g.noteGone(e.Model, client, "made room for "+name)
	}
	return nil
}

// freeSlot makes a slot for a load when -max-loaded models are resident:
// it unloads, verified, the first idle, unleased, unprotected model
// room-making would take (so that Ollama has nothing to evict on its own,
// leased models included), or refuses naming what keeps each resident
// model.
func (g *gate) freeSlot(ctx context.Context, v *verdict, name, client string, resident []string, dry bool) *refusal {
	rep, err := g.client.EnsureFree(ctx, vramguard.EnsureRequest{AllModels: true, DryRun: true, KeepOwn: true, KeepInUse: true})
	if err != nil {
		return g.roomRefusal(name, err, v)
	}
	var victims []string
	var keptHere []vramguard.KeptModel
	for _, p := range rep.Plan {
		if !slices.Contains(resident, vramguard.NormalizeModelName(p)) {
			continue
		}
		// The gate's own client is not kept by its own leases: the HTTP
		// clients' leases it holds keep their models here.
		if held := g.leases.infosOn(p); len(held) > 0 {
			keptHere = append(keptHere, vramguard.KeptModel{Model: vramguard.NormalizeModelName(p), Leases: held})
			continue
		}
		// KeepInUse knows the gate's own client's generations only: the
		// requests the gate forwards keep their models here.
		if g.inUse(p) > 0 {
			keptHere = append(keptHere, vramguard.KeptModel{Model: vramguard.NormalizeModelName(p), InUse: true})
			continue
		}
		victims = append(victims, p)
	}
	if len(victims) == 0 {
		ref := &refusal{Model: name, Reason: "no slot", status: http.StatusServiceUnavailable, Blockers: []blocker{}}
		leased := false
		rep.Kept = append(rep.Kept, keptHere...)
		for _, k := range keptHere {
			if len(k.Leases) > 0 && k.Leases[0].Until.After(time.Now()) && (rep.RetryAfter == 0 || time.Until(k.Leases[0].Until) < rep.RetryAfter) {
				rep.RetryAfter = time.Until(k.Leases[0].Until)
			}
		}
		for _, k := range rep.Kept {
			ref.Blockers = append(ref.Blockers, g.keptBlockers(k)...)
			leased = leased || len(k.Leases) > 0
		}
		if leased {
			ref.Reason = "leased"
		}
		if ref.Reason == "no slot" && slices.ContainsFunc(rep.Kept, func(k vramguard.KeptModel) bool { return k.InUse }) {
			ref.Reason = "in use"
		}
		ref.Error = fmt.Sprintf("vramgate: %s would need one of Ollama's %d slots (-max-loaded), and every resident model is kept: %s",
			name, g.cfg.maxLoaded, describe(ref.Blockers))
		ref.setRetry(rep.RetryAfter, g.cfg.retryAfter)
		ref.Checked, ref.NotChecked = v.checked, v.notChecked
		return ref
	}
	if dry {
		v.made = append(v.made, "would unload "+victims[0])
		return nil
	}
	if _, err := g.verifiedUnload(ctx, victims[0], "", "made a slot for "+name+" (client "+client+")"); err != nil {
		var le *vramguard.LeasedError
		if !errors.As(err, &le) {
			return failed(name, "the unload that makes a slot ("+victims[0]+")", err)
		}
		// A lease came between the plan and the unload: refused as any
		// leased slot is.
		k := vramguard.KeptModel{Model: le.Model, Leases: le.Leases}
		ref := &refusal{Model: name, Reason: "leased", status: http.StatusServiceUnavailable, Blockers: g.keptBlockers(k),
			Checked: v.checked, NotChecked: v.notChecked}
		ref.Error = fmt.Sprintf("vramgate: %s would need the slot of %s, which a lease keeps: %s", name, le.Model, describe(ref.Blockers))
		var until time.Duration
		for _, l := range le.Leases {
			if d := time.Until(l.Until); !l.Until.IsZero() && d > 0 && (until == 0 || d < until) {
				until = d
			}
		}
		ref.setRetry(until, g.cfg.retryAfter)
		return ref
	}
	v.made = append(v.made, victims[0])
	return nil
}

// roomRefusal turns room-making's error into the 503 (a *RoomError) or a
// failure.
func (g *gate) roomRefusal(name string, err error, v *verdict) *refusal {
	var re *vramguard.RoomError
	if !errors.As(err, &re) {
		if vramguard.KindOf(err) == vramguard.KindInvalidInput {
			return g.neverFits(name, err, v)
		}
		return failed(name, "room-making", err)
	}
	need, free := re.Need, re.Free
	ref := &refusal{Model: name, Reason: "no room", status: http.StatusServiceUnavailable, Blockers: []blocker{},
		Need: &need, Free: &free, Checked: v.checked, NotChecked: v.notChecked}
	leased := false
	for _, k := range re.Kept {
		ref.Blockers = append(ref.Blockers, g.keptBlockers(k)...)
		leased = leased || len(k.Leases) > 0
	}
	var busy *comfyui.BusyError
	if errors.As(err, &busy) {
		ref.Blockers = append(ref.Blockers, blocker{Kind: "tenant", Holder: fmt.Sprintf("%s, rendering prompt %s (%d in its queue)",
			comfyui.HolderName, busy.PromptID, busy.Queued)})
	}
	ref.Blockers = append(ref.Blockers, holderBlockers(re.Holders)...)
	ref.Blockers = append(ref.Blockers, reservationBlockers(re.Reserved)...)
	ref.Blockers = append(ref.Blockers, g.reserveBlocker()...)
	if len(re.Reserved) > 0 && !leased {
		ref.Reason = "reserved"
	}
	if leased {
		ref.Reason = "leased"
	}
	ref.Error = fmt.Sprintf("vramgate: no room to load %s: %v", name, err)
	ref.setRetry(re.RetryAfter, g.cfg.retryAfter)
	return ref
}

// neverFits is the refusal of a load the device cannot hold, with the
// gate's -reserve kept free, even empty: room-making refuses it as
// invalid input (its estimate and the reserve exceed the device's total);
// the reserve is named among the blockers when it is one.
func (g *gate) neverFits(name string, err error, v *verdict) *refusal {
	ref := &refusal{Model: name, Reason: "no room", status: http.StatusServiceUnavailable, Blockers: []blocker{},
		Checked: v.checked, NotChecked: v.notChecked}
	why := "no room to load " + name
	ref.Blockers = append(ref.Blockers, g.reserveBlocker()...)
	if g.cfg.reserve > 0 {
		why += fmt.Sprintf(" with the gate's -reserve of %d bytes kept free", g.cfg.reserve)
	}
	var ve *vramguard.Error
	detail := err
	if errors.As(err, &ve) && ve.Err != nil {
		detail = ve.Err
	}
	ref.Error = fmt.Sprintf("vramgate: %s: %s", why, oneLine(detail.Error()))
	ref.setRetry(0, g.cfg.retryAfter)
	return ref
}

// reserveBlocker names the gate's own -reserve among the blockers of a
// refusal for memory: the bytes it keeps free are part of what the load
// would need.
func (g *gate) reserveBlocker() []blocker {
	if g.cfg.reserve == 0 {
		return nil
	}
	return []blocker{{Kind: "reserve", Holder: "vramgate -reserve", Bytes: g.cfg.reserve}}
}

// holderBlockers names the device's other holders: processes that are
// not Ollama's runners (those are models, kept or planned), and memory no
// process accounts for.
func holderBlockers(hs []vramguard.MemoryHolder) []blocker {
	var bs []blocker
	for _, h := range hs {
		if h.Kind == vramguard.HolderFree || h.Kind == vramguard.HolderRunner {
			continue
		}
		if h.Kind == vramguard.HolderReserved {
			continue // reservationBlockers names them, with their end
		}
		bs = append(bs, blocker{Kind: "holder", Holder: cmp.Or(h.Name, string(h.Kind)), PID: int(h.PID), Bytes: h.Bytes})
	}
	return bs
}

// reservationBlockers names other holders' reservations on the device
// (vramguard.RoomError.Reserved, vramguard.DeviceMemory.Reserved): who
// holds each, for whom, what it has left and until when, whether or not
// the reader lists processes.
func reservationBlockers(rs []vramguard.LeaseInfo) []blocker {
	var bs []blocker
	for _, r := range rs {
		u := r.Until
		bs = append(bs, blocker{Kind: "reservation", Holder: r.String(), PID: r.PID, Bytes: r.Bytes - min(r.Taken, r.Bytes), Until: &u})
	}
	return bs
}

// keptBlockers names what keeps one model: each lease (with the HTTP
// client of a lease taken through the gate), protection, use.
func (g *gate) keptBlockers(k vramguard.KeptModel) []blocker {
	var bs []blocker
	for _, l := range k.Leases {
		b := blocker{Kind: "lease", Model: k.Model, Holder: l.Program + " (pid " + strconv.Itoa(l.PID) + ")", PID: l.PID}
		if l.Note != "" {
			b.Holder += ", " + l.Note
		}
		if l.PID == os.Getpid() {
			if h := g.leases.holderOf(l.ID); h != "" {
				b.Holder = "vramgate lease of " + h
			}
		}
		if !l.Until.IsZero() {
			u := l.Until
			b.Until = &u
		}
		bs = append(bs, b)
	}
	if k.Protected {
		bs = append(bs, blocker{Kind: "protected", Model: k.Model})
	}
	if k.InUse {
		b := blocker{Kind: "in use", Model: k.Model}
		if n := g.inUse(k.Model); n > 0 {
			b.Holder = fmt.Sprintf("%d requests through the gate", n)
		}
		bs = append(bs, b)
	}
	if k.Unattributed {
		bs = append(bs, blocker{Kind: "unattributed", Model: k.Model})
	}
	return bs
}

func describe(bs []blocker) string {
	if len(bs) == 0 {
		return "nothing named"
	}
	s := make([]string, len(bs))
	for i, b := range bs {
		s[i] = b.Kind
		if b.Model != "" {
			s[i] += " on " + b.Model
		}
		if b.Holder != "" {
			s[i] += " by " + b.Holder
		}
	}
	return strings.Join(s, "; ")
}

func (r *refusal) setRetry(after, fallback time.Duration) {
	r.RetryAfterKnown = after > 0
	if after <= 0 {
		after = fallback
	}
	r.retry = after
	r.RetryAfter = math.Ceil(after.Seconds())
}

// failed is a check that could not be made: the load is refused rather
// than let through unchecked (503: it may be made on a later try).
func failed(model, what string, err error) *refusal {
	return &refusal{Model: model, Reason: "failed", status: http.StatusServiceUnavailable,
		Blockers: []blocker{{Kind: "check failed", Holder: what}}, Checked: []string{},
		Error: fmt.Sprintf("vramgate: %s failed, the load of %s is not admitted: %s", what, model, oneLine(err.Error()))}
}

// refuse writes a refusal: 503 with Retry-After and the blockers; the
// error text ends saying when to retry, for clients that keep only the
// text (Ollama's Go client: api.StatusError).
func (g *gate) refuse(w http.ResponseWriter, ref *refusal, client string) {
	ref.Checked = orEmpty(ref.Checked)
	ref.Blockers = orEmptyBlockers(ref.Blockers)
	if ref.retry <= 0 {
		ref.setRetry(0, g.cfg.retryAfter)
	}
	retry := int(max(1, ref.RetryAfter))
	ref.RetryAfter = float64(retry)
	w.Header().Set("Retry-After", strconv.Itoa(retry))
	ref.Error += fmt.Sprintf("; retry after %d s", retry)
	g.metrics.refusals.WithLabelValues(g.metrics.label(client), ref.Model, ref.Reason).Inc()
	g.log.Info("load refused", "model", ref.Model, "client", client, "reason", ref.Reason, "blockers", describe(ref.Blockers))
	writeJSON(w, ref.status, ref)
}

// canLoad answers GET /vramgate/can-load?model=M[&num_ctx=N]: the
// admission's answer, without loading or unloading anything. 200 when the
// model is resident or its load would be admitted (the body says what
// was checked, and what room-making would unload), 503 as a refusal
// would be.
func (g *gate) canLoad(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	model := strings.TrimSpace(q.Get("model"))
	if model == "" {
		writeError(w, http.StatusBadRequest, "can-load needs ?model=NAME")
		return
	}
	numCtx := 0
	if s := q.Get("num_ctx"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "num_ctx=%q: want a number of tokens", s)
			return
		}
		numCtx = n
	}
	v := g.admit(r.Context(), model, numCtx, clientOf(r), true)
	if v.unknown {
		writeError(w, http.StatusNotFound, "model %q not found on the server", model)
		return
	}
	if v.refusal != nil {
		g.refuse(w, v.refusal, clientOf(r))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"model":       vramguard.NormalizeModelName(model),
		"resident":    !v.load,
		"admitted":    true,
		"checked":     orEmpty(v.checked),
		"not_checked": orEmpty(v.notChecked),
		"would":       orEmpty(v.made),
	})
}

func orEmptyBlockers(bs []blocker) []blocker {
	if bs == nil {
		return []blocker{}
	}
	return bs
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// resident lists the models Ollama has resident, normalized; the gate
// remembers each as seen (a later load of it is a reload).
//
// It asks /api/ps itself rather than through OllamaClient.Running, whose
// listings are shared at most one per poll interval (50 ms): a proxy that
// waited for the next one would add that to every request. Ollama up to
// v0.32.3 sometimes answers a /api/ps read during a load or unload with a
// bodiless 500 (README, known server issues): that is read again once.
func (g *gate) resident(ctx context.Context) ([]string, error) {
	resp, err := g.client.API().ListRunning(ctx)
	if err != nil && ctx.Err() == nil {
		resp, err = g.client.API().ListRunning(ctx)
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(resp.Models))
	g.mu.Lock()
	for _, m := range resp.Models {
		n := vramguard.NormalizeModelName(m.Model)
		names = append(names, n)
		g.seen[n] = true
	}
	g.mu.Unlock()
	return names, nil
}

// reloadWindow is how long after the gate unloaded a model a load of it
// is reported as a reload with that cause.
const reloadWindow = 10 * time.Minute

// The causes of a load, as vramgate_loads_total labels them.
const (
	causeFirst    = "first"          // the gate never saw the model resident
	causeUnloaded = "gate unload"    // a client's unload through the gate
	causeRoom     = "gate made room" // the gate unloaded it to admit another load
	causeOther    = "left otherwise" // keep-alive, another program's unload, a restart
)

// causeOf says why model is absent, for the load about to happen: the
// label, and who or what (the client whose unload it was, the load the
// gate made room for).
func (g *gate) causeOf(model string) (cause, by string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rec, ok := g.gone[model]; ok && time.Since(rec.at) < reloadWindow {
		if rec.client != "" {
			return causeUnloaded, rec.client
		}
		return causeRoom, rec.why
	}
	if g.seen[model] {
		return causeOther, ""
	}
	return causeFirst, ""
}
