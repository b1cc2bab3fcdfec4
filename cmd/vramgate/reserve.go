package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
)

// httpReservation is a reservation an HTTP client took through the gate:
// free bytes of a device kept for its recipient host-wide, held by a
// client of its own (never the client the admissions run on, nor another
// HTTP reservation's: a client's own reservations are its to use), until
// its TTL unless extended.
type httpReservation struct {
	token  string // the secret id only its taker knows
	holder string // the name the client gave
	remote string // the client's address when it took it
	c      *vramguard.OllamaClient
	res    *vramguard.Lease
	timer  *time.Timer // ends it at its TTL (the Lease ends itself too); under the table's lock
}

// end releases the reservation and closes its client.
func (hr *httpReservation) end() error {
	return errors.Join(hr.res.Release(), hr.c.Close())
}

// newHolder is a client to hold one HTTP reservation: the gate's options,
// and its tenants to ask in a make_room.
func (g *gate) newHolder() (*vramguard.OllamaClient, error) {
	c, err := vramguard.NewClient(g.holderOpts)
	if err != nil {
		return nil, err
	}
	for _, tn := range g.tenants {
		if _, err := c.RegisterTenant(tn); err != nil {
			return nil, errors.Join(err, c.Close())
		}
	}
	return c, nil
}

// reserveTable is the gate's HTTP reservations, by token.
type reserveTable struct {
	g      *gate
	mu     sync.Mutex
	by     map[string]*httpReservation
	closed bool // releaseAll ran: a take that ends later ends its own
}

func newReserveTable(g *gate) *reserveTable {
	return &reserveTable{g: g, by: map[string]*httpReservation{}}
}

// reservationAnswer is what the reservation routes answer about one.
type reservationAnswer struct {
	ID     string `json:"id,omitempty"` // only to the taker: extends and releases it
	Device int    `json:"device"`
	Bytes  uint64 `json:"bytes"`
	// Taken is what its recipient ("pid") allocated of it, as the
	// listing's reading measured it. One taken whole is counted by no one
	// from then on; the gate's stays listed until its TTL or release.
	Taken  uint64    `json:"taken_bytes,omitempty"`
	For    string    `json:"for"`
	PID    uint32    `json:"pid,omitempty"` // the recipient's process: it ends as that process takes the room
	Holder string    `json:"holder"`
	Until  time.Time `json:"until"`
	// Reservation is the host-wide reservation as every vramguard
	// program sees it.
	Reservation string `json:"reservation"`
	// Through says whether the gate holds it for an HTTP client
	// ("vramgate") or another vramguard program does ("host").
	Through string `json:"through"`
}

// receipt is the measured answer of a make-room-then-reserve.
type receipt struct {
	Evicted []string `json:"evicted"` // models unloaded, verified
	// Tenants are the tenants asked to give memory back (ComfyUI, with
	// -comfyui), each with what the device showed.
	Tenants    []tenantReceipt `json:"tenants"`
	FreeBefore uint64          `json:"free_before_bytes"`
	FreeAfter  uint64          `json:"free_after_bytes"`
	Source     string          `json:"source"`     // the GPU reader the figures are from
	ElapsedMS  int64           `json:"elapsed_ms"` // the room-making and the reservation
}

// tenantReceipt is one tenant's release in a receipt.
type tenantReceipt struct {
	Name       string `json:"name"`
	FreeBefore uint64 `json:"free_before_bytes"`
	FreeAfter  uint64 `json:"free_after_bytes"`
	Verified   bool   `json:"verified"` // the device showed the memory back
	Error      string `json:"error,omitempty"`
}

// receiptOf is the receipt of a room-making's report.
func receiptOf(rep *vramguard.EnsureReport) *receipt {
	rc := &receipt{Evicted: []string{}, Tenants: []tenantReceipt{}, FreeBefore: rep.FreeBefore, FreeAfter: rep.FreeAfter, Source: rep.Source}
	for _, u := range rep.Evicted {
		if u.Verified {
			rc.Evicted = append(rc.Evicted, u.Model)
		}
	}
	for _, tr := range rep.Tenants {
		x := tenantReceipt{Name: tr.Name, FreeBefore: tr.FreeBefore, FreeAfter: tr.FreeAfter, Verified: tr.Verified}
		if tr.Err != nil {
			x.Error = oneLine(tr.Err.Error())
		}
		rc.Tenants = append(rc.Tenants, x)
	}
	return rc
}

// inUseHoldTTL bounds the holds of holdInUse, which make_room releases as
// it returns: the end of a hold whose release failed.
const inUseHoldTTL = 10 * time.Minute

