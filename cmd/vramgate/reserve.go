package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
)

// httpReservation is a reservation an HTTP client took through the gate:
// free bytes of a device kept for its recipient host-wide, held by the
// gate's holder client (never the client its admissions run on, whose own
// reservations would be its to use), until its TTL unless extended.
type httpReservation struct {
	token  string // the secret id only its taker knows
	holder string // the name the client gave
	remote string // the client's address when it took it
	res    *vramguard.Lease
	timer  *time.Timer // drops it from the table at its TTL (the Lease ends itself); under the table's lock
}

// reserveTable is the gate's HTTP reservations, by token.
type reserveTable struct {
	g  *gate
	mu sync.Mutex
	by map[string]*httpReservation
}

func newReserveTable(g *gate) *reserveTable {
	return &reserveTable{g: g, by: map[string]*httpReservation{}}
}

// reservationAnswer is what the reservation routes answer about one.
type reservationAnswer struct {
	ID     string    `json:"id,omitempty"` // only to the taker: extends and releases it
	Device int       `json:"device"`
	Bytes  uint64    `json:"bytes"`
	Taken  uint64    `json:"taken_bytes,omitempty"` // what its recipient allocated of it, as measured at the listing
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
	Evicted    []string `json:"evicted"` // models unloaded, verified
	FreeBefore uint64   `json:"free_before_bytes"`
	FreeAfter  uint64   `json:"free_after_bytes"`
	Source     string   `json:"source"`     // the GPU reader the figures are from
	ElapsedMS  int64    `json:"elapsed_ms"` // the room-making and the reservation
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
	// unprotected models, the gate's tenants asked), then reserves it.
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
	var (
		res *vramguard.Lease
		rc  *receipt
		err error
	)
	if q.MakeRoom {
		var rep *vramguard.EnsureReport
		rep, err = t.g.holder.EnsureFree(r.Context(), vramguard.EnsureRequest{Device: *q.Device, Bytes: q.Bytes, Reservation: &opts})
		if rep != nil {
			res = rep.Reservation
			rc = &receipt{Evicted: []string{}, FreeBefore: rep.FreeBefore, FreeAfter: rep.FreeAfter, Source: rep.Source}
			for _, u := range rep.Evicted {
				if u.Verified {
					rc.Evicted = append(rc.Evicted, u.Model)
				}
			}
		}
	} else {
		res, err = t.g.holder.Reserve(r.Context(), *q.Device, q.Bytes, opts)
	}
	if err != nil {
		if res != nil {
			_ = res.Release()
		}
		t.refuse(w, r, q, err)
		return
	}
	if rc != nil {
		rc.ElapsedMS = time.Since(start).Milliseconds()
	}
	hr := &httpReservation{token: newToken(), holder: q.Holder, remote: r.RemoteAddr, res: res}
	t.mu.Lock()
	t.by[hr.token] = hr
	hr.timer = time.AfterFunc(ttl, func() { t.forget(hr) })
	ans := answerOfReservation(hr, true)
	t.mu.Unlock()
	t.g.log.Info("memory reserved", "device", ans.Device, "bytes", ans.Bytes, "for", ans.For, "holder", q.Holder, "remote", r.RemoteAddr, "until", ans.Until)
	writeJSON(w, http.StatusCreated, map[string]any{"reservation": ans, "receipt": rc})
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
			t.forget(hr)
			writeError(w, http.StatusNotFound, "no such reservation (it ended)")
			return
		}
		writeError(w, leaseStatus(err), "extend the reservation: %s", oneLine(err.Error()))
		return
	}
	t.mu.Lock()
	if t.by[hr.token] != hr { // its TTL ended between the lookup and the extension
		t.mu.Unlock()
		_ = hr.res.Release()
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
	t.forget(hr)
	if err := hr.res.Release(); err != nil {
		writeError(w, http.StatusInternalServerError, "release: %v", err)
		return
	}
	t.g.log.Info("reservation released", "for", hr.res.Info().For, "holder", hr.holder)
	writeJSON(w, http.StatusOK, map[string]any{"released": true})
}

// list answers GET /vramgate/reservations: those the gate holds, without
// their ids, and those of other vramguard programs on the host, as the
// gate's client sees the devices (what each has left).
func (t *reserveTable) list(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	out := make([]reservationAnswer, 0, len(t.by))
	mine := map[string]bool{}
	for _, hr := range t.by {
		out = append(out, answerOfReservation(hr, false))
		mine[hr.res.Info().ID] = true
	}
	t.mu.Unlock()
	notChecked := []string{}
	if t.g.reader == nil {
		notChecked = append(notChecked, "other programs' reservations: no GPU reader")
	} else if rep, err := t.g.client.EnsureFree(r.Context(), vramguard.EnsureRequest{Device: t.g.cfg.device, DryRun: true}); err != nil && (rep == nil || rep.Snapshot == nil) {
		notChecked = append(notChecked, "other programs' reservations: "+oneLine(err.Error()))
	} else if rep != nil && rep.Snapshot != nil {
		for _, d := range rep.Snapshot.Devices {
			for _, info := range d.Reserved {
				if mine[info.ID] {
					continue
				}
				out = append(out, reservationAnswer{Device: d.Index, Bytes: info.Bytes, Taken: info.Taken, For: info.For, PID: info.ForPID,
					Holder: info.Program, Until: info.Until, Reservation: info.String(), Through: "host"})
			}
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

// forget drops hr from the table.
func (t *reserveTable) forget(hr *httpReservation) {
	t.mu.Lock()
	if t.by[hr.token] == hr {
		delete(t.by, hr.token)
		hr.timer.Stop()
	}
	t.mu.Unlock()
}

// releaseAll ends every HTTP reservation (the gate stops).
func (t *reserveTable) releaseAll() error {
	t.mu.Lock()
	all := make([]*httpReservation, 0, len(t.by))
	for _, hr := range t.by {
		all = append(all, hr)
	}
	t.by = map[string]*httpReservation{}
	t.mu.Unlock()
	var errs []error
	for _, hr := range all {
		if err := hr.res.Release(); err != nil {
			errs = append(errs, fmt.Errorf("release the reservation of %s for %s: %w", hr.holder, hr.res.Info().For, err))
		}
	}
	return errors.Join(errs...)
}
