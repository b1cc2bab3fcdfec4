package vramguard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vramguard/vramguard/internal/lease"
)

// defaultPhaseKeepAlive is the keep-alive sent by generations inside a
// Phase: long enough to keep a model warm between the steps of a prompt
// stage, short enough to act as a server-side dead-man switch if the
// process dies before the phase ends.
const defaultPhaseKeepAlive = 2 * time.Minute

// users returns how many guarded uses of model are running in this client.
func (c *OllamaClient) users(model string) int { return c.book.users(model) }

// Guard runs LLM work on one model and always cleans up after it. Prompt
// nodes embed it; its fields are the node's lifecycle settings.
//
// The zero value (with Client set) unloads the model after use, verified,
// synchronously: the original "Unload After Use" switch, on. A use that
// sent no request leaves the model alone, and a cleanup failure comes back
// as KindUnverified, never as the kind of a failed generation (see Run).
// A Guard is safe for concurrent use as long as its fields are not changed
// meanwhile.
//
// Fields that would be ignored (KeepLoaded, Async or Release with Phase;
// Async with KeepLoaded and no Release) fail with KindInvalidInput.
type Guard struct {
	// Client is required.
	Client *OllamaClient
	// KeepLoaded turns "unload after use" off: generations send no
	// keep-alive (the server's setting, 5 minutes by default) and nothing
	// is unloaded.
	KeepLoaded bool
	// Async runs the after-use cleanup in the background (joined by the
	// client's Wait and Close). A panic always cleans up synchronously.
	Async bool
	// Release runs, after the unload, the Release of the client's
	// tenants on no device (Tenant.Device -1: an allocator's cache, say),
	// then the GC, as ReleaseVRAM does for every tenant; tenants on a
	// device are left to room-making (see Tenant).
	Release bool
	// Phase, when set, makes generations keep the model warm with the
	// phase's keep-alive and leaves the unload to Phase.End.
	Phase *Phase
}

// Session is a guarded use of one model, valid inside Guard.Run: used
// after Run returned it fails with ErrSessionEnded, and in a phase after
// Phase.End with ErrPhaseEnded (both KindInvalidInput), sending nothing.
type Session struct {
	g     *Guard
	model string
	ended atomic.Bool
}

// Model returns the session's model.
func (s *Session) Model() string { return s.model }

// KeepAlive returns the keep-alive the session's generations send.
func (s *Session) KeepAlive() KeepAlive {
	switch {
	case s.g.Phase != nil:
		return s.g.Phase.keepAlive
	case s.g.KeepLoaded:
		return KeepAliveServerDefault
	case s.g.Client.users(s.model) > 1:
		// Another goroutine uses the model too: an unload-now keep-alive
		// would unload it under that user between two of its calls. The
		// last user's verified unload ends it instead.
		return KeepAliveFor(defaultPhaseKeepAlive)
	}
	return KeepAliveUnload
}

// Generate runs one generation on the session's model (req.Model may be
// empty; if set it must name the same model).
func (s *Session) Generate(ctx context.Context, req *GenerateRequest, fn ChunkFunc) (*Generation, error) {
	const op = "generate"
	if req == nil {
		return nil, invalid(op, s.model, "request is nil")
	}
	r := *req
	if err := s.check(op, &r.Model); err != nil {
		return nil, err
	}
	// The phase, if any, counted this use when Run began.
	return s.g.Client.GenerateStreaming(ctx, &r, s.KeepAlive(), fn)
}

// Chat runs one chat turn on the session's model (req.Model may be empty;
// if set it must name the same model), with the same keep-alive and
// accounting as Generate.
func (s *Session) Chat(ctx context.Context, req *ChatRequest, fn ChunkFunc) (*Generation, error) {
	const op = "chat"
	if req == nil {
		return nil, invalid(op, s.model, "request is nil")
	}
	r := *req
	if err := s.check(op, &r.Model); err != nil {
		return nil, err
	}
	return s.g.Client.ChatStreaming(ctx, &r, s.KeepAlive(), fn)
}

