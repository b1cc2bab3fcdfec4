package vramguardtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ollama/ollama/api"
	omodel "github.com/ollama/ollama/types/model"
)

// Defaults used where a [Config] field is zero.
const (
	DefaultKeepAlive   = 5 * time.Minute
	DefaultUnloadDelay = 20 * time.Millisecond
	DefaultVersion     = "0.17.4-sim"
)

// errClosed is returned to requests cut short by [Server.Close].
var errClosed = &statusError{code: http.StatusServiceUnavailable, msg: "server closed"}

// Config configures a [Server]. The zero value is a server with no models,
// Ollama's defaults and a 24 GiB GPU.
type Config struct {
	// Models are registered at start; more can be added with AddModel.
	Models []ModelConfig

	// DefaultKeepAlive is the keep-alive of a new load whose request sends
	// none (OLLAMA_KEEP_ALIVE). Zero means DefaultKeepAlive (5m), negative
	// means forever.
	DefaultKeepAlive time.Duration

	// UnloadDelay is how long an expired or unloaded runner stays listed by
	// /api/ps after its last reference ended (the time Ollama takes to kill
	// the runner). Zero means DefaultUnloadDelay; negative means none.
	UnloadDelay time.Duration

	// HonorUnloadDuringLoad fixes the race of Ollama 0.17 and later in
	// which an unload that arrives while the model is still loading is
	// lost. The zero value keeps the behaviour of Version: lost from 0.17
	// on (the unload is answered "unload" and ignored), honoured before.
	// It can be changed later with SetLoseUnloadDuringLoad.
	HonorUnloadDuringLoad bool

	// TotalVRAM is the simulated GPU's memory in bytes. Zero means
	// DefaultTotalVRAM (24 GiB).
	TotalVRAM uint64

	// StrictVRAM makes a load that does not fit in free GPU memory first
	// evict idle models, as Ollama's scheduler does, and then fail with
	// Ollama's out-of-memory error. Without it loads always succeed and the
	// ledger may exceed TotalVRAM.
	StrictVRAM bool

	// Offload makes a load that does not fit under StrictVRAM, once idle
	// models are evicted, split the model between GPU and CPU as Ollama
	// does instead of failing: the runner holds only the free memory on
	// the simulated GPU (nothing when none is free), and /api/ps reports
	// that as size_vram next to the model's full size. FaultOOM still
	// fails the load.
	Offload bool

	// ReleaseLag is how long GPU memory stays held after a runner left
	// /api/ps, like a driver that has not yet reclaimed a dead process's
	// memory. Zero means none.
	ReleaseLag time.Duration

	// PSDelay delays every /api/ps reply. See also SetPSDelay.
	PSDelay time.Duration

	// Version is reported by /api/version, and it picks the behaviour of
	// that Ollama release where the simulator knows releases to differ:
	// before 0.17 (for example "0.6.5") an unload that arrives while the
	// model is loading is honoured; from 0.17 on it is lost (answered
	// "unload" and dropped, see HonorUnloadDuringLoad). On every version
	// /api/ps lists nothing while a model loads. Empty means
	// DefaultVersion; a version that does not parse behaves as the
	// default.
	Version string
}

// Server is a simulated Ollama server listening on 127.0.0.1.
// It is safe for concurrent use. Close it when done.
type Server struct {
	cfg       Config
	hs        *httptest.Server
	url       *url.URL
	totalVRAM uint64

	done      chan struct{}  // closed by Close: wakes handlers and loaders
	wg        sync.WaitGroup // loaders and timer callbacks
	closeOnce sync.Once

	mu      sync.Mutex
	closed  bool
	models  map[string]*model // by resolved name
	order   []*model          // registration order
	timers  map[*timer]struct{}
	changed chan struct{} // closed and replaced on every state change
	// inflightWaits are WaitInFlight's callers, checked under mu at every
	// change, so that a window shorter than a waiter's wake-up is seen.
	inflightWaits map[*inflightWait]struct{}
	holdings      map[uint32]*holding
	external      map[string]*holding
	lastPID       uint32
	lose          bool
	psDelay       time.Duration
	callSeq       uint64  // numbers recorded calls across models
	events        []Event // the last maxEvents events, oldest first

	toolCallIDs atomic.Uint64 // numbers the IDs given to tool calls
}

