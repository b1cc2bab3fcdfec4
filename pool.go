package vramguard

// A pool of Ollama servers, one per GPU, behind one client: the client's
// requests go through the pool's transport, which places each load on a
// member (placement.go decides), sends unloads to every member, merges
// the listings, and skips members that stop answering until they answer
// again.

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
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
)

// PoolMember is one server of a pool and the device it owns: an `ollama
// serve` started with CUDA_VISIBLE_DEVICES naming one GPU and its own
// OLLAMA_HOST.
type PoolMember struct {
	// Name names the member in placements, errors and logs; "" means Host.
	Name string
	// Host is the member's server, as OLLAMA_HOST writes it.
	Host string
	// VRAM reads the member's device; Device is its index there (one NVML
	// reader may serve every member, each with its own index). Required:
	// a pool places loads by measured room.
	VRAM   VRAMReader
	Device int
	// HTTPClient reaches the member (its Timeout, redirects and
	// Transport apply, as Options.HTTPClient's do for one server); nil
	// means a client with no overall timeout on http.DefaultTransport.
	HTTPClient *http.Client
}

// PoolOptions configures NewPool.
type PoolOptions struct {
	Members []PoolMember
	// Headroom is kept free on a device beyond a model's estimate.
	Headroom uint64
	// ProbeInterval is how often a member that stopped answering is asked
	// again; zero means 2 s.
	ProbeInterval time.Duration
	// AnswerTimeout bounds a member's listing and device reading when a
	// call is placed: a member that takes longer (a server that accepts
	// connections and hangs) is counted down, as one that refuses them,
	// and probed until it answers. Members are asked side by side. Zero
	// means 5 s.
	AnswerTimeout time.Duration
}

const (
	defaultProbeInterval = 2 * time.Second
	defaultAnswerTimeout = 5 * time.Second
	// poolHost is the pool client's own server address: no server
	// listens there; the pool's transport answers. A .localhost name, so
	// the client checks runner processes on this machine, where the
	// members run.
	poolHost = "http://vramguard-pool.localhost"
	// poolHostRemote is the pool's address when a member is on another
	// machine: not a local name, so no runner process is looked for here.
	poolHostRemote = "http://vramguard-pool.invalid"
)

// NewPool returns a client whose generations, chats, guards, sessions,
// phases and unloads work across several Ollama servers, one per GPU, as
// they do on one: each load goes to a member chosen by the facts, in this
// order (see PlaceReason): a member where the model is resident; else the
// one whose device has the most measured room for the model's estimate
// plus the headroom; else the member where making room costs least,
// never unloading protected models, models leased by another program
// (another pool's included) or ones in use, and the pool's own leased
// models (its phases') only when no other member's room can be made; else
// the call fails with KindOutOfMemory and a *RoomError naming the need
// and, per device (RoomError.Devices), the free bytes and the holders.
// Room-making on a member is the one of one server (EnsureFree's), with
// the pool's rules for what is kept. A model resident on a
// member stays there, so a phase keeps each model on the member it was
// placed on. Each decision is Generation.Placement, Hooks.OnPlace and an
// INFO log line. One placement runs at a time; a caller waiting for its
// turn gives up when its ctx ends.
//
// An unload goes to every member and is verified across them; while a
// member is down, against its last listing and the models placed there
// since. A member whose server stops answering (or takes longer than
// AnswerTimeout) is skipped for new work (calls in flight there fail with
// their own kind), asked again every ProbeInterval, and used again once
// it answers; its models count as resident until it does, so an unload of
// one of them is not reported verified. UnloadAll, Close and Shutdown
// cover every member; EnsureFree works on one member's device
// (EnsureRequest.Member). Close (or Shutdown) also stops the pool's
// prober: call it, as for any client.
//
// opts are the client's options; Host, API, HTTPClient, VRAM, Budget,
// VerifyVRAM and Fallback must be unset (the members have them, the pool
// admits loads itself). Leases name the pool's own address, so another
// program sees a pool's leases only through a pool. Runner processes are
// checked on this machine only when every member is local. The reload
// report tells no server restart on a pool (see ReloadRestarted).
func NewPool(p PoolOptions, opts Options) (*OllamaClient, error) {
	const op = "new pool"
	if len(p.Members) == 0 {
		return nil, invalid(op, "", "a pool needs at least one member")
	}
	if opts.Host != "" || opts.API != nil || opts.HTTPClient != nil || opts.VRAM != nil || opts.Budget != nil || opts.VerifyVRAM || opts.Fallback {
		return nil, invalid(op, "", "Host, API, HTTPClient, VRAM, Budget, VerifyVRAM and Fallback belong to the members: leave them unset")
	}
	if p.ProbeInterval < 0 || p.AnswerTimeout < 0 || p.Headroom > maxBytes {
		return nil, invalid(op, "", "negative probe interval or answer timeout, or headroom past %d bytes", uint64(maxBytes))
	}
	pl := &pool{headroom: p.Headroom, probeEvery: cmp.Or(p.ProbeInterval, defaultProbeInterval),
		answerTimeout: cmp.Or(p.AnswerTimeout, defaultAnswerTimeout), stop: make(chan struct{}), place: make(chan struct{}, 1)}
	names := map[string]bool{}
	for i, m := range p.Members {
		pm, err := newPoolMember(m, opts)
		if err != nil {
			pl.closeMembers()
			return nil, err
		}
		if names[pm.name] {
			pl.closeMembers()
			return nil, invalid(op, "", "member %d: the name %q is taken", i, pm.name)
		}
		names[pm.name] = true
		pl.members = append(pl.members, pm)
	}
	opts.Host = poolHost
	for _, m := range pl.members {
		if !isLocalHost(m.c.host) {
			// A remote member's runners cannot be seen from here: the
			// client checks none (its reports say "remote server").
			opts.Host = poolHostRemote
		}
	}
	opts.HTTPClient = &http.Client{Transport: pl}
	c, err := NewClient(opts)
	if err != nil {
		pl.closeMembers()
		return nil, err
	}
	pl.c, pl.log = c, c.log
	c.pool = pl
	// The merged listing shows made-up expiries for a member that is
	// down: the reload report does not read it (see ReloadEvent).
	c.ps.seen = nil
	pl.wg.Add(1)
	go pl.probe()
	return c, nil
}