// check refuses a session used out of its scope, and fills in or checks
// a request's model.
func (s *Session) check(op string, model *string) error {
	if s.ended.Load() {
		return newError(op, s.model, KindInvalidInput, ErrSessionEnded)
	}
	if p := s.g.Phase; p != nil && p.isSealed() {
		return newError("phase "+p.name, s.model, KindInvalidInput, ErrPhaseEnded)
	}
	if *model == "" {
		*model = s.model
	} else if NormalizeModelName(*model) != NormalizeModelName(s.model) {
		return invalid(op, *model, "session is for model %q", s.model)
	}
	return nil
}

func (g *Guard) validate(op, model string) error {
	if g == nil || g.Client == nil {
		return invalid(op, model, "guard has no client")
	}
	// The eight combinations that mean something; the other eight would
	// be silently ignored.
	switch {
	case g.Phase != nil && (g.KeepLoaded || g.Async || g.Release):
		return invalid(op, model, "a phase's guard leaves the keep-alive and the cleanup to Phase.End: KeepLoaded, Async and Release do not apply")
	case g.KeepLoaded && g.Async && !g.Release:
		return invalid(op, model, "Async with KeepLoaded and no Release: there is no cleanup to run in the background")
	}
	return validModelName(op, model)
}

// Run calls fn with a session on model and then cleans up, in a defer:
// after success, after an error, after ctx is canceled, and when fn panics
// (then the cleanup runs synchronously and the panic continues with its
// original value and stack). The cleanup itself runs detached from ctx, so
// a canceled caller still leaves nothing resident.
//
// Uses of the same model through guards of one client are counted: the
// unload runs when the last of them ends, never under another's in-flight
// call, and only if a generation on the model began during the uses and
// may have loaded it. A call refused before it reached the server, one
// that found no server (no connection) and one the server answered "no
// such model" (404) leave the model as it was: Run then returns the
// call's error alone, with nothing to clean up, and Close does not unload
// the model because of it.
// A guard does not wait for other programs: when another client's request
// holds the model, the unload is sent (the server unloads the model when
// that request ends) and the cleanup reports ErrHeldByOthers.
//
// Run returns fn's error joined with the cleanup's. A cleanup failure
// always has KindUnverified, whatever caused it (errors.Is still finds
// its causes: ErrStillResident, ErrHeldByOthers, ...), so that it never
// reads as a failure of fn's work: with a nil fn error, the work
// succeeded. On a closed client Run fails with ErrClosed and calls
// nothing.
func (g *Guard) Run(ctx context.Context, model string, fn func(ctx context.Context, s *Session) error) (err error) {
	const op = "guard"
	if err := g.validate(op, model); err != nil {
		return err
	}
	if fn == nil {
		return invalid(op, model, "function is nil")
	}
	if err := g.Client.checkOpen(op, model); err != nil {
		return err
	}
	if g.Phase != nil {
		leave, err := g.Phase.enter(model)
		if err != nil {
			return err
		}
		// Deferred first, run last: the phase's End waits for this use,
		// cleanup included.
		defer leave()
	}
	release := g.Client.book.acquire(model)
	normal := false
	s := &Session{g: g, model: model}
	defer func() {
		s.ended.Store(true)
		wantUnload := g.Phase == nil && !g.KeepLoaded
		last, unload := release(wantUnload)
		if g.Phase != nil {
			// The phase keeps the model: its End unloads it, and with it
			// what an earlier user of the model wanted.
			unload = false
		}
		if cerr := g.cleanup(ctx, model, last && unload, !normal); cerr != nil {
			err = errors.Join(err, unverified("guard cleanup", model, cerr))
		}
	}()
	err = fn(ctx, s)
	normal = true
	return err
}

