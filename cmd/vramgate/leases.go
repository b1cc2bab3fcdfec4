package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/vramguard/vramguard"
)

// defaultLeaseTTL is an HTTP lease's TTL when the request names none.
const defaultLeaseTTL = time.Minute

// httpLease is a lease an HTTP client took through the gate: a host-wide
// vramguard lease the gate holds for it (Reserve with
// ReserveOptions.Model: every vramguard program, the gate's own client
// included, sees it as the client's, named), until its TTL unless
// extended.
type httpLease struct {
	token  string // the secret id only its taker knows
	model  string // as the lease names it
	holder string // the name the client gave
	remote string // the client's address when it took the lease
	lease  *vramguard.Lease
	// timer changes at an extension: read it under the table's lock.
	timer *time.Timer
}

// leaseTable is the gate's HTTP leases, by token.
type leaseTable struct {
	g  *gate
	mu sync.Mutex
	by map[string]*httpLease
}

func newLeaseTable(g *gate) *leaseTable { return &leaseTable{g: g, by: map[string]*httpLease{}} }

// leaseAnswer is what the lease routes answer about one lease.
type leaseAnswer struct {
	ID     string    `json:"id,omitempty"` // only to the taker: extends and releases the lease
	Model  string    `json:"model"`
	Holder string    `json:"holder"`
	Server string    `json:"server"`
	Until  time.Time `json:"until"`
	Lease  string    `json:"lease"` // the host-wide lease as every vramguard program sees it
}

// answerOf describes l; the table's lock is held.
func answerOf(l *httpLease, withID bool) leaseAnswer {
	info := l.lease.Info()
	a := leaseAnswer{Model: info.Model, Holder: l.holder, Server: info.Server, Until: info.Until, Lease: info.String()}
	if withID {
		a.ID = l.token
	}
	return a
}

// leaseRequest is the body of a take or an extension.
type leaseRequest struct {
	Model  string          `json:"model"`
	Holder string          `json:"holder"`
	TTL    json.RawMessage `json:"ttl"` // "90s", or seconds; default 60 s
}

func (t *leaseTable) parse(w http.ResponseWriter, r *http.Request) (*leaseRequest, time.Duration, bool) {
	var q leaseRequest
	ttl, ok := t.g.readWithTTL(w, r, &q, &q.TTL, `{"model", "holder", "ttl"}`)
	return &q, ttl, ok
}

// readWithTTL reads the body of a take or an extension (of a lease or a
// reservation) into q, an empty body leaving it zero, and the TTL it
// names (*ttl, a field of q); a malformed body (fields names what a body
// holds) or TTL is answered 400 here, and ok is false.
func (g *gate) readWithTTL(w http.ResponseWriter, r *http.Request, q any, ttl *json.RawMessage, fields string) (d time.Duration, ok bool) {
	body, ok := g.readBody(w, r)
	if !ok {
		return 0, false
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, q); err != nil {
			writeError(w, http.StatusBadRequest, "malformed JSON body: %s (want %s)", jsonProblem(err), fields)
			return 0, false
		}
	}
	d, err := parseTTL(*ttl, g.cfg.leaseMax)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return 0, false
	}
	return d, true
}

// take answers POST /vramgate/leases {"model", "holder", "ttl"}: 201 with
// the lease and the id that alone extends and releases it.
func (t *leaseTable) take(w http.ResponseWriter, r *http.Request) {
	q, ttl, ok := t.parse(w, r)
	if !ok {
		return
	}
	if strings.TrimSpace(q.Model) == "" {
		writeError(w, http.StatusBadRequest, "a lease needs a model")
		return
	}
	if err := checkHolder(q.Holder); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	l, err := t.g.client.Reserve(r.Context(), 0, 0, vramguard.ReserveOptions{Model: q.Model, For: q.Holder, Note: leaseNote(r), TTL: ttl})
	if err != nil {
		writeError(w, leaseStatus(err), "lease %s: %s", q.Model, oneLine(err.Error()))
		return
	}
	hl := &httpLease{token: newToken(), model: l.Info().Model, holder: q.Holder, remote: r.RemoteAddr, lease: l}
	t.mu.Lock()
	t.by[hl.token] = hl
	hl.timer = time.AfterFunc(ttl, func() { t.expire(hl) })
	ans := answerOf(hl, true)
	t.mu.Unlock()
	t.g.metrics.leases.Inc()
	t.g.log.Info("lease taken", "model", hl.model, "holder", q.Holder, "remote", r.RemoteAddr, "until", ans.Until)
	writeJSON(w, http.StatusCreated, ans)
}

// leaseNote is what the host-wide lease says of where a take came from.
func leaseNote(r *http.Request) string {
	if r.RemoteAddr == "" {
		return "HTTP lease"
	}
	return "HTTP lease from " + r.RemoteAddr
}

// extend answers POST /vramgate/leases/ID {"ttl"}: the lease now ends ttl
// from now (the host-wide lease's file is rewritten in place, locked
// throughout: Lease.Extend, so that it never lapses in between).
func (t *leaseTable) extend(w http.ResponseWriter, r *http.Request) {
	hl := t.lookup(w, r)
	if hl == nil {
		return
	}
	_, ttl, ok := t.parse(w, r)
	if !ok {
		return
	}
	if err := hl.lease.Extend(ttl); err != nil {
		if errors.Is(err, vramguard.ErrClosed) { // ended at its TTL meanwhile
			writeError(w, http.StatusNotFound, "no such lease (it ended)")
			return
		}
		writeError(w, leaseStatus(err), "extend the lease: %s", oneLine(err.Error()))
		return
	}
	t.mu.Lock()
	if t.by[hl.token] != hl { // released or expired meanwhile
		t.mu.Unlock()
		writeError(w, http.StatusNotFound, "no such lease (it ended)")
		return
	}
	hl.timer.Stop()
	hl.timer = time.AfterFunc(ttl, func() { t.expire(hl) })
	ans := answerOf(hl, true)
	t.mu.Unlock()
	writeJSON(w, http.StatusOK, ans)
}