func newPoolMember(m PoolMember, opts Options) (*poolMember, error) {
	const op = "new pool"
	if m.VRAM == nil || m.Device < 0 {
		return nil, invalid(op, "", "member %q needs a VRAM reader and a device index of 0 or more", cmp.Or(m.Name, m.Host))
	}
	hc := m.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	// The member's own client: estimates, listings and room-making there,
	// with the pool's protected models and lease directory, and the
	// pool's unload and wait hooks, so that an eviction on a member is
	// seen as the budget's are on one server.
	h := opts.Hooks
	mo := Options{Host: m.Host, HTTPClient: hc, VRAM: m.VRAM, Protected: opts.Protected, Leases: opts.Leases,
		Logger: opts.Logger, PollInterval: opts.PollInterval, UnloadTimeout: opts.UnloadTimeout,
		VRAMPollInterval: opts.VRAMPollInterval, KeepModelsOnClose: true,
		Hooks: Hooks{OnCleanupFailed: h.OnCleanupFailed, OnVRAMWait: h.OnVRAMWait, OnUnloadStart: h.OnUnloadStart, OnUnloadEnd: h.OnUnloadEnd}}
	mc, err := NewClient(mo)
	if err != nil {
		return nil, err
	}
	if mc.host == "" {
		_ = mc.Close()
		return nil, invalid(op, "", "member %q has no host", m.Name)
	}
	return &poolMember{name: cmp.Or(m.Name, mc.host), base: mc.base, hc: hc, c: mc, vram: m.VRAM, device: m.Device,
		up: true, inflight: map[string]int{}, pending: map[string]uint64{}, placed: map[string]bool{}}, nil
}

// pool is the transport of a pool client (http.RoundTripper).
type pool struct {
	c          *OllamaClient
	log        interface{ Info(string, ...any) }
	members    []*poolMember
	headroom   uint64
	probeEvery time.Duration
	// answerTimeout bounds a member's answers during a placement.
	answerTimeout time.Duration
	place         chan struct{} // held by the placement in progress: one at a time, as the budget admits one load at a time
	stop          chan struct{}
	stopOnce      sync.Once
	wg            sync.WaitGroup
}