// Generate is Run with a single generation on req.Model.
func (g *Guard) Generate(ctx context.Context, req *GenerateRequest, fn ChunkFunc) (gen *Generation, err error) {
	if req == nil {
		return nil, invalid("guard", "", "request is nil")
	}
	return g.one(ctx, req.Model, func(ctx context.Context, s *Session) (*Generation, error) {
		return s.Generate(ctx, req, fn)
	})
}

// Chat is Run with a single chat turn on req.Model.
func (g *Guard) Chat(ctx context.Context, req *ChatRequest, fn ChunkFunc) (gen *Generation, err error) {
	if req == nil {
		return nil, invalid("guard", "", "request is nil")
	}
	return g.one(ctx, req.Model, func(ctx context.Context, s *Session) (*Generation, error) {
		return s.Chat(ctx, req, fn)
	})
}

// one is Run with a single call: a call that worked and a cleanup that
// failed return both the generation and the cleanup's error.
func (g *Guard) one(ctx context.Context, model string, do func(context.Context, *Session) (*Generation, error)) (gen *Generation, err error) {
	err = g.Run(ctx, model, func(ctx context.Context, s *Session) error {
		var err error
		gen, err = do(ctx, s)
		return err
	})
	return gen, err
}

func (g *Guard) cleanup(ctx context.Context, model string, unload, panicking bool) error {
	opts := CleanupOptions{Release: g.Release && g.Phase == nil, afterUse: true, mode: unloadMode{heldOK: true, keepLoads: true, cause: CauseGuard, phase: g.Phase}}
	if unload {
		opts.Models = []string{model}
	}
	if len(opts.Models) == 0 && !opts.Release {
		return nil
	}
	if g.Async && !panicking {
		t := g.Client.CleanupAsync(ctx, opts)
		select {
		case <-t.Done():
			// Refused at once (the client is closed): clean up here.
			// Otherwise it ran already, and its failure, like any
			// background cleanup's, comes from Wait or Close (once).
			if _, err := t.Wait(); !errors.Is(err, ErrClosed) {
				return nil
			}
		default:
			return nil
		}
	}
	// A use that began before Close still cleans up after itself.
	_, err := g.Client.cleanup(ctx, opts)
	return err
}

// PhaseOptions configures a Phase. The zero value keeps models warm for
// two minutes and ends with a verified unload and the release step (see
// Phase.End).
type PhaseOptions struct {
	// KeepAlive is sent by the phase's generations. The zero value
	// (KeepAliveUnload, which would reload the model at every step) means
	// KeepAliveFor(2 * time.Minute).
	KeepAlive KeepAlive
	// NeedBytes, when non-zero, makes End hand over a GPU with that many
	// bytes free on Device (through EnsureFree), failing otherwise. It
	// needs Options.VRAM: without a reader StartPhase fails with
	// ErrNoVRAMReader.
	//
	// The hand-over is exclusive by default: the room End verified is
	// reserved (EnsureRequest.Reservation, with Reserve's options), so
	// that no other vramguard client on the host (another program's
	// budget, vramgate's chat loads, a pool's placement) takes it before
	// the next stage allocates. PhaseReport.Handover.Reservation holds
	// it: release it once the next stage has allocated (or give
	// Reserve.PID so that it ends as that process takes the room), or let
	// its TTL (two minutes unless Reserve.TTL) end it. Where leases are
	// off (LeaseOptions.Off, or the directory refused) nothing can be
	// reserved: End logs it and hands over without.
	NeedBytes uint64
	Device    int
	// Reserve describes the hand-over's reservation: its recipient (For)
	// and holder (Note; both empty: "the next stage", held by "phase
	// <name>"), the recipient's process (PID) and its TTL.
	Reserve ReserveOptions
	// NoReserve hands the room over without reserving it: for a next
	// stage that runs in no process of this host's (a remote render), or
	// one that must not wait for another program's reservation to end;
	// then anything on the host may take the room first.
	NoReserve bool
	// Timeout bounds each of End's steps (the wait for running uses, the
	// unloads, the hand-over); zero means the client's CleanupTimeout.
	Timeout time.Duration
	// NoLease keeps the phase from taking a host-wide lease on each model
	// it uses. By default it takes one (see OllamaClient.HoldModel), so
	// that another client's or program's cleanup leaves the phase's models
	// warm (the phase's own client, its budget included, is not kept); End
	// releases them before it unloads. A lease that cannot be taken
	// (leases off, the directory refused) is logged, and the phase goes on
	// without it.
	NoLease bool
}