// New starts a simulated Ollama server on 127.0.0.1 with cfg. Like
// httptest.NewServer it panics if it cannot listen or if cfg holds an
// invalid or duplicate model name.
func New(cfg Config) *Server {
	if cfg.DefaultKeepAlive == 0 {
		cfg.DefaultKeepAlive = DefaultKeepAlive
	} else if cfg.DefaultKeepAlive < 0 {
		cfg.DefaultKeepAlive = math.MaxInt64
	}
	if cfg.UnloadDelay == 0 {
		cfg.UnloadDelay = DefaultUnloadDelay
	}
	if cfg.Version == "" {
		cfg.Version = DefaultVersion
	}
	s := &Server{
		cfg:       cfg,
		totalVRAM: cfg.TotalVRAM,
		done:      make(chan struct{}),
		models:    make(map[string]*model),
		timers:    make(map[*timer]struct{}),
		changed:   make(chan struct{}),
		holdings:  make(map[uint32]*holding),
		external:  make(map[string]*holding),
		lastPID:   40000,
		lose:      !cfg.HonorUnloadDuringLoad && !versionBefore(cfg.Version, 0, 17),
		psDelay:   cfg.PSDelay,
	}
	if s.totalVRAM == 0 {
		s.totalVRAM = DefaultTotalVRAM
	}
	for _, m := range cfg.Models {
		if err := s.AddModel(m); err != nil {
			panic("sim: " + err.Error())
		}
	}
	s.hs = httptest.NewServer(s.routes())
	u, err := url.Parse(s.hs.URL)
	if err != nil {
		s.hs.Close()
		panic("sim: " + err.Error())
	}
	s.url = u
	return s
}

// URL returns the server's base URL, for api.NewClient or OLLAMA_HOST.
func (s *Server) URL() *url.URL {
	u := *s.url
	return &u
}

// APIClient returns Ollama's own api.Client for the server: another
// program's client in a test (a chat UI, `ollama run`), which vramguard
// neither sees nor manages. It is not a vramguard client: for one, use
// NewClient, or vramguard.NewClient with Options.Host set to URL (passing
// this one as Options.API leaves the client without its server's address,
// so it takes no leases). Its HTTP client's idle connections are closed by
// Close.
func (s *Server) APIClient() *api.Client {
	return api.NewClient(s.URL(), s.hs.Client())
}

// Close stops the server: in-flight requests are cut short, timers are
// stopped, and every goroutine the server started has returned when Close
// returns. It is safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		for tm := range s.timers {
			s.stopLocked(tm)
		}
		s.mu.Unlock()
		s.hs.Close()
		s.wg.Wait()
	})
}

// AddModel registers a model, as if it had been pulled.
// It is safe for concurrent use.
func (s *Server) AddModel(cfg ModelConfig) error {
	key, short, ok := modelName(cfg.Name)
	if !ok {
		return fmt.Errorf("invalid model name %q", cfg.Name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.models[key]; dup {
		return fmt.Errorf("model %q already registered", cfg.Name)
	}
	m := &model{
		key:   key,
		short: short,
		name:  omodel.ParseName(cfg.Name).String(),
		cfg:   cfg.withDefaults(short),
		added: time.Now(),
	}
	s.models[key] = m
	s.order = append(s.order, m)
	s.notifyLocked()
	return nil
}

// SetLoseUnloadDuringLoad chooses whether an unload that arrives while the
// model is loading is lost (true, Ollama v0.17.x) or applied once the load
// finishes (false, as in v0.6.5). It is safe for concurrent use.
func (s *Server) SetLoseUnloadDuringLoad(lose bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lose = lose
}

// SetPSDelay delays every later /api/ps reply by d. It is safe for
// concurrent use.
func (s *Server) SetPSDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.psDelay = d
}

// SetFaults makes every later request for the named model suffer faults,
// until called again; no faults clears them. It is safe for concurrent use.
func (s *Server) SetFaults(name string, fs ...Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.lookupLocked(name)
	if err != nil {
		return err
	}
	m.faults = faults(fs)
	return nil
}

// FailNext makes the next request for the named model that reaches the
// scheduler (any generate or chat request but an unload) suffer faults,
// on top of those set with SetFaults. Calls queue up: each is used by one
// request. It is safe for concurrent use.
func (s *Server) FailNext(name string, fs ...Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.lookupLocked(name)
	if err != nil {
		return err
	}
	m.next = append(m.next, faults(fs))
	return nil
}

// Stats counts what happened to a model.
type Stats struct {
	Requests     int // generate and chat requests, unloads included
	Loads        int // loads that finished successfully
	LoadFailures int // loads that failed (faults, out of memory)
	Unloads      int // times the model left /api/ps
	Evictions    int // unloads forced to make room (StrictVRAM)
	Cancelled    int // requests whose client went away (Ollama logs 499)
	Crashes      int // runners killed mid-stream by FaultCrash
	Completed    int // replies that ended with done:true after generating
}

// Stats returns the counters of the named model, or the sum over all models
// when name is "". An unknown model has zero counters. It is safe for
// concurrent use.
func (s *Server) Stats(name string) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name != "" {
		if m, err := s.lookupLocked(name); err == nil {
			return m.stats
		}
		return Stats{}
	}
	var t Stats
	for _, m := range s.order {
		t.Requests += m.stats.Requests
		t.Loads += m.stats.Loads
		t.LoadFailures += m.stats.LoadFailures
		t.Unloads += m.stats.Unloads
		t.Evictions += m.stats.Evictions
		t.Cancelled += m.stats.Cancelled
		t.Crashes += m.stats.Crashes
		t.Completed += m.stats.Completed
	}
	return t
}