// holdInUse holds the models that requests through the gate are using
// (gate.busy: those admitted and not yet answered, loading ones
// included), and returns the holds for the caller to release. The room
// is made by the reservation's own client, which does not see the
// requests the admissions' client runs (a client knows its own): with no
// hold it would take a model serving a chat for an idle one. The holds
// are the gate's holder's, held for someone else (ReserveOptions.Model),
// so every client keeps them, and they name why to every other program
// meanwhile. A request that begins after this look is not held, as the
// library's room-making does not hold a call begun while it runs.
func (t *reserveTable) holdInUse(r *http.Request) ([]*vramguard.Lease, error) {
	var holds []*vramguard.Lease
	for _, m := range t.g.busyModels() {
		l, err := t.g.holder.Reserve(r.Context(), 0, 0, vramguard.ReserveOptions{Model: m, For: "requests through vramgate",
			Note: "vramgate: in use while a make_room runs", TTL: inUseHoldTTL})
		if err != nil {
			return holds, err
		}
		holds = append(holds, l)
	}
	return holds, nil
}

func answerOfReservation(hr *httpReservation, withID bool) reservationAnswer {
	info := hr.res.Info()
	a := reservationAnswer{Device: info.Device, Bytes: info.Bytes, For: info.For, PID: info.ForPID, Holder: hr.holder,
		Until: info.Until, Reservation: info.String(), Through: "vramgate"}
	if withID {
		a.ID = hr.token
	}
	return a
}

// reserveRequest is the body of a take or an extension.
type reserveRequest struct {
	Device *int            `json:"device"`
	Bytes  uint64          `json:"bytes"`
	For    string          `json:"for"`
	Holder string          `json:"holder"`
	PID    uint32          `json:"pid"`
	TTL    json.RawMessage `json:"ttl"` // "90s", or seconds; default 60 s
	// MakeRoom makes the room first (verified unloads of idle, unleased,
	// unprotected models: a model a request through the gate is using is
	// kept, holdInUse; the gate's tenants asked), then reserves it.
	MakeRoom bool `json:"make_room"`
}

func (t *reserveTable) parse(w http.ResponseWriter, r *http.Request) (*reserveRequest, time.Duration, bool) {
	var q reserveRequest
	ttl, ok := t.g.readWithTTL(w, r, &q, &q.TTL, `{"device", "bytes", "for", "holder", "pid", "ttl", "make_room"}`)
	return &q, ttl, ok
}

// take answers POST /vramgate/reservations {"device", "bytes", "for",
// "holder", "pid", "ttl", "make_room"}: 201 with the reservation, the id
// that alone extends and releases it, and with make_room the measured
// receipt of the room made; a refusal is the gate's 503 naming what keeps
// the room (other reservations, leases, processes, the gate's -reserve),
// with Retry-After.
func (t *reserveTable) take(w http.ResponseWriter, r *http.Request) {
	q, ttl, ok := t.parse(w, r)
	if !ok {
		return
	}
	if err := checkHolder(q.Holder); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	switch {
	case q.Device == nil:
		writeError(w, http.StatusBadRequest, "a reservation needs a device: its index as the gate's GPU reader numbers it")
		return
	case q.Bytes == 0:
		writeError(w, http.StatusBadRequest, "a reservation needs bytes above 0")
		return
	case strings.TrimSpace(q.For) == "":
		writeError(w, http.StatusBadRequest, "a reservation needs \"for\": the recipient, as refusals will name it")
		return
	case t.g.reader == nil:
		writeError(w, http.StatusServiceUnavailable, "no reservation: the gate has no GPU reader, and a reservation keeps measured free memory")
		return
	}
	opts := vramguard.ReserveOptions{For: q.For, PID: q.PID, TTL: ttl, Note: "vramgate reservation of " + q.Holder}
	start := time.Now()
	c, err := t.g.newHolder()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "reservation: %s", oneLine(err.Error()))
		return
	}
	kept := false
	defer func() {
		// Its client's Close ends whatever it took (a reservation a
		// refused call reported with its error), a panic's included.
		if !kept {
			if cerr := c.Close(); cerr != nil {
				t.g.log.Warn("reservation: ending a refused take's client failed", "err", cerr)
			}
		}
	}()
	var (
		res *vramguard.Lease
		rc  *receipt
	)
	if q.MakeRoom {
		res, rc, err = t.makeRoom(r, c, *q.Device, q.Bytes, &opts)
	} else {
		res, err = c.Reserve(r.Context(), *q.Device, q.Bytes, opts)
	}
	if err != nil {
		t.refuse(w, r, q, err)
		return
	}
	if rc != nil {
		rc.ElapsedMS = time.Since(start).Milliseconds()
	}
	hr := &httpReservation{token: newToken(), holder: q.Holder, remote: r.RemoteAddr, c: c, res: res}
	t.mu.Lock()
	if t.closed { // the gate stopped (releaseAll) while the room was made
		t.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "no reservation: the gate is stopping")
		return
	}
	t.by[hr.token] = hr
	kept = true
	hr.timer = time.AfterFunc(ttl, func() { t.expire(hr) })
	ans := answerOfReservation(hr, true)
	t.mu.Unlock()
	t.g.log.Info("memory reserved", "device", ans.Device, "bytes", ans.Bytes, "for", ans.For, "holder", q.Holder, "remote", r.RemoteAddr, "until", ans.Until)
	writeJSON(w, http.StatusCreated, map[string]any{"reservation": ans, "receipt": rc})
}

