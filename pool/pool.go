package pool

// The pool's transport: the pool client's requests come here, and each
// goes to the member it concerns (place.go chooses for a load); the
// listings are merged, and a member that stops answering is skipped until
// it answers again.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
)

// Member is one server of a pool and the device it owns: an `ollama
// serve` started with CUDA_VISIBLE_DEVICES naming one GPU and its own
// OLLAMA_HOST.
type Member struct {
	// Name names the member in placements, errors and logs; "" means Host.
	Name string
	// Host is the member's server, as OLLAMA_HOST writes it.
	Host string
	// VRAM reads the member's device; Device is its index there (one NVML
	// reader may serve every member, each with its own index; a
	// vramguardtest server's GPU has device 0 only). Required: a pool
	// places loads by measured room. In the pool client's own numbering
	// (Pool.Device, Placement.Device) the member's device is its position
	// in Options.Members.
	VRAM   vramguard.VRAMReader
	Device int
	// HTTPClient reaches the member (its Timeout, redirects and Transport
	// apply); nil means a client with no overall timeout on
	// http.DefaultTransport.
	HTTPClient *http.Client
}

// Options configures New.
type Options struct {
	Members []Member
	// Headroom is kept free on a device beyond a model's estimate.
	Headroom uint64
	// ProbeInterval is how often, at most, a member that stopped answering
	// is asked again: by the next call that needs the members after it has
	// passed. Zero means 2 s.
	ProbeInterval time.Duration
	// AnswerTimeout bounds a member's listing and device reading: a member
	// that takes longer (a server that accepts connections and hangs) is
	// counted down, as one that refuses them. Members are asked side by
	// side. Zero means 5 s.
	AnswerTimeout time.Duration
	// OnPlace, when set, is called with each placement, synchronously, in
	// the call's goroutine, before the call goes to the member, while the
	// pool's placement turn is held: it must return quickly and must not
	// generate through the pool (that call would wait for the turn).
	OnPlace func(context.Context, Placement)
}

const (
	defaultProbeInterval = 2 * time.Second
	defaultAnswerTimeout = 5 * time.Second
	// Host is the pool client's own server address (OllamaClient.Host,
	// with Ollama's port): no server listens there; the pool's transport
	// answers. Leases of a pool's phases name it, so another pool sees
	// them; a client of one member does not. Its .invalid name is no local
	// address: the runner check looks at the members' (Servers).
	Host = "http://vramguard-pool.invalid"
)

// Pool is a client whose calls work across several Ollama servers, one per
// GPU: an ordinary *vramguard.OllamaClient (embedded: every method is the
// client's) whose transport routes each request to a member and whose VRAM
// reader shows member i's device as device i. See New.
type Pool struct {
	*vramguard.OllamaClient
	t *transport
}

