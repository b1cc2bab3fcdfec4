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

// verdict is what can-load answers for one model: the admission's answer,
// asked without loading or unloading anything.
type verdict struct {
	load       bool     // the model is not resident: the request would load it
	checked    []string // what the admission checks
	notChecked []string // what it cannot check, and why
	made       []string // what it would unload to admit the load
	refusal    *refusal
	unknown    bool // the server does not have the model (it answers 404 itself)
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

// budget is the gate's admission rules as the library's Options.Budget:
// -max-loaded is MaxLoaded, -reserve the Headroom, -make-room MakeRoom,
// -admit-wait WaitForLeases (its bound is the admission's, Timeouts.FirstChunk);
// without a GPU reader the memory checks are off and slots alone are
// checked. nil: the gate checks nothing (no reader, no -max-loaded).
func (cfg *config) budget(reader vramguard.VRAMReader) *vramguard.Budget {
	if reader == nil && cfg.maxLoaded == 0 {
		return nil
	}
	return &vramguard.Budget{Device: cfg.device, Headroom: cfg.reserve, MakeRoom: cfg.makeRoom, WaitForLeases: cfg.admitWait > 0,
		MaxLoaded: cfg.maxLoaded, OffWithoutGPU: reader == nil}
}

// checks says what an admission checks and what it cannot, and why.
func (g *gate) checks() (checked, notChecked []string) {
	if g.cfg.maxLoaded > 0 {
		checked = append(checked, "slots")
	} else {
		notChecked = append(notChecked, "slots (-max-loaded not set: Ollama's own limit decides what the load evicts)")
	}
	if g.reader == nil {
		return checked, append(notChecked, "memory (no GPU reader)", "reservations (no GPU reader: they keep measured memory)")
	}
	return append(checked, "memory", "reservations"), notChecked
}

// summary is the X-Vramgate-Admission header: what the admission of a
// request did.
func (g *gate) summary(ev vramguard.AdmissionEvent) string {
	if !ev.Load {
		return "resident"
	}
	checked, notChecked := g.checks()
	s := "load; checked: " + orNone(checked)
	if len(notChecked) > 0 {
		s += "; not checked: " + strings.Join(notChecked, ", ")
	}
	var made []string
	for _, e := range ev.Evicted {
		if e.Verified {
			made = append(made, vramguard.NormalizeModelName(e.Model))
		}
	}
	if len(made) > 0 {
		s += "; unloaded to make room: " + strings.Join(made, ", ")
	}
	return s
}

// refusalOf turns an admission's failure into the 503: a refusal for a
// slot or for memory names its blockers; a check that failed is named as
// failed.
func (g *gate) refusalOf(name string, err error) *refusal {
	v := &verdict{}
	v.checked, v.notChecked = g.checks()
	var re *vramguard.RoomError
	switch {
	case errors.As(err, &re) && re.Need == 0 && re.Budget != nil && re.Budget.MaxLoaded > 0:
		return g.slotRefusal(name, re, v)
	case errors.As(err, &re) && re.Total > 0 && re.Need > re.Total,
		!errors.As(err, &re) && vramguard.KindOf(err) == vramguard.KindInvalidInput:
		return g.neverFits(name, err, v)
	case errors.As(err, &re):
		return g.roomRefusal(name, err, v)
	}
	return failed(name, "the admission", err)
}

// slotRefusal is the refusal of -max-loaded: every resident model is kept
// (MaxLoaded's *RoomError), each named with what keeps it.
func (g *gate) slotRefusal(name string, re *vramguard.RoomError, v *verdict) *refusal {
	ref := &refusal{Model: name, Reason: "no slot", status: http.StatusServiceUnavailable, Blockers: []blocker{},
		Checked: v.checked, NotChecked: v.notChecked}
	leased, inUse := false, false
	for _, k := range re.Kept {
		ref.Blockers = append(ref.Blockers, g.keptBlockers(k)...)
		leased = leased || len(k.Leases) > 0
		inUse = inUse || k.InUse
	}
	switch {
	case leased:
		ref.Reason = "leased"
	case inUse:
		ref.Reason = "in use"
	}
	ref.Error = fmt.Sprintf("vramgate: %s would need one of Ollama's %d slots (-max-loaded), and every resident model is kept: %s",
		name, g.cfg.maxLoaded, describe(ref.Blockers))
	ref.setRetry(re.RetryAfter, g.cfg.retryAfter)
	return ref
}

// plan is can-load's answer: the admission's, asked of the library as a
// dry run (EnsureFree with DryRun: nothing loaded, nothing unloaded): a
// resident model always may load; a load is checked against the slots
// (-max-loaded) and, with a GPU reader, the device's memory.
func (g *gate) plan(ctx context.Context, model string, numCtx int) *verdict {
	name := vramguard.NormalizeModelName(model)
	v := &verdict{}
	resident, err := g.resident(ctx)
	if err != nil {
		return &verdict{refusal: failed(name, "Ollama's /api/ps", err)}
	}
	if slices.Contains(resident, name) {
		return v
	}
	// A model the server does not have loads nothing: Ollama answers 404
	// itself.
	var est *vramguard.ModelEstimate
	if g.reader != nil {
		est, err = g.client.EstimateModel(ctx, name, numCtx)
	} else {
		_, err = g.client.API().Show(ctx, &api.ShowRequest{Model: name})
	}
	if err != nil {
		var se api.StatusError
		if vramguard.KindOf(err) == vramguard.KindNotFound || errors.As(err, &se) && se.StatusCode == http.StatusNotFound {
			return &verdict{unknown: true}
		}
		return &verdict{refusal: failed(name, "the model's /api/show", err)}
	}
	v.load = true
	v.checked, v.notChecked = g.checks()
	if g.cfg.maxLoaded > 0 && len(resident) >= g.cfg.maxLoaded {
		rep, err := g.client.EnsureFree(ctx, vramguard.EnsureRequest{AllModels: true, DryRun: true, KeepInUse: true})
		if err != nil {
			v.refusal = g.roomRefusal(name, err, v)
			return v
		}
		victim := slices.IndexFunc(rep.Plan, func(p string) bool { return slices.Contains(resident, vramguard.NormalizeModelName(p)) })
		if victim < 0 {
			bc := vramguard.Budget{MaxLoaded: g.cfg.maxLoaded}
			v.refusal = g.slotRefusal(name, &vramguard.RoomError{Model: name, Kept: rep.Kept, RetryAfter: rep.RetryAfter, Budget: &bc}, v)
			return v
		}
		v.made = append(v.made, "would unload "+rep.Plan[victim])
	}
	if g.reader == nil {
		return v
	}
	rep, err := g.client.EnsureFree(ctx, vramguard.EnsureRequest{Device: g.cfg.device, Bytes: uint64(est.Total), Reserve: g.cfg.reserve, DryRun: true, KeepInUse: true})
	if err != nil {
		v.refusal = g.refusalOf(name, err)
		return v
	}
	if len(rep.Plan) > 0 && !g.cfg.makeRoom {
		// The room is there only if something goes first, and the gate
		// may not make it: Ollama would evict on its own, or fail.
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
		v.refusal = ref
		return v
	}
	for _, p := range rep.Plan {
		v.made = append(v.made, "would unload "+p)
	}
	return v
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
		// The gate's client sends nothing of its own: what it counts in
		// use are the requests it forwards (OllamaClient.Admit).
		bs = append(bs, blocker{Kind: "in use", Model: k.Model, Holder: "requests through the gate"})
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
	v := g.plan(r.Context(), model, numCtx)
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