// makeRoom makes bytes free on device with c, the reservation's client,
// and reserves them with opts, keeping the models requests through the
// gate are using (holdInUse) while it runs. A refusal that those holds
// caused names the models as in use, with no known end (the requests'),
// not as leases ending at the holds' TTL.
func (t *reserveTable) makeRoom(r *http.Request, c *vramguard.OllamaClient, device int, bytes uint64, opts *vramguard.ReserveOptions) (*vramguard.Lease, *receipt, error) {
	holds, err := t.holdInUse(r)
	defer func() {
		for _, l := range holds {
			if rerr := l.Release(); rerr != nil {
				t.g.log.Warn("make_room: a hold on a model in use through the gate was not released; it ends at its TTL", "model", l.Info().Model, "err", rerr)
			}
		}
	}()
	if err != nil {
		return nil, nil, err
	}
	rep, err := c.EnsureFree(r.Context(), vramguard.EnsureRequest{Device: device, Bytes: bytes, Reservation: opts})
	var re *vramguard.RoomError
	if err != nil && errors.As(err, &re) {
		ours := map[string]bool{}
		for _, l := range holds {
			ours[l.Info().ID] = true
		}
		stripped := false
		for i := range re.Kept {
			k := &re.Kept[i]
			n := len(k.Leases)
			k.Leases = slices.DeleteFunc(k.Leases, func(l vramguard.LeaseInfo) bool { return ours[l.ID] })
			if len(k.Leases) < n {
				k.InUse, stripped = true, true
			}
		}
		if stripped {
			re.RetryAfter = 0 // when the requests end is not known
		}
	}
	if rep == nil {
		return nil, nil, err
	}
	return rep.Reservation, receiptOf(rep), err
}

// refuse answers a reservation the library refused: bad input 400, no
// room the gate's 503 with the blockers and Retry-After.
func (t *reserveTable) refuse(w http.ResponseWriter, r *http.Request, q *reserveRequest, err error) {
	var re *vramguard.RoomError
	switch {
	case errors.As(err, &re):
		what := fmt.Sprintf("%d bytes on device %d for %s", q.Bytes, *q.Device, q.For)
		ref := t.g.roomRefusal(what, err, &verdict{checked: []string{"memory", "reservations"}})
		ref.Error = fmt.Sprintf("vramgate: no reservation of %s: %v", what, err)
		t.g.refuse(w, ref, clientOf(r))
	case vramguard.KindOf(err) == vramguard.KindInvalidInput || vramguard.KindOf(err) == vramguard.KindNotFound:
		writeError(w, http.StatusBadRequest, "reservation: %s", oneLine(err.Error()))
	default:
		writeError(w, leaseStatus(err), "reservation: %s", oneLine(err.Error()))
	}
}

// extend answers POST /vramgate/reservations/ID {"ttl"}: it now ends ttl
// from now.
func (t *reserveTable) extend(w http.ResponseWriter, r *http.Request) {
	hr := t.lookup(w, r)
	if hr == nil {
		return
	}
	_, ttl, ok := t.parse(w, r)
	if !ok {
		return
	}
	if err := hr.res.Extend(ttl); err != nil {
		if errors.Is(err, vramguard.ErrClosed) { // ended meanwhile (its TTL, consumed)
			t.expire(hr)
			writeError(w, http.StatusNotFound, "no such reservation (it ended)")
			return
		}
		writeError(w, leaseStatus(err), "extend the reservation: %s", oneLine(err.Error()))
		return
	}
	t.mu.Lock()
	if t.by[hr.token] != hr { // its TTL ended between the lookup and the extension (expire ends it)
		t.mu.Unlock()
		writeError(w, http.StatusNotFound, "no such reservation (it ended)")
		return
	}
	hr.timer.Reset(ttl)
	ans := answerOfReservation(hr, true)
	t.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"reservation": ans})
}