// Phase is a scope for a run of LLM steps, such as the prompt stage of a
// diffusion pipeline: consecutive steps on the same model reuse it, and End
// unloads every model the phase used, verified, and hands over free VRAM.
//
// A Phase is safe for concurrent use. End is idempotent and runs by itself
// if the context given to StartPhase is canceled first.
type Phase struct {
	c         *OllamaClient
	name      string
	opts      PhaseOptions
	keepAlive KeepAlive
	started   time.Time
	ctxDone   <-chan struct{} // the StartPhase context's Done, to end it from Wait

	mu     sync.Mutex
	models []string      // in order of first use
	leases []*Lease      // one per model, unless NoLease
	ended  bool          // End has begun: no new use
	sealed bool          // End has stopped waiting for uses: no new generation
	active int           // guarded uses running; End waits for them
	idle   chan struct{} // closed when active drops to zero after End began

	endOnce sync.Once
	endDone chan struct{}
	report  *PhaseReport
	err     error
}

// PhaseReport says what a phase did.
type PhaseReport struct {
	Name     string
	Models   []string // models used, in order of first use
	Cleanup  *CleanupReport
	Handover *EnsureReport // nil unless NeedBytes was set
	Elapsed  time.Duration // from StartPhase to the end of End
}

// StartPhase begins a phase. If ctx is canceled before End is called, the
// phase ends by itself in the background (joined by the client's Wait and
// Close).
func (c *OllamaClient) StartPhase(ctx context.Context, name string, opts PhaseOptions) (*Phase, error) {
	const op = "start phase"
	if opts.Timeout < 0 {
		return nil, invalid(op, "", "negative timeout")
	}
	if opts.NeedBytes > 0 && c.opts.VRAM == nil {
		// The hand-over could not be measured: End would unload the
		// phase's models and then fail.
		return nil, newError(op, "", KindInvalidInput, fmt.Errorf("NeedBytes %d: %w", opts.NeedBytes, ErrNoVRAMReader))
	}
	if opts.NeedBytes > maxBytes {
		return nil, invalid(op, "", "need %d bytes: more than %d", opts.NeedBytes, uint64(maxBytes))
	}
	if _, err := opts.Reserve.validate(op); err != nil {
		return nil, err
	}
	ka := opts.KeepAlive
	if ka == KeepAliveUnload {
		ka = KeepAliveFor(defaultPhaseKeepAlive)
	}
	p := &Phase{
		c:         c,
		name:      name,
		opts:      opts,
		keepAlive: ka,
		started:   time.Now(),
		endDone:   make(chan struct{}),
		ctxDone:   ctx.Done(),
	}
	// Checked, registered and armed under the book's lock, which keeps
	// the watch's stop: Close cannot slip in between.
	err := c.book.addPhase(op, p, func() func() bool {
		return context.AfterFunc(ctx, func() {
			if c.book.isClosed() {
				return // Close ends every phase itself
			}
			c.tasks.start(func() error {
				_, err := p.End(context.WithoutCancel(ctx))
				return err
			})
		})
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// endPhases ends the live phases: all of them, or only those whose
// context is done. It returns their joined errors.
func (c *OllamaClient) endPhases(all bool) error {
	var errs []error
	for _, p := range c.book.livePhases(all) {
		_, err := p.End(context.Background())
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Name returns the phase's name.
func (p *Phase) Name() string { return p.name }

// Models returns the models used so far, in order of first use.
func (p *Phase) Models() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.models)
}

// enter begins a guarded use of model in the phase; leave ends it.
func (p *Phase) enter(model string) (leave func(), err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, newError("phase "+p.name, model, KindInvalidInput, ErrPhaseEnded)
	}
	key := NormalizeModelName(model)
	if !slices.ContainsFunc(p.models, func(m string) bool { return NormalizeModelName(m) == key }) {
		p.models = append(p.models, model)
		if !p.opts.NoLease && !p.c.opts.Leases.Off {
			if l, err := p.c.hold("phase "+p.name, model, 0, lease.Record{Note: "phase " + p.name}, false); err == nil {
				p.leases = append(p.leases, l)
			} else if _, derr := p.c.leaseDir(); derr != nil {
				// The refused directory was logged once, at WARN.
				p.c.log.Debug("phase runs without a lease", "phase", p.name, "model", model, "err", err)
			} else {
				p.c.log.Warn("phase runs without a lease", "phase", p.name, "model", model, "err", err)
			}
		}
	}
	p.active++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if p.active--; p.active == 0 && p.idle != nil {
				close(p.idle)
				p.idle = nil
			}
			p.mu.Unlock()
		})
	}, nil
}