// Loads returns how many loads of the named model ("" for all) finished.
func (s *Server) Loads(name string) int { return s.Stats(name).Loads }

// Unloads returns how many times the named model ("" for all) left /api/ps.
func (s *Server) Unloads(name string) int { return s.Stats(name).Unloads }

// Requests returns how many generate and chat requests named the model
// ("" for all).
func (s *Server) Requests(name string) int { return s.Stats(name).Requests }

// Cancelled returns how many requests for the named model ("" for all) were
// abandoned by their client.
func (s *Server) Cancelled(name string) int { return s.Stats(name).Cancelled }

// RunnerState is a snapshot of a model's runner.
type RunnerState struct {
	Model     string        // short name, as /api/ps shows it
	PID       uint32        // fake process id of this runner
	Loading   bool          // still loading: not yet listed by /api/ps
	Dead      bool          // crashed: still listed, reloaded by the next request
	Expiring  bool          // an unload or expiry is pending
	Refs      int           // requests holding the runner, loading ones included
	InFlight  int           // requests being served (past loading)
	KeepAlive time.Duration // the sticky keep-alive (math.MaxInt64 for forever)
	ExpiresAt time.Time     // as /api/ps reports it
	SizeVRAM  uint64        // on the GPU: the model's SizeVRAM, or less after an offload
}

// Running returns a snapshot of every runner, loading ones included,
// in registration order of their models. It is safe for concurrent use.
func (s *Server) Running() []RunnerState {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []RunnerState
	for _, m := range s.order {
		if r := m.runner; r != nil {
			out = append(out, RunnerState{
				Model:     m.short,
				PID:       r.pid,
				Loading:   r.loading,
				Dead:      r.dead,
				Expiring:  r.doomed,
				Refs:      r.refs,
				InFlight:  m.inFlight,
				KeepAlive: r.keepAlive,
				ExpiresAt: r.expiresAtFor(now),
				SizeVRAM:  r.vram,
			})
		}
	}
	return out
}

// Listed reports whether /api/ps would list the named model now.
func (s *Server) Listed(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.lookupLocked(name)
	return err == nil && m.runner != nil && !m.runner.loading
}

// InFlight returns how many requests for the named model are being served
// right now, past loading. It is safe for concurrent use.
func (s *Server) InFlight(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, err := s.lookupLocked(name); err == nil {
		return m.inFlight
	}
	return 0
}

// inflightWait is one WaitInFlight: done is closed once the model had n
// requests in flight at some change.
type inflightWait struct {
	name string
	n    int
	done chan struct{}
}

// WaitInFlight blocks until at least n requests for the named model are
// being served, or ctx is done (it then returns context.Cause(ctx)), or
// the server is closed. It sees every such moment from its call on,
// however short: the count is checked under the server's lock at each
// change, not when the waiter wakes up.
func (s *Server) WaitInFlight(ctx context.Context, name string, n int) error {
	w := &inflightWait{name: name, n: n, done: make(chan struct{})}
	s.mu.Lock()
	if s.inflightWaits == nil {
		s.inflightWaits = make(map[*inflightWait]struct{})
	}
	s.inflightWaits[w] = struct{}{}
	s.checkInFlightLocked()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.inflightWaits, w)
		s.mu.Unlock()
	}()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-s.done:
		return errors.New("sim: server closed")
	}
}

// checkInFlightLocked releases the WaitInFlight callers whose count is
// reached now.
func (s *Server) checkInFlightLocked() {
	for w := range s.inflightWaits {
		if m, err := s.lookupLocked(w.name); err == nil && m.inFlight >= w.n {
			close(w.done)
			delete(s.inflightWaits, w)
		}
	}
}