// release answers DELETE /vramgate/leases/ID.
func (t *leaseTable) release(w http.ResponseWriter, r *http.Request) {
	hl := t.lookup(w, r)
	if hl == nil {
		return
	}
	if err := t.drop(hl); err != nil {
		writeError(w, http.StatusInternalServerError, "release: %v", err)
		return
	}
	t.g.log.Info("lease released", "model", hl.model, "holder", hl.holder)
	writeJSON(w, http.StatusOK, map[string]any{"released": true, "model": hl.model})
}

// list answers GET /vramgate/leases: the HTTP leases the gate holds,
// without their ids.
func (t *leaseTable) list(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	out := make([]leaseAnswer, 0, len(t.by))
	for _, hl := range t.by {
		out = append(out, answerOf(hl, false))
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Until.Before(out[j].Until) })
	writeJSON(w, http.StatusOK, map[string]any{"leases": out})
}

// lookup finds the lease the path's id names; an id that names none
// (another holder's lease has no id here) is a 404 that says nothing of
// which leases exist.
func (t *leaseTable) lookup(w http.ResponseWriter, r *http.Request) *httpLease {
	t.mu.Lock()
	hl := t.by[r.PathValue("id")]
	t.mu.Unlock()
	if hl == nil {
		writeError(w, http.StatusNotFound, "no such lease: an id is the one POST /vramgate/leases returned to its taker; leases of other programs are not released over HTTP")
	}
	return hl
}

// drop ends a lease: out of the table, its host-wide lease released.
func (t *leaseTable) drop(hl *httpLease) error {
	t.mu.Lock()
	if t.by[hl.token] != hl {
		t.mu.Unlock()
		return nil
	}
	delete(t.by, hl.token)
	hl.timer.Stop()
	t.mu.Unlock()
	t.g.metrics.leases.Dec()
	return hl.lease.Release()
}

// expire ends a lease at its TTL: its taker did not extend it (it may be
// gone).
func (t *leaseTable) expire(hl *httpLease) {
	if err := t.drop(hl); err != nil {
		t.g.log.Warn("release at the TTL failed", "holder", hl.holder, "err", err)
		return
	}
	t.g.log.Info("lease ended at its TTL", "model", hl.model, "holder", hl.holder)
}

// releaseAll ends every HTTP lease (the gate stops).
func (t *leaseTable) releaseAll() error {
	t.mu.Lock()
	all := make([]*httpLease, 0, len(t.by))
	for _, hl := range t.by {
		all = append(all, hl)
	}
	t.mu.Unlock()
	var errs []error
	for _, hl := range all {
		if err := t.drop(hl); err != nil {
			errs = append(errs, fmt.Errorf("release the lease of %s on %s: %w", hl.holder, hl.model, err))
		}
	}
	return errors.Join(errs...)
}

// holderOf names the HTTP client of the lease with host-wide id id; ""
// when the gate holds no such lease.
func (t *leaseTable) holderOf(id string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, hl := range t.by {
		if hl.lease.Info().ID == id {
			return hl.holder + " (" + hl.remote + ")"
		}
	}
	return ""
}

// checkHolder accepts a name a person can read: 1 to 64 printable
// characters.
func checkHolder(h string) error {
	if h == "" || len(h) > 64 {
		return errors.New("a lease needs a holder: who takes it, 1 to 64 characters")
	}
	for _, r := range h {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("holder %q: printable characters only", h)
		}
	}
	return nil
}

// parseTTL reads a lease's "ttl" as Ollama reads a keep_alive (a Go
// duration string, or a number of seconds), absent or null meaning
// defaultLeaseTTL, and refuses one that is not more than 0 and at most
// max naming what the client sent: a number too large for a
// time.Duration (1e12 seconds) is compared as a number, never converted
// into a wrapped one.
func parseTTL(raw json.RawMessage, max time.Duration) (time.Duration, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || string(raw) == "null" {
		return defaultLeaseTTL, nil
	}
	sent := string(raw)
	if len(sent) > 40 {
		sent = sent[:40] + "..."
	}
	bad := func(what string) error {
		return fmt.Errorf("ttl %s: %s; want more than 0 and at most %v (vramgate -lease-max), as a Go duration (\"90s\") or a number of seconds; a lease without an end is not offered over HTTP", sent, what, max)
	}
	var d time.Duration
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, bad("not a JSON string")
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad("not a duration")
		}
		d = v
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		sent += " (seconds)"
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, bad("not a number")
		}
		if f > max.Seconds() {
			return 0, bad("too long")
		}
		if f <= 0 {
			return 0, bad("not more than 0")
		}
		if d = time.Duration(f * float64(time.Second)); d <= 0 {
			return 0, bad("less than a nanosecond")
		}
	default:
		return 0, bad("neither a duration nor a number")
	}
	switch {
	case d <= 0:
		return 0, bad("not more than 0")
	case d > max:
		return 0, bad("too long")
	}
	return d, nil
}

func leaseStatus(err error) int {
	switch vramguard.KindOf(err) {
	case vramguard.KindInvalidInput:
		return http.StatusBadRequest
	case vramguard.KindCanceled:
		return http.StatusRequestTimeout
	}
	return http.StatusServiceUnavailable
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