// poolMember is one member's server, device and state.
type poolMember struct {
	name   string
	base   *url.URL
	hc     *http.Client
	c      *OllamaClient
	vram   VRAMReader
	device int

	mu       sync.Mutex
	up       bool
	inflight map[string]int             // normalized model → requests through the pool
	pending  map[string]uint64          // loads placed here and not listed yet: model → need
	last     []api.ProcessModelResponse // the latest listing, shown while the member is down
	// placed are the models placed here that no listing has shown yet
	// nor ruled out: a listing rules a model out only when it was asked
	// for after the model's requests had ended, since Ollama lists a
	// model only once its load is over. They count as resident with
	// the latest listing (lastListing).
	placed map[string]bool
}

var _ http.RoundTripper = (*pool)(nil)

// RoundTrip answers the pool client's requests.
func (p *pool) RoundTrip(req *http.Request) (*http.Response, error) {
	switch strings.TrimSuffix(req.URL.Path, "/") {
	case "/api/ps":
		return p.listing(req)
	case "/api/tags":
		return p.tags(req)
	case "/api/version":
		return p.first(req, nil)
	case "/api/show":
		return p.show(req)
	case "/api/generate", "/api/chat", "/api/embed", "/api/embeddings":
		return p.call(req)
	}
	drain(req)
	return jsonResponse(req, http.StatusNotImplemented, map[string]string{
		"error": req.URL.Path + " is not served through a vramguard pool: send it to each member's server"})
}

// call forwards a generation, chat or embedding to its member; an unload
// goes to every member that answers.
func (p *pool) call(req *http.Request) (*http.Response, error) {
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
		return p.unload(req, body, r.Model)
	}
	m, pl, err := p.placeModel(req.Context(), r.Model, numCtxOf(r.Options))
	if err != nil {
		return nil, err
	}
	if slot, ok := req.Context().Value(placementKey{}).(*placementSlot); ok {
		slot.set(pl)
	}
	key := NormalizeModelName(r.Model) // placeModel counted the call in flight on m
	resp, err := m.forward(req, body)
	if err != nil {
		m.end(key)
		p.failed(m, err)
		return nil, err
	}
	resp.Body = &endBody{ReadCloser: resp.Body, end: sync.OnceFunc(func() { m.end(key) })}
	return resp, nil
}

// unload sends an unload to every member that answers: a load in flight
// anywhere hears it, and the client's verification reads every listing.
func (p *pool) unload(req *http.Request, body []byte, model string) (*http.Response, error) {
	var (
		first   *http.Response // the first success
		refusal *http.Response // else the first member's refusal (404 for a model none has)
		lastErr error
		missed  bool // a member did not hear it: a refusal then says nothing of the model there
	)
	for _, m := range p.members {
		if !m.isUp() {
			missed = true
			continue
		}
		resp, err := m.forward(req, body)
		if err != nil {
			p.failed(m, err)
			lastErr, missed = err, true
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
	if refusal != nil && (first != nil || missed) {
		drainClose(refusal.Body)
		refusal = nil
	}
	switch {
	case first != nil:
		return first, nil
	case refusal != nil:
		return refusal, nil
	case lastErr == nil:
		lastErr = fmt.Errorf("unload of %s: the members that answer do not have it, and the others do not answer", model)
	}
	return nil, lastErr
}

// listing merges the members' /api/ps: a member that does not answer
// shows its last listing, so that its models do not read as gone.
func (p *pool) listing(req *http.Request) (*http.Response, error) {
	var all []api.ProcessModelResponse
	answered := 0
	var lastErr error
	for _, m := range p.members {
		ms, err := m.list(req.Context(), m.isUp())
		if err != nil {
			p.failed(m, err)
			lastErr = err
			ms = m.lastListing()
		} else {
			answered++
		}
		all = append(all, ms...)
	}
	if answered == 0 {
		return nil, lastErr
	}
	return jsonResponse(req, http.StatusOK, api.ProcessResponse{Models: all})
}

// tags merges the members' model lists, one entry per name.
func (p *pool) tags(req *http.Request) (*http.Response, error) {
	seen := map[string]bool{}
	var all []api.ListModelResponse
	var lastErr error
	answered := 0
	for _, m := range p.members {
		if !m.isUp() {
			continue
		}
		resp, err := m.c.api.List(req.Context())
		if err != nil {
			p.failed(m, err)
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
		return nil, cmp.Or(lastErr, errors.New("no member of the pool answers"))
	}
	return jsonResponse(req, http.StatusOK, api.ListResponse{Models: all})
}

// show asks the member the model is placed on (or resident on), else the
// first that answers.
func (p *pool) show(req *http.Request) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	var r struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	_ = json.Unmarshal(body, &r)
	key := NormalizeModelName(cmp.Or(r.Model, r.Name))
	var order []*poolMember
	for _, m := range p.members {
		if m.holds(key) {
			order = append([]*poolMember{m}, order...)
		} else {
			order = append(order, m)
		}
	}
	return p.first(req, body, order...)
}

// first forwards req to the first member (of order, else all) that
// answers.
func (p *pool) first(req *http.Request, body []byte, order ...*poolMember) (*http.Response, error) {
	if len(order) == 0 {
		order = p.members
	}
	var lastErr error
	for _, m := range order {
		if !m.isUp() {
			continue
		}
		resp, err := m.forward(req, body)
		if err != nil {
			p.failed(m, err)
			lastErr = err
			continue
		}
		return resp, nil
	}
	return nil, cmp.Or(lastErr, errors.New("no member of the pool answers"))
}

// failed marks a member down when its server did not answer.
func (p *pool) failed(m *poolMember, err error) {
	if !connFailed(err) {
		return
	}
	p.down(m, err)
}

// down marks a member down until a probe finds it answering.
func (p *pool) down(m *poolMember, err error) {
	m.mu.Lock()
	was := m.up
	m.up = false
	m.mu.Unlock()
	if was {
		p.log.Info("pool member down", "member", m.name, "err", err)
	}
}

// probe asks members that are down whether they answer again.
func (p *pool) probe() {
	defer p.wg.Done()
	t := time.NewTicker(p.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		for _, m := range p.members {
			if m.isUp() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), p.probeEvery)
			_, err := m.list(ctx, true)
			cancel()
			if err == nil {
				m.mu.Lock()
				m.up = true
				m.mu.Unlock()
				p.log.Info("pool member up", "member", m.name)
			}
		}
	}
}