// New returns a pool over p.Members. Each load goes to a member chosen by
// the facts, in this order (see PlaceReason): a member where the model is
// resident; else the one whose device has the most measured room for the
// model's estimate plus the headroom; else the member where making room
// costs least, made by the client's own EnsureFree on that member's device
// (KeepInUse: never a protected model, one leased by another program,
// another pool's included, or one in use; the client's own leased models,
// its phases', only when no member's room can be made without them:
// KeepOwn first); else the call fails with KindOutOfMemory wrapping a *NoRoomError
// that names, per member, the *vramguard.RoomError of its device. Other
// holders' reservations on a member's device (vramguard.OllamaClient.
// Reserve, another program's hand-over) are not free to a placement; a
// load placed by room or after making room is itself reserved host-wide
// on the member's device (ReserveOptions.Load: every vramguard program on
// the host counts it, and a hand-over waits for it to land) until the
// member answers, and a holder that took the room since the survey
// refuses the placement with the reservation's *vramguard.RoomError; with
// LeaseOptions.Off (or a refused lease directory, logged) no load is
// reserved. A model resident on a member stays there, so a phase keeps each model on the
// member it was placed on. Each decision is reported to Options.OnPlace
// and to WithPlacements' record; one that loads is also an INFO log line.
// One placement runs at
// a time; a caller waiting for its turn gives up when its ctx ends.
//
// Everything else is the client's, as on one server (but the reload
// report, which tells no server restart through a pool: a member's
// failures reach the client as the pool's typed errors): unloads verified
// against the merged listing, leases (a pool honours those taken on its
// members' addresses too, LeaseOptions.Honour; its own name pool.Host, so
// another pool sees them and a client of one member does not), phases (a
// phase's hand-over names the member's device, see Pool.Device), guards,
// the reload report's other causes, Close.
// An unload goes to every member that answers; a member that holds the
// model (listed it last, or had it placed there since) and does not answer
// fails the unload at once with KindUnavailable and a *MemberError naming
// it: one failed answer, never a model reported gone that may not be. A
// member whose server stops answering (or takes longer than AnswerTimeout)
// is skipped for new work (a placement names it, unmeasured, in its
// refusal's sides), its models still count as resident for unloads and
// listings, and it is asked again, at most every ProbeInterval, by the
// calls that need it.
//
// A *Pool is not itself an *OllamaClient: where one is wanted (a Guard's
// Client, the nodes, an adapter's Watch), pass p.OllamaClient.
//
// opts are the client's options; Host, API, HTTPClient, VRAM, Budget,
// VerifyVRAM and Fallback must be unset: the members have them, and the
// pool admits loads itself. An unload's runner-process check looks for the
// members' `ollama serve` processes (all must be on this machine; a remote
// member's runners cannot be seen, and the reports say so).
func New(p Options, opts vramguard.Options) (*Pool, error) {
	const op = "new pool"
	if len(p.Members) == 0 {
		return nil, invalid(op, "a pool needs at least one member")
	}
	if opts.Host != "" || opts.API != nil || opts.HTTPClient != nil || opts.VRAM != nil || opts.Budget != nil || opts.VerifyVRAM || opts.Fallback {
		return nil, invalid(op, "Host, API, HTTPClient, VRAM, Budget, VerifyVRAM and Fallback belong to the members: leave them unset")
	}
	if p.ProbeInterval < 0 || p.AnswerTimeout < 0 || p.Headroom > vramguard.MaxBytes {
		return nil, invalid(op, fmt.Sprintf("negative probe interval or answer timeout, or headroom past %d bytes", uint64(vramguard.MaxBytes)))
	}
	t := &transport{headroom: p.Headroom, probeEvery: cmp.Or(p.ProbeInterval, defaultProbeInterval),
		answerTimeout: cmp.Or(p.AnswerTimeout, defaultAnswerTimeout), onPlace: p.OnPlace, place: make(chan struct{}, 1)}
	names := map[string]bool{}
	for i, m := range p.Members {
		pm, err := newMember(i, m)
		if err != nil {
			return nil, err
		}
		if names[pm.name] {
			return nil, invalid(op, fmt.Sprintf("member %d: the name %q is taken", i, pm.name))
		}
		names[pm.name] = true
		t.members = append(t.members, pm)
	}
	opts.Host = Host
	// The members' own leases (another program's client of a member)
	// keep their models from the pool's room-making.
	opts.Leases.Honour = slices.Clone(opts.Leases.Honour)
	for _, m := range t.members {
		opts.Leases.Honour = append(opts.Leases.Honour, m.host)
	}
	opts.HTTPClient = &http.Client{Transport: t}
	opts.VRAM = &reader{t: t}
	t.leasesOff = opts.Leases.Off
	c, err := vramguard.NewClient(opts)
	if err != nil {
		return nil, err
	}
	t.c = c
	t.log = slogDiscard
	if opts.Logger != nil {
		t.log = opts.Logger
	}
	return &Pool{OllamaClient: c, t: t}, nil
}