// phaseHolds returns, for each model a live phase of this client other
// than except uses (and so keeps warm), that phase's hold on it: its
// lease's info, or for a phase without a lease the same facts made up
// (this process, the phase's name). A phase whose End has begun is not
// live.
func (c *OllamaClient) phaseHolds(except *Phase) []LeaseInfo {
	var out []LeaseInfo
	for _, q := range c.book.livePhases(true) {
		if q != except {
			out = append(out, q.holds()...)
		}
	}
	return out
}

// phaseKeeps reports whether a live phase of this client uses model. It
// is asked on every keep-alive-0 call (a plain Guard's), so it builds no
// LeaseInfo.
func (c *OllamaClient) phaseKeeps(model string) bool {
	key := NormalizeModelName(model)
	for _, q := range c.book.livePhases(true) {
		q.mu.Lock()
		uses := slices.ContainsFunc(q.models, func(m string) bool { return NormalizeModelName(m) == key })
		q.mu.Unlock()
		if uses {
			return true
		}
	}
	return false
}

// holds is phaseHolds for one phase.
func (p *Phase) holds() []LeaseInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]LeaseInfo, 0, len(p.models))
	for _, m := range p.models {
		key := NormalizeModelName(m)
		info := LeaseInfo{Model: key, Server: lease.NormalizeServer(p.c.host), PID: os.Getpid(), Note: "phase " + p.name, Created: p.started}
		if len(os.Args) > 0 {
			info.Program = filepath.Base(os.Args[0])
		}
		for _, l := range p.leases {
			if NormalizeModelName(l.info.Model) == key {
				info = l.Info()
			}
		}
		out = append(out, info)
	}
	return out
}

// reservation is the hand-over's reservation request: nil with NoReserve,
// or where leases are off (logged).
func (p *Phase) reservation() *ReserveOptions {
	if p.opts.NoReserve {
		return nil
	}
	if dir, err := p.c.leaseDir(); dir == nil {
		p.c.log.Info("hand-over not reserved: host-wide leases are off", "phase", p.name, "err", err)
		return nil
	}
	r := p.opts.Reserve
	if r.For == "" && r.Note == "" {
		r.For, r.Note = "the next stage", "phase "+p.name
		if _, err := r.validate("phase"); err != nil {
			r.Note = "a phase" // a name too long or odd to quote
		}
	}
	return &r
}

// isSealed reports whether End has stopped waiting for the phase's uses:
// from then on a generation would load a model behind End's unload.
func (p *Phase) isSealed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sealed
}

// waitIdle returns a channel closed when the phase's last running use
// ends, or nil when none runs.
func (p *Phase) waitIdle() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.active == 0 {
		return nil
	}
	if p.idle == nil {
		p.idle = make(chan struct{})
	}
	return p.idle
}