// release answers DELETE /vramgate/reservations/ID.
func (t *reserveTable) release(w http.ResponseWriter, r *http.Request) {
	hr := t.lookup(w, r)
	if hr == nil {
		return
	}
	if !t.forget(hr) {
		writeError(w, http.StatusNotFound, "no such reservation (it ended)")
		return
	}
	if err := hr.end(); err != nil {
		writeError(w, http.StatusInternalServerError, "release: %v", err)
		return
	}
	t.g.log.Info("reservation released", "for", hr.res.Info().For, "holder", hr.holder)
	writeJSON(w, http.StatusOK, map[string]any{"released": true})
}

// list answers GET /vramgate/reservations: those the gate holds, without
// their ids, and those of other vramguard programs on the host, as the
// gate's client sees the devices (what each has left, and what its
// recipient took: the gate's own with "pid" too, as the reading measured
// them).
func (t *reserveTable) list(w http.ResponseWriter, r *http.Request) {
	notChecked := []string{}
	var seen []vramguard.DeviceMemory
	if t.g.reader == nil {
		notChecked = append(notChecked, "other programs' reservations: no GPU reader")
	} else if rep, err := t.g.client.EnsureFree(r.Context(), vramguard.EnsureRequest{Device: t.g.cfg.device, DryRun: true}); err != nil && (rep == nil || rep.Snapshot == nil) {
		notChecked = append(notChecked, "other programs' reservations: "+oneLine(err.Error()))
	} else if rep != nil && rep.Snapshot != nil {
		seen = rep.Snapshot.Devices
	}
	t.mu.Lock()
	out := make([]reservationAnswer, 0, len(t.by))
	mine := map[string]int{}
	for _, hr := range t.by {
		mine[hr.res.Info().ID] = len(out)
		out = append(out, answerOfReservation(hr, false))
	}
	t.mu.Unlock()
	for _, d := range seen {
		for _, info := range d.Reserved {
			if i, ok := mine[info.ID]; ok {
				out[i].Taken = info.Taken
				continue
			}
			out = append(out, reservationAnswer{Device: d.Index, Bytes: info.Bytes, Taken: info.Taken, For: info.For, PID: info.ForPID,
				Holder: info.Program, Until: info.Until, Reservation: info.String(), Through: "host"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Until.Before(out[j].Until) })
	writeJSON(w, http.StatusOK, map[string]any{"reservations": out, "not_checked": notChecked})
}

// lookup finds the reservation the path's id names; an id that names none
// is a 404 that says nothing of which exist.
func (t *reserveTable) lookup(w http.ResponseWriter, r *http.Request) *httpReservation {
	t.mu.Lock()
	hr := t.by[r.PathValue("id")]
	t.mu.Unlock()
	if hr == nil {
		writeError(w, http.StatusNotFound, "no such reservation: an id is the one POST /vramgate/reservations returned to its taker; reservations of other programs are not released over HTTP")
	}
	return hr
}

// forget drops hr from the table, and says whether it was there (the
// caller then ends it).
func (t *reserveTable) forget(hr *httpReservation) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by[hr.token] != hr {
		return false
	}
	delete(t.by, hr.token)
	hr.timer.Stop()
	return true
}

// expire ends hr, whose TTL ended (or whose lease did), if it is still
// in the table.
func (t *reserveTable) expire(hr *httpReservation) {
	if !t.forget(hr) {
		return
	}
	if err := hr.end(); err != nil {
		t.g.log.Warn("reservation: ending one whose TTL ended failed", "for", hr.res.Info().For, "holder", hr.holder, "err", err)
	}
}

// releaseAll ends every HTTP reservation (the gate stops).
func (t *reserveTable) releaseAll() error {
	t.mu.Lock()
	t.closed = true
	all := make([]*httpReservation, 0, len(t.by))
	for _, hr := range t.by {
		all = append(all, hr)
	}
	t.by = map[string]*httpReservation{}
	t.mu.Unlock()
	var errs []error
	for _, hr := range all {
		hr.timer.Stop()
		if err := hr.end(); err != nil {
			errs = append(errs, fmt.Errorf("release the reservation of %s for %s: %w", hr.holder, hr.res.Info().For, err))
		}
	}
	return errors.Join(errs...)
}