func newMember(i int, m Member) (*member, error) {
	const op = "new pool"
	if m.VRAM == nil || m.Device < 0 {
		return nil, invalid(op, fmt.Sprintf("member %q needs a VRAM reader and a device index of 0 or more", cmp.Or(m.Name, m.Host)))
	}
	if m.Host == "" {
		return nil, invalid(op, fmt.Sprintf("member %d (%q) has no host", i, m.Name))
	}
	base, err := parseHost(m.Host)
	if err != nil {
		return nil, invalid(op, fmt.Sprintf("member %q: %v", cmp.Or(m.Name, m.Host), err))
	}
	hc := m.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	return &member{index: i, name: cmp.Or(m.Name, m.Host), host: m.Host, base: base, hc: hc, api: api.NewClient(base, hc),
		vram: m.VRAM, device: m.Device, up: true, inflight: map[string]int{}, pending: map[string]uint64{}, placed: map[string]uint64{}}, nil
}

// Servers names the members' addresses: the client's runner-process check
// looks for their `ollama serve` processes (see vramguard.Options.HTTPClient).
func (t *transport) Servers() []string {
	out := make([]string, len(t.members))
	for i, m := range t.members {
		out[i] = m.base.String()
	}
	return out
}

// parseHost reads an OLLAMA_HOST-style address: a URL, or host[:port]
// with Ollama's port by default.
func parseHost(h string) (*url.URL, error) {
	if !strings.Contains(h, "://") {
		h = "http://" + h
	}
	u, err := url.Parse(h)
	if err != nil {
		return nil, err
	}
	if u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%q is no http(s) server address", h)
	}
	if u.Port() == "" && u.Scheme == "http" {
		u.Host += ":11434"
	}
	return u, nil
}

// Device is the pool client's device index of the named member: what
// EnsureRequest.Device and PhaseOptions.Device name for that member's GPU.
// ok is false when the pool has no such member.
func (p *Pool) Device(name string) (device int, ok bool) {
	for _, m := range p.t.members {
		if m.name == name {
			return m.index, true
		}
	}
	return 0, false
}

// MemberStatus is one member of a pool, as Members reports it.
type MemberStatus struct {
	Name string
	Host string
	// Device is the member's device in the pool client's numbering
	// (Pool.Device); MemberDevice its index on the member's own reader.
	Device, MemberDevice int
	// Up is false while the member's server does not answer (it is asked
	// again at most every Options.ProbeInterval, by the calls that need it).
	Up bool
	// Models are the models the member listed last, and the ones placed
	// there that no listing has shown or ruled out yet (a load in flight;
	// while the member is down, every one placed there since it last
	// answered); InFlight the pool's requests on each model there now.
	Models   []string
	InFlight map[string]int
}

// Members reports the members in their order. It reads nothing from the
// servers.
func (p *Pool) Members() []MemberStatus {
	out := make([]MemberStatus, 0, len(p.t.members))
	for _, m := range p.t.members {
		m.mu.Lock()
		st := MemberStatus{Name: m.name, Host: m.host, Device: m.index, MemberDevice: m.device, Up: m.up, InFlight: maps.Clone(m.inflight)}
		for _, r := range m.lastLocked() {
			st.Models = append(st.Models, vramguard.NormalizeModelName(r.Model))
		}
		m.mu.Unlock()
		out = append(out, st)
	}
	return out
}

// transport is the pool client's http.RoundTripper.
type transport struct {
	c          *vramguard.OllamaClient
	log        logger
	members    []*member
	headroom   uint64
	probeEvery time.Duration
	// answerTimeout bounds a member's answers: listings, device readings.
	answerTimeout time.Duration
	onPlace       func(context.Context, Placement)
	place         chan struct{} // held by the placement in progress: one at a time
	leasesOff     bool          // Options.Leases.Off: loads placed take no host-wide reservation
}

// member is one member's server, device and state.
type member struct {
	index  int // the device index in the pool client's numbering
	name   string
	host   string
	base   *url.URL
	hc     *http.Client
	api    *api.Client
	vram   vramguard.VRAMReader
	device int

	mu        sync.Mutex
	up        bool
	lastProbe time.Time                  // when a member that is down was last asked
	inflight  map[string]int             // normalized model → requests through the pool
	pending   map[string]uint64          // loads placed here and not listed yet: model → need
	last      []api.ProcessModelResponse // the latest listing, shown while the member is down
	lastDev   *vramguard.DeviceMemory    // the latest reading of its device, as the pool client numbers it
	// placed are the models placed here that no listing has shown yet
	// nor ruled out: a listing rules a model out only when it was asked
	// for after the model's requests had ended, since Ollama lists a
	// model only once its load is over. They count as resident with the
	// latest listing (lastListing). The value is the placement's number
	// (seq): a listing asked for before it rules nothing out.
	placed map[string]uint64
	seq    uint64 // placements made here so far
	// listed is the number of the listing request last sent; shown the
	// number of the one m.last is, so that an older answer arriving late
	// does not replace a newer one.
	listed, shown uint64
}