// WaitFor blocks until cond returns true, or ctx is done (it then returns
// context.Cause(ctx)), or the server is closed. cond is called at once and
// after every change of the server's state; it may call the Server's
// inspection methods (Running, Listed, Stats, Memory...).
func (s *Server) WaitFor(ctx context.Context, cond func() bool) error {
	return waitChange(ctx, &s.mu, &s.changed, s.done, "sim: server closed", cond)
}

// waitChange is WaitFor of the fake Ollama: cond is
// called at once and after every close of *changed (read under mu, which
// notifyLocked closes and replaces), until it holds, ctx ends or done is
// closed (an error saying closed).
func waitChange(ctx context.Context, mu *sync.Mutex, changed *chan struct{}, done <-chan struct{}, closed string, cond func() bool) error {
	for {
		mu.Lock()
		ch := *changed
		mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-done:
			return errors.New(closed)
		}
	}
}

// notifyLocked wakes WaitFor callers.
func (s *Server) notifyLocked() {
	s.checkInFlightLocked()
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) lookupLocked(name string) (*model, error) {
	key, _, ok := modelName(name)
	if !ok {
		return nil, fmt.Errorf("invalid model name %q", name)
	}
	m, ok := s.models[key]
	if !ok {
		return nil, fmt.Errorf("model %q not found", name)
	}
	return m, nil
}

// timer is a callback owned by the Server: Close stops it or waits for it.
type timer struct{ t *time.Timer }

// afterLocked runs f with s.mu held after d, unless the timer is stopped or
// the server closed first. It returns nil once the server is closed.
func (s *Server) afterLocked(d time.Duration, f func()) *timer {
	if s.closed {
		return nil
	}
	tm := &timer{}
	s.timers[tm] = struct{}{}
	s.wg.Add(1)
	tm.t = time.AfterFunc(d, func() {
		defer s.wg.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, live := s.timers[tm]; !live {
			return // stopped while firing
		}
		delete(s.timers, tm)
		f()
		s.notifyLocked()
	})
	return tm
}

// stopLocked cancels tm; a nil or spent timer is ignored.
func (s *Server) stopLocked(tm *timer) {
	if tm == nil {
		return
	}
	if _, live := s.timers[tm]; !live {
		return
	}
	delete(s.timers, tm)
	if tm.t.Stop() {
		s.wg.Done() // the callback will never run
	}
}

// KillRunner kills the named model's runner as a SIGKILL would, if it has
// one that is loaded and alive: like a crash (FaultCrash), the dead runner
// stays listed by /api/ps, its GPU memory is freed, and the next request
// reloads the model. Streams in progress on it go on (the simulator's
// requests do not run in the runner). It reports whether a runner was
// killed.
func (s *Server) KillRunner(name string) bool {
	s.mu.Lock()
	m, err := s.lookupLocked(name)
	if err != nil || m.runner == nil || m.runner.loading || m.runner.dead {
		s.mu.Unlock()
		return false
	}
	defer s.mu.Unlock()
	r := m.runner
	r.dead = true
	r.m.stats.Crashes++
	s.eventLocked(r.m, EventCrashed, nil)
	s.freeHoldingLocked(r, false)
	s.notifyLocked()
	return true
}

// Restart plays a restart of the server process: every client connection
// is cut, so requests in flight fail as they do when a server dies, and
// every runner is gone at once (a loading one is unloaded as soon as its
// load ends, if it ends). Models stay registered. A client's idle
// keep-alive connection is cut too: its next request may fail once with
// EOF (vramguard.KindTransient), as against a real server that
// restarted. The double has no `ollama serve` process, so a client tells
// the restart (vramguard.ReloadRestarted) only from a connection that
// failed in between, not from an idle restart: a model that left then
// reads as another program's unload.
func (s *Server) Restart() {
	s.hs.CloseClientConnections()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.order {
		switch r := m.runner; {
		case r == nil:
		case r.loading:
			r.doomed = true
			r.keepAlive = 0
		default:
			s.removeRunnerLocked(r)
		}
	}
	s.notifyLocked()
}

// versionBefore reports whether an Ollama version ("0.6.5", "v0.17.4",
// "0.17.4-sim") is older than major.minor; false when it does not parse.
func versionBefore(v string, major, minor int) bool {
	v = strings.TrimPrefix(v, "v")
	v, _, _ = strings.Cut(v, "-")
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma < major || (ma == major && mi < minor)
}