// close stops the prober and closes the members' clients.
func (p *pool) close() error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait()
	return p.closeMembers()
}

func (p *pool) closeMembers() error {
	var errs []error
	for _, m := range p.members {
		errs = append(errs, m.c.Close())
	}
	return errors.Join(errs...)
}

func (m *poolMember) isUp() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.up
}

// holds reports whether the member listed the model last, has a request
// on it in flight through the pool, or had one placed there since.
func (m *poolMember) holds(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inflight[key] > 0 || m.placed[key] {
		return true
	}
	return findRunning(m.last, key) != nil
}

func (m *poolMember) end(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inflight[key]--; m.inflight[key] <= 0 {
		delete(m.inflight, key)
		delete(m.pending, key)
	}
}

// list reads the member's /api/ps (when ask; else it fails at once) and
// keeps it as the last listing.
func (m *poolMember) list(ctx context.Context, ask bool) ([]api.ProcessModelResponse, error) {
	if !ask {
		return nil, fmt.Errorf("pool member %s is down", m.name)
	}
	m.mu.Lock()
	ended := map[string]bool{} // placed models whose requests had ended before this listing
	for k := range m.placed {
		if m.inflight[k] == 0 {
			ended[k] = true
		}
	}
	m.mu.Unlock()
	resp, err := m.c.api.ListRunning(ctx)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.last = resp.Models
	for k := range m.pending {
		if findRunning(resp.Models, k) != nil {
			delete(m.pending, k)
		}
	}
	for k := range m.placed {
		if ended[k] || findRunning(resp.Models, k) != nil {
			delete(m.placed, k)
		}
	}
	return resp.Models, nil
}

// lastListing is the latest listing, with the models placed here since
// that it does not show (a load may have ended since): what counts as
// resident on a member that does not answer.
func (m *poolMember) lastListing() []api.ProcessModelResponse {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastLocked()
}

func (m *poolMember) lastLocked() []api.ProcessModelResponse {
	out := slices.Clone(m.last)
	for _, k := range slices.Sorted(maps.Keys(m.placed)) {
		if findRunning(out, k) == nil {
			out = append(out, api.ProcessModelResponse{Name: k, Model: k, ExpiresAt: time.Now().Add(24 * time.Hour)})
		}
	}
	return out
}

// forward sends req, with body, to the member's server.
func (m *poolMember) forward(req *http.Request, body []byte) (*http.Response, error) {
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

// placementKey marks, in a call's context, where the pool writes its
// decision for the call's Generation.
type placementKey struct{}

type placementSlot struct {
	mu sync.Mutex
	p  *Placement
}

func (s *placementSlot) set(p Placement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.p = &p
}

func (s *placementSlot) get() *Placement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
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