var _ http.RoundTripper = (*transport)(nil)

// RoundTrip answers the pool client's requests.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch strings.TrimSuffix(req.URL.Path, "/") {
	case "/api/ps":
		return t.listing(req)
	case "/api/tags":
		return t.tags(req)
	case "/api/version":
		return t.first(req, nil)
	case "/api/show":
		return t.show(req)
	case "/api/generate", "/api/chat", "/api/embed", "/api/embeddings":
		return t.call(req)
	}
	drain(req)
	return jsonResponse(req, http.StatusNotImplemented, map[string]string{
		"error": req.URL.Path + " is not served through a vramguard pool: send it to each member's server"})
}

// call forwards a generation, chat or embedding to its member; an unload
// goes to every member that answers.
func (t *transport) call(req *http.Request) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	var r struct {
		Model     string            `json:"model"`
		Prompt    string            `json:"prompt"`
		Images    []json.RawMessage `json:"images"`
		Messages  []json.RawMessage `json:"messages"`
		Input     json.RawMessage   `json:"input"`
		KeepAlive *api.Duration     `json:"keep_alive"`
		Options   map[string]any    `json:"options"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Model == "" {
		return jsonResponse(req, http.StatusBadRequest, map[string]string{"error": "the pool reads no model from the request"})
	}
	if r.KeepAlive != nil && r.KeepAlive.Duration == 0 && r.Prompt == "" && len(r.Images) == 0 && len(r.Messages) == 0 && len(r.Input) == 0 {
		return t.unload(req, body, r.Model)
	}
	m, res, err := t.placeModel(untraced{req.Context()}, r.Model, numCtxOf(r.Options))
	if err != nil {
		return nil, err
	}
	key := vramguard.NormalizeModelName(r.Model) // placeModel counted the call in flight on m
	resp, err := m.forward(req, body)
	// The member answered: its load has ended (Ollama answers once the
	// model is loaded, or failed to load), so the load's reservation has
	// done its work; the device shows the runner from here on.
	t.endLoadReservation(res, r.Model)
	if err != nil {
		m.end(key)
		t.failed(m, err)
		if req.Context().Err() != nil {
			return nil, err
		}
		return nil, t.memberError("generate", r.Model, []*memberErr{{m, err}})
	}
	resp.Body = &endBody{ReadCloser: resp.Body, end: sync.OnceFunc(func() { m.end(key) })}
	return resp, nil
}

// unload sends an unload to every member that answers: a load in flight
// anywhere hears it, and the client verifies against the merged listing.
// A member that holds the model and does not answer fails it at once.
func (t *transport) unload(req *http.Request, body []byte, model string) (*http.Response, error) {
	key := vramguard.NormalizeModelName(model)
	var (
		first   *http.Response // the first success
		refusal *http.Response // else the first member's refusal (404 for a model none has)
		unheard []*memberErr   // members that hold it and did not hear it
		missed  bool           // a member that holds it did not hear it: a refusal then says nothing of the model there
	)
	for _, m := range t.members {
		holds := m.holds(key)
		if !t.ready(req.Context(), m) {
			if holds {
				missed = true
				unheard = append(unheard, &memberErr{m, errDown})
			}
			continue
		}
		resp, err := t.forwardWithin(req, m, body)
		if err != nil {
			t.failed(m, err)
			if holds {
				missed = true
				unheard = append(unheard, &memberErr{m, err})
			}
			continue
		}
		switch {
		case first == nil && resp.StatusCode < 300:
			first = resp
		case refusal == nil && resp.StatusCode >= 300:
			refusal = resp
		default:
			drainClose(resp.Body)
		}
	}
	if len(unheard) > 0 || (refusal != nil && (first != nil || missed)) {
		if refusal != nil {
			drainClose(refusal.Body)
			refusal = nil
		}
	}
	if len(unheard) > 0 {
		if first != nil {
			drainClose(first.Body)
		}
		return nil, t.memberError("unload", model, unheard)
	}
	switch {
	case first != nil:
		return first, nil
	case refusal != nil:
		return refusal, nil
	}
	return nil, &vramguard.Error{Op: "unload", Model: model, Kind: vramguard.KindUnavailable,
		Err: fmt.Errorf("no member of the pool answers (%w)", ErrUnreachable)}
}

// memberError is the call's error for members that did not answer: the
// first one's, typed by its failure, naming every one.
func (t *transport) memberError(op, model string, ms []*memberErr) error {
	errs := make([]error, 0, len(ms))
	kind := vramguard.KindUnavailable
	for i, me := range ms {
		e := &MemberError{Member: me.m.name, Err: me.err}
		switch {
		case errors.Is(me.err, ErrUnreachable):
		case connFailed(me.err):
			e.Err = fmt.Errorf("%w: %s", ErrUnreachable, me.err.Error())
		case i == 0:
			kind = vramguard.KindOf(me.err)
		}
		errs = append(errs, e)
	}
	if len(errs) == 1 {
		return &vramguard.Error{Op: op, Model: model, Kind: kind, Err: errs[0]}
	}
	return &vramguard.Error{Op: op, Model: model, Kind: kind, Err: errors.Join(errs...)}
}

type memberErr struct {
	m   *member
	err error
}

// listing merges the members' /api/ps: a member that does not answer
// shows its last listing, so that its models do not read as gone.
func (t *transport) listing(req *http.Request) (*http.Response, error) {
	var all []api.ProcessModelResponse
	answered := 0
	var lastErr error
	for _, m := range t.members {
		var ms []api.ProcessModelResponse
		err := errDown
		if t.ready(req.Context(), m) {
			ms, err = t.listWithin(req.Context(), m)
		}
		if err != nil {
			t.failed(m, err)
			lastErr = err
			ms = m.lastListing()
		} else {
			answered++
		}
		all = append(all, ms...)
	}
	if answered == 0 {
		return nil, t.noneAnswers(lastErr)
	}
	return jsonResponse(req, http.StatusOK, api.ProcessResponse{Models: merge(all)})
}

// merge lists each model once, as one server does: a model that runs on
// several members (another program loaded it on each) is one model to the
// client, with the sizes of every runner and the latest expiry; an unload
// of it goes to each of them.
func merge(all []api.ProcessModelResponse) []api.ProcessModelResponse {
	var out []api.ProcessModelResponse
	at := map[string]int{}
	for _, m := range all {
		key := vramguard.NormalizeModelName(m.Model)
		i, ok := at[key]
		if !ok {
			at[key] = len(out)
			out = append(out, m)
			continue
		}
		o := &out[i]
		o.Size += m.Size
		o.SizeVRAM += m.SizeVRAM
		if m.ExpiresAt.After(o.ExpiresAt) {
			o.ExpiresAt = m.ExpiresAt
		}
	}
	return out
}

// listWithin lists m within the answer timeout; a member that takes
// longer while ctx still holds is counted down.
func (t *transport) listWithin(ctx context.Context, m *member) ([]api.ProcessModelResponse, error) {
	actx, cancel := context.WithTimeoutCause(ctx, t.answerTimeout,
		fmt.Errorf("%w: pool member %s did not answer within %v", ErrUnreachable, m.name, t.answerTimeout))
	defer cancel()
	ms, err := m.list(actx)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		t.down(m, context.Cause(actx))
		return nil, context.Cause(actx)
	}
	return ms, err
}

// tags merges the members' model lists, one entry per name.
func (t *transport) tags(req *http.Request) (*http.Response, error) {
	seen := map[string]bool{}
	var all []api.ListModelResponse
	var lastErr error
	answered := 0
	for _, m := range t.members {
		if !t.ready(req.Context(), m) {
			continue
		}
		resp, err := m.api.List(req.Context())
		if err != nil {
			t.failed(m, err)
			lastErr = err
			continue
		}
		answered++
		for _, x := range resp.Models {
			if !seen[x.Name] {
				seen[x.Name] = true
				all = append(all, x)
			}
		}
	}
	if answered == 0 {
		return nil, t.noneAnswers(lastErr)
	}
	return jsonResponse(req, http.StatusOK, api.ListResponse{Models: all})
}

func (t *transport) noneAnswers(err error) error {
	return &vramguard.Error{Op: "pool", Kind: vramguard.KindUnavailable,
		Err: fmt.Errorf("no member of the pool answers (%w): %w", ErrUnreachable, cmp.Or(err, errDown))}
}

// show asks the member the model is placed on (or resident on), else the
// first that answers.
func (t *transport) show(req *http.Request) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	var r struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	_ = json.Unmarshal(body, &r)
	key := vramguard.NormalizeModelName(cmp.Or(r.Model, r.Name))
	var order []*member
	for _, m := range t.members {
		if m.holds(key) {
			order = append([]*member{m}, order...)
		} else {
			order = append(order, m)
		}
	}
	return t.first(req, body, order...)
}

// first forwards req to the first member (of order, else all) that
// answers.
func (t *transport) first(req *http.Request, body []byte, order ...*member) (*http.Response, error) {
	if len(order) == 0 {
		order = t.members
	}
	var lastErr error
	for _, m := range order {
		if !t.ready(req.Context(), m) {
			continue
		}
		resp, err := t.forwardWithin(req, m, body)
		if err != nil {
			t.failed(m, err)
			lastErr = err
			continue
		}
		return resp, nil
	}
	return nil, t.noneAnswers(lastErr)
}

// ready reports whether m may be asked: it is up, or it is down and its
// probe is due, and it answers a listing within the answer timeout now.
func (t *transport) ready(ctx context.Context, m *member) bool {
	m.mu.Lock()
	if m.up {
		m.mu.Unlock()
		return true
	}
	if time.Since(m.lastProbe) < t.probeEvery {
		m.mu.Unlock()
		return false
	}
	m.lastProbe = time.Now()
	m.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, t.answerTimeout)
	defer cancel()
	if _, err := m.list(actx); err != nil {
		return false
	}
	m.mu.Lock()
	m.up = true
	m.mu.Unlock()
	t.log.Info("pool member up", "member", m.name)
	return true
}

// failed marks a member down when its server did not answer.
func (t *transport) failed(m *member, err error) {
	if connFailed(err) {
		t.down(m, err)
	}
}

// down marks a member down until it answers again.
func (t *transport) down(m *member, err error) {
	m.mu.Lock()
	was := m.up
	m.up, m.lastProbe = false, time.Now()
	m.mu.Unlock()
	if was {
		t.log.Info("pool member down", "member", m.name, "err", err)
	}
}

// holds reports whether the member listed the model last, has a request
// on it in flight through the pool, or had one placed there since.
func (m *member) holds(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.placed[key]; m.inflight[key] > 0 || ok {
		return true
	}
	return findRunning(m.last, key) != nil
}

func (m *member) end(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inflight[key]--; m.inflight[key] <= 0 {
		delete(m.inflight, key)
		delete(m.pending, key)
	}
}

// list reads the member's /api/ps and keeps it as the last listing.
func (m *member) list(ctx context.Context) ([]api.ProcessModelResponse, error) {
	m.mu.Lock()
	ended := map[string]uint64{} // placed models whose requests had ended before this listing, by placement
	for k, n := range m.placed {
		if m.inflight[k] == 0 {
			ended[k] = n
		}
	}
	m.listed++
	asked := m.listed
	m.mu.Unlock()
	resp, err := m.api.ListRunning(ctx)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	stored := asked > m.shown // an older listing answering late is not kept
	if stored {
		m.last, m.shown = resp.Models, asked
	}
	for k := range m.pending {
		if findRunning(resp.Models, k) != nil {
			delete(m.pending, k)
		}
	}
	for k, n := range m.placed {
		// A placement made since the request went out is not ruled out.
		if e, ok := ended[k]; (ok && e == n) || (stored && findRunning(resp.Models, k) != nil) {
			delete(m.placed, k)
		}
	}
	return resp.Models, nil
}

// lastListing is the latest listing, with the models placed here since
// that it does not show (a load may have ended since): what counts as
// resident on a member that does not answer.
func (m *member) lastListing() []api.ProcessModelResponse {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastLocked()
}

func (m *member) lastLocked() []api.ProcessModelResponse {
	out := slices.Clone(m.last)
	for _, k := range slices.Sorted(maps.Keys(m.placed)) {
		if findRunning(out, k) == nil {
			out = append(out, api.ProcessModelResponse{Name: k, Model: k, ExpiresAt: time.Now().Add(24 * time.Hour)})
		}
	}
	return out
}

// forwardWithin forwards a short request (an unload, /api/show,
// /api/version) within the answer timeout; a member that takes longer
// while the call's ctx still holds is counted down.
func (t *transport) forwardWithin(req *http.Request, m *member, body []byte) (*http.Response, error) {
	ctx := req.Context()
	actx, cancel := context.WithTimeoutCause(ctx, t.answerTimeout,
		fmt.Errorf("%w: pool member %s did not answer within %v", ErrUnreachable, m.name, t.answerTimeout))
	resp, err := m.forward(req.WithContext(actx), body)
	if err != nil {
		cancel()
		if ctx.Err() == nil && actx.Err() != nil {
			t.down(m, context.Cause(actx))
			return nil, context.Cause(actx)
		}
		return nil, err
	}
	// The reply is read after this returns: the timeout stops with its body.
	resp.Body = &endBody{ReadCloser: resp.Body, end: cancel}
	return resp, nil
}

// forward sends req, with body, to the member's server.
func (m *member) forward(req *http.Request, body []byte) (*http.Response, error) {
	u := *m.base
	u.Path = strings.TrimSuffix(u.Path, "/") + req.URL.Path
	u.RawQuery = req.URL.RawQuery
	out, err := http.NewRequestWithContext(req.Context(), req.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = req.Header.Clone()
	if body == nil {
		out.Body, out.ContentLength = http.NoBody, 0
	}
	// Through the member's client, not its Transport alone: a client
	// whose Transport is nil uses the default one, and its Timeout holds.
	return m.hc.Do(out)
}

func findRunning(ms []api.ProcessModelResponse, key string) *api.ProcessModelResponse {
	for i := range ms {
		if vramguard.NormalizeModelName(ms[i].Model) == key || vramguard.NormalizeModelName(ms[i].Name) == key {
			return &ms[i]
		}
	}
	return nil
}

// numCtxOf reads the num_ctx option of a request, 0 when unset.
func numCtxOf(opts map[string]any) int {
	switch v := opts["num_ctx"].(type) {
	case float64:
		return int(v)
	case int:
		return v
	}
	return 0
}

// untraced is the call's context without its net/http client trace, for
// the requests the placement makes itself (members' listings, estimates,
// room-making's unloads): the client reads the trace's WroteHeaders as
// "this call's request went out", which only the forward to the member is.
// Cancellation, deadline and every other value stay the call's.
type untraced struct{ context.Context }

func (u untraced) Value(key any) any {
	v := u.Context.Value(key)
	if _, ok := v.(*httptrace.ClientTrace); ok {
		return nil
	}
	return v
}

// endBody runs end once when the reply's body is closed.
type endBody struct {
	io.ReadCloser
	end func()
}

func (b *endBody) Close() error {
	defer b.end()
	return b.ReadCloser.Close()
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil {
		return nil, nil
	}
	defer req.Body.Close()
	return io.ReadAll(req.Body)
}

func drain(req *http.Request) {
	if req.Body != nil {
		drainClose(req.Body)
	}
}

func drainClose(rc io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(rc, 1<<20))
	_ = rc.Close()
}

func jsonResponse(req *http.Request, status int, v any) (*http.Response, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json; charset=utf-8"}},
		Body:          io.NopCloser(bytes.NewReader(b)),
		ContentLength: int64(len(b)), Request: req,
	}, nil
}