// activeUses returns the number of guarded uses still running.
func (p *Phase) activeUses() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active
}

// Guard returns a Guard whose generations run in this phase.
func (p *Phase) Guard() Guard { return Guard{Client: p.c, Phase: p} }

// End waits for the phase's guarded uses that are still running, unloads
// every model the phase used (verified), runs the Release of the client's
// tenants on no device (Tenant.Device -1) and the GC, as ReleaseVRAM does
// for every tenant (a tenant on a device is left to the hand-over, which
// asks it when it needs its memory), and, with NeedBytes set, calls
// EnsureFree so the next stage gets the memory it
// needs, and reserves it for that stage unless PhaseOptions.NoReserve
// (PhaseReport.Handover.Reservation). A model another live phase of this client uses is left to it
// (the last holder's End unloads it): its UnloadReport in Cleanup is not
// Verified, sends nothing, and its Leased names that phase (Note
// "phase <name>"); the hand-over does not evict it either. It runs detached from ctx's cancellation; the wait for uses, the
// unloads and the hand-over are each bounded by the phase's Timeout. Unlike
// a guard, End waits for other programs' requests on its models to end
// (within that bound), since what it hands over is the memory. End is
// idempotent: later calls wait for the first and return its result; the
// phase's guards and sessions fail with ErrPhaseEnded (KindInvalidInput)
// once End has begun, or, for uses already running, once it stopped waiting
// for them.
func (p *Phase) End(ctx context.Context) (*PhaseReport, error) {
	p.endOnce.Do(func() {
		defer close(p.endDone)
		if stop := p.c.book.removePhase(p); stop != nil {
			stop()
		}
		p.mu.Lock()
		p.ended = true // no new use from here on
		p.mu.Unlock()

		timeout := p.opts.Timeout
		if timeout == 0 {
			timeout = p.c.opts.CleanupTimeout
		}
		// Uses that began before End finish first: a generation between
		// its start and its first byte would otherwise load a model after
		// the unload was verified.
		var errs []error
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		if idle := p.waitIdle(); idle != nil {
			select {
			case <-idle:
			case <-wctx.Done():
				errs = append(errs, newError("phase "+p.name, "", KindTimeout,
					fmt.Errorf("%d uses still running: %w", p.activeUses(), context.Cause(wctx))))
			}
		}
		cancel()
		p.mu.Lock()
		p.sealed = true
		models := slices.Clone(p.models)
		leases := p.leases
		p.leases = nil
		p.mu.Unlock()
		for _, l := range leases { // the phase's own leases must not keep its models
			if err := l.Release(); err != nil {
				errs = append(errs, newError("phase "+p.name, l.info.Model, KindInternal, fmt.Errorf("lease release: %w", err)))
			}
		}

		rep := &PhaseReport{Name: p.name, Models: models}
		cr, err := p.c.cleanup(ctx, CleanupOptions{Models: models, Release: true, afterUse: true, Timeout: timeout, mode: unloadMode{keepLoads: true, cause: CausePhaseEnd, phase: p}})
		rep.Cleanup = cr
		errs = append(errs, err)
		if p.opts.NeedBytes > 0 {
			ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			er, eerr := p.c.ensureFree(ectx, EnsureRequest{Device: p.opts.Device, Bytes: p.opts.NeedBytes, Reservation: p.reservation()},
				unloadMode{keepLoads: true, cause: CauseEnsureFree, phase: p})
			cancel()
			rep.Handover = er
			errs = append(errs, eerr)
		}
		rep.Elapsed = time.Since(p.started)
		p.report, p.err = rep, errors.Join(errs...)
		p.c.log.Debug("phase ended", "phase", p.name, "models", models, "elapsed", rep.Elapsed, "err", p.err)
	})
	<-p.endDone
	return p.report, p.err
}
