package vramguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ollama/ollama/api"
)

// ErrOverBudget: a load would break Options.Budget. The error is an
// *Error of KindOutOfMemory whose cause is a *RoomError with Budget set.
var ErrOverBudget = errors.New("load would break the VRAM budget")

// Budget is what the Ollama models may take of one device, checked before
// each load a generation of this client would cause, from the device's own
// readings (Options.VRAM, which it needs). A model the server lists is no
// load and is not checked.
type Budget struct {
	// Device is the device's index, as the VRAM reader reports it.
	Device int
	// MaxBytes caps the device memory held by Ollama runners (this
	// client's models and any other's) after the load; zero: no cap.
	MaxBytes uint64
	// Headroom is memory that must stay free on the device after the load,
	// for other programs (a desktop, a diffusion model loaded later);
	// zero: the load must only fit.
	Headroom uint64
	// MakeRoom makes a load that would break the budget first make room
	// on Device as EnsureFree does (arithmetic first: nothing is unloaded
	// when the room cannot be made; then tenants marked First, the
	// fewest bytes of Ollama's models on that device, never protected,
	// leased or in-use ones, the other tenants), verified, and wait for
	// the driver to give the memory back, instead of failing at once.
	// The room is kept host-wide while it is made, then held for the load
	// (its load reservation) until the load lands, as EnsureFree's is.
	// What is kept while it is made is the room its arithmetic counts on:
	// with MaxBytes, the free memory its target includes too (the room
	// is made by lowering what Ollama holds), not only the load's need.
	// Every wait counts against the generation's Timeouts (FirstChunk
	// covers the admission): one that ends refuses the load with the
	// *RoomError naming the holders.
	MakeRoom bool
	// OffWithoutGPU lets one program carry the same Options to a GPU box
	// and to a machine without a GPU: where the budget cannot be measured
	// it switches itself off, logs one line at INFO ("VRAM budget off")
	// and admits every load, instead of failing. That is when
	// Options.VRAM is nil (NewClient then accepts the budget), or when the
	// reader's snapshot lists no device Device (checked at the first
	// load). A reader that fails is not "no GPU": its error still refuses
	// the load. Without OffWithoutGPU, NewClient refuses a budget with no
	// reader and a load fails when the device is missing. BudgetOff says
	// whether it happened.
	OffWithoutGPU bool
	// WaitForLeases makes MakeRoom wait, within the generation's
	// timeouts, for the leases that keep it from making room
	// (EnsureRequest.WaitForLeases) instead of refusing the load at once;
	// and MaxLoaded wait, as long, for a slot that leases keep.
	WaitForLeases bool
	// MaxLoaded caps how many models the server may hold after the load
	// (Ollama's OLLAMA_MAX_LOADED_MODELS, say): counted from its listing
	// and the loads this client admitted that it does not list yet. A
	// load past the cap first unloads, verified, one model the victim
	// policy takes first (EnsureRequest.AllModels's order: idle models,
	// then this client's own leased ones; within each the fewest bytes to
	// load again first), whatever its device, never a protected, leased
	// or in-use one, so that the server evicts nothing of its own choosing
	// (it would take a leased model as readily as any). It does so even
	// without MakeRoom, and needs no VRAM reader: it holds when
	// OffWithoutGPU switched the memory checks off. When every loaded
	// model is kept, the load is refused with the *RoomError whose Kept
	// says why each stays. Zero: no cap.
	MaxLoaded int
}

// admission serializes a client's budget checks and counts the loads it
// admitted that the server does not list yet, so that two generations
// admitted together are not both measured against the same free memory.
type admission struct {
	once sync.Once
	slot chan struct{} // held by the check in progress

	// off: Budget.OffWithoutGPU found no device to measure; set once.
	off     atomic.Bool
	offOnce sync.Once

	mu      sync.Mutex
	pending map[*admitted]struct{}
}

// acquire takes the check slot, or fails when ctx is done first.
func (a *admission) acquire(ctx context.Context) error {
	a.once.Do(func() { a.slot = make(chan struct{}, 1) })
	select {
	case a.slot <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (a *admission) release() { <-a.slot }

type admitted struct {
	model string
	need  uint64
}

// errBudgetOff: checkBudget found no device and the budget switched
// itself off (Budget.OffWithoutGPU).
var errBudgetOff = errors.New("budget off")

// budgetOff switches Options.Budget off, logging why once.
func (c *OllamaClient) budgetOff(why string) {
	c.admission.offOnce.Do(func() {
		c.admission.off.Store(true)
		if c.opts.Budget.MaxLoaded > 0 {
			c.log.Info("VRAM budget's memory checks off: "+why+"; loads are checked for slots only (MaxLoaded)", "device", c.opts.Budget.Device, "max_loaded", c.opts.Budget.MaxLoaded)
			return
		}
		c.log.Info("VRAM budget off: "+why+"; loads are not checked", "device", c.opts.Budget.Device)
	})
}

// BudgetOff reports whether Options.Budget switched itself off because
// there is no GPU to measure (Budget.OffWithoutGPU). It is false without
// a budget. It is safe for concurrent use.
func (c *OllamaClient) BudgetOff() bool { return c.admission.off.Load() }

// admitBounded is admit within the call's first-chunk and total timeouts
// (less spent, which it raises by the admission's time): a wait for room
// that ends there is the *RoomError of KindOutOfMemory, and anything else
// the admission was doing is KindTimeout with the timeout as its cause.
func (c *OllamaClient) admitBounded(ctx context.Context, cl *call, spent *time.Duration) (done, landed func(), err error) {
	if !c.budgetOn() {
		return func() {}, func() {}, nil
	}
	start := time.Now()
	t := cl.timeouts.or(c.opts.Timeouts)
	fctx, cancelFirst := context.WithTimeoutCause(ctx, t.FirstChunk-*spent, ErrFirstChunkTimeout)
	defer cancelFirst()
	actx, cancelTotal := context.WithTimeoutCause(fctx, t.Total-*spent, ErrTotalTimeout)
	defer cancelTotal()
	done, landed, _, err = c.admit(actx, cl.op, cl.model, cl.options, ReserveOptions{})
	*spent += time.Since(start)
	if err != nil && ctx.Err() == nil && actx.Err() != nil && KindOf(err) == KindCanceled {
		return nil, nil, newError(cl.op, cl.model, KindTimeout, context.Cause(actx))
	}
	return done, landed, err
}

// budgetOn says whether Options.Budget checks anything: it is set, and
// either its memory checks are on or it caps slots (Budget.MaxLoaded,
// which needs no reader).
func (c *OllamaClient) budgetOn() bool {
	b := c.opts.Budget
	return b != nil && (!c.admission.off.Load() || b.MaxLoaded > 0)
}

// Admit admits the load that a request this client does not send itself
// would cause (a proxy's forwarded generation, say) through the door this
// client's own generations go through, then calls run and returns its
// error. That door is Options.Budget: its slots (MaxLoaded), its memory
// checks and room-making, the loads this client admitted that the server
// does not list yet (two admissions never count the same free bytes),
// and, where host-wide leases are on, a reservation of the load's
// estimate (ReserveOptions.Load) that every vramguard client on the host
// counts until the load lands. Without a budget, or for a model the
// server lists, nothing is checked (ev.Load is false for a listed model).
//
// options are the request's Ollama options (num_ctx is read for the
// estimate). opts names whom the request is made for in the load's
// reservation (For, Note and PID as ReserveOptions documents them; TTL
// bounds the reservation, zero meaning two minutes); its Load is the
// library's to set and must be empty.
//
// ctx bounds the admission, within Options.Timeouts.FirstChunk (the
// admission comes before any chunk, as for this client's generations),
// and is run's parent; run itself is bounded by ctx alone, not by the
// client's Timeouts (its request is the caller's). While run runs the model counts as in use by this
// client: its room-making, a budget's and MaxLoaded's keep it
// (KeptModel.InUse). run calls landed once the server has answered the
// request (the load landed, or failed): that releases the load's
// reservation, and from then on the model's memory is the device's to
// show. Until then an unload of the model by this client (UnloadModel,
// EnsureFree) cuts run's ctx with cause ErrUnloadedWhileLoading, as it cuts
// its own generations still loading: an unload sent during a load is
// lost by the server. Run returning ends all of it, a panic included.
//
// A refusal is an *Error of KindOutOfMemory whose cause is the
// *RoomError (ErrOverBudget; ErrLeased when leases keep the room). A
// model the server does not have is KindNotFound, run not called, where
// the admission asks the server about it: its estimate (the memory
// checks) or a slot to make for it; else run is called and
// the server answers the request with its own 404. Otherwise a bad
// name or opts is KindInvalidInput, a closed client ErrClosed; a wait
// cut by FirstChunk is KindTimeout.
func (c *OllamaClient) Admit(ctx context.Context, model string, options map[string]any, opts ReserveOptions, run func(ctx context.Context, ev AdmissionEvent, landed func()) error) error {
	const op = "admit"
	if err := c.checkOpen(op, model); err != nil {
		return err
	}
	if err := validModelName(op, model); err != nil {
		return err
	}
	if run == nil {
		return invalid(op, model, "no run func")
	}
	if opts.Load != "" {
		return invalid(op, model, "ReserveOptions.Load is set by the admission, not by its caller")
	}
	if _, err := opts.validate(op); err != nil {
		return err
	}
	begun := c.book.start() // room-making waits for an admission in progress
	defer begun()
	ev := AdmissionEvent{Model: model, Server: c.host}
	done, landed := func() {}, func() {}
	if c.budgetOn() {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if t := c.opts.Timeouts.FirstChunk; t > 0 {
			actx, cancel = context.WithTimeoutCause(ctx, t, ErrFirstChunkTimeout)
		}
		var err error
		done, landed, ev, err = c.admit(actx, op, model, options, opts)
		cancel()
		if err != nil && ctx.Err() == nil && actx.Err() != nil && KindOf(err) == KindCanceled {
			err = newError(op, model, KindTimeout, context.Cause(actx))
		}
		if err != nil {
			return err
		}
	}
	defer done()
	rctx, rcancel := context.WithCancelCause(ctx)
	defer rcancel(nil)
	// Counted in use, not warm: the request's keep-alive is its sender's,
	// and Close leaves the model as it is (KeepAliveUnload marks nothing).
	f, end, err := c.book.begin(op, model, KeepAliveUnload, rcancel, true)
	begun()
	if err != nil {
		return err
	}
	defer end()
	f.sent.Store(true) // run sends the request: from now on it may load the model
	var once sync.Once
	land := func() {
		once.Do(func() {
			f.streaming.Store(true)
			landed()
		})
	}
	defer land()
	return run(rctx, ev, land)
}

// admit checks the budget before a generation on model (options are the
// request's, for num_ctx); done must be called when the generation ends,
// landed at its first chunk (the load has landed: the server lists the
// model). Without a budget, or for a model the server lists, it does
// nothing (ev.Load false). A load it admits is reserved host-wide
// (ReserveOptions.Load, named after who) until it lands or the generation
// ends, where host-wide leases are on.
func (c *OllamaClient) admit(ctx context.Context, op, model string, options map[string]any, who ReserveOptions) (done, landed func(), ev AdmissionEvent, err error) {
	nothing := func() {}
	ev = AdmissionEvent{Model: model, Server: c.host}
	b := c.opts.Budget
	if b == nil || !c.budgetOn() {
		return nothing, nothing, ev, nil
	}
	a := &c.admission
	if err := a.acquire(ctx); err != nil {
		return nil, nil, ev, newError(op, model, KindCanceled, err)
	}
	defer a.release()
	ms, err := c.runningNow(ctx)
	if err != nil {
		return nil, nil, ev, err
	}
	if findRunning(ms, model) != nil {
		return nothing, nothing, ev, nil
	}
	pending, same := a.pendingBytes(ms, model)
	if same {
		return nothing, nothing, ev, nil // its load was admitted already
	}
	ev.Load, ev.Device, ev.Start = true, b.Device, time.Now()
	checked := true // a budget found off is no check
	defer func() {
		if checked {
			ev.Elapsed, ev.Err = time.Since(ev.Start), err
			hookCtx(c, c.opts.Hooks.OnAdmission, ctx, ev)
		}
	}()
	// The estimate first: a model the server does not have is no load
	// (KindNotFound), and nothing is unloaded for it.
	var need uint64
	if !a.off.Load() {
		est, err := c.EstimateModel(ctx, model, numCtxOf(options))
		if err != nil {
			return nil, nil, ev, err
		}
		if est.Total <= 0 {
			return nil, nil, ev, newError(op, model, KindServer, fmt.Errorf("estimate of %d bytes", est.Total))
		}
		need = uint64(est.Total)
		ev.Need = need
	}
	if b.MaxLoaded > 0 {
		if err = c.admitSlot(ctx, op, model, b, ms, &ev, need > 0); errors.Is(err, errListedMeanwhile) {
			ev.Load = false
			return nothing, nothing, ev, nil // a listed model is no load
		} else if err != nil {
			return nil, nil, ev, err
		}
	}
	var res *Lease
	if need > 0 {
		var listed bool
		if res, listed, err = c.admitMemory(ctx, op, model, b, need, pending, who, &ev); listed {
			ev.Load = false
			return nothing, nothing, ev, nil // a listed model is no load
		} else if err != nil {
			return nil, nil, ev, err
		}
		if a.off.Load() { // switched itself off at this load: nothing measured
			need = 0
			if checked = b.MaxLoaded > 0; !checked {
				return nothing, nothing, ev, nil
			}
		}
	}
	landed = func() {
		if res != nil {
			_ = res.Release() // the runner's memory is the device's to show now
		}
	}
	p := &admitted{model: model, need: need}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == nil {
		a.pending = make(map[*admitted]struct{})
	}
	a.pending[p] = struct{}{}
	return func() {
		landed()
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.pending, p)
	}, landed, ev, nil
}

// admitMemory checks a load of need bytes (pending: the loads admitted and
// not listed yet) against the budget's memory, making room with MakeRoom,
// and reserves it host-wide. skip: no load to admit after all (another
// party loaded the model meanwhile). A budget that switches itself off
// here (Budget.OffWithoutGPU) admits it unmeasured.
func (c *OllamaClient) admitMemory(ctx context.Context, op, model string, b *Budget, need, pending uint64, who ReserveOptions, ev *AdmissionEvent) (res *Lease, skip bool, err error) {
	berr, err := c.checkBudget(ctx, b, model, need+pending)
	if errors.Is(err, errBudgetOff) {
		ev.Need = 0
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if berr != nil && b.MakeRoom && pending > 0 {
		// A load admitted before this one, not listed yet, lands while
		// room is made: the device would show its memory and the target
		// still count it, and the wait could never end. Room is made once
		// those loads are listed (or have failed), and measured.
		if err := c.awaitPending(ctx, model); err != nil {
			return nil, false, err
		}
		pending = 0
		if berr, err = c.checkBudget(ctx, b, model, need); err != nil {
			return nil, false, err
		}
	}
	if berr != nil && b.MakeRoom {
		var made bool
		var kept *roomHold // the room made, held until the load's reservation stands
		berr, kept, made, err = c.budgetRoom(ctx, b, model, need, berr, ev)
		defer c.endKeep(kept)
		ev.MadeRoom = ev.MadeRoom || made
		if errors.Is(err, errListedMeanwhile) {
			return nil, true, nil
		} else if err != nil {
			return nil, false, err
		}
	}
	if berr != nil {
		return nil, false, newError(op, model, KindOutOfMemory, berr)
	}
	res, err = c.reserveLoad(ctx, op, model, b, need, who)
	return res, false, err
}

// admitSlot makes a slot for a load of model when Budget.MaxLoaded models
// are listed (ms) or admitted and not listed yet: it unloads, verified, the
// first listed model of the victim policy's plan over every model
// (EnsureRequest.AllModels, kept ones left out), or refuses with the
// *RoomError naming what keeps each, after waiting, with
// Budget.WaitForLeases, within Options.UnloadTimeout for a lease to end.
// errListedMeanwhile: another party loaded model meanwhile.
func (c *OllamaClient) admitSlot(ctx context.Context, op, model string, b *Budget, ms []api.ProcessModelResponse, ev *AdmissionEvent, known bool) error {
	deadline := time.Now().Add(c.opts.UnloadTimeout)
	for {
		loaded := len(ms) + c.admission.pendingCount(ms)
		if loaded < b.MaxLoaded {
			return nil
		}
		if !known {
			// No estimate was made (the memory checks are off): a model
			// the server does not have is no load, and makes no slot.
			if _, err := c.api.Show(ctx, &api.ShowRequest{Model: model}); err != nil {
				return c.callError(ctx, op, model, err)
			}
			known = true
		}
		rep, err := c.ensureFree(ctx, EnsureRequest{AllModels: true, DryRun: true},
			unloadMode{cause: CauseBudget, keepLoads: true, keepInUse: true})
		if err != nil {
			return err
		}
		victim := ""
		for _, p := range rep.Plan {
			if findRunning(ms, p) != nil {
				victim = p
				break
			}
		}
		if victim != "" && time.Now().Before(deadline) {
			c.log.Debug("making a slot for a load", "model", model, "unload", victim, "max_loaded", b.MaxLoaded)
			r, err := c.unloadModel(ctx, victim, unloadMode{cause: CauseBudget, keepLoads: true, refuseLeased: true})
			if r != nil {
				ev.Evicted = append(ev.Evicted, *r)
				ev.MadeRoom = ev.MadeRoom || r.Verified
			}
			if err != nil && !errors.Is(err, ErrLeased) {
				return err // a lease taken since the plan: planned again
			}
		} else {
			bc := *b
			re := &RoomError{Model: model, Device: b.Device, Kept: rep.Kept, RetryAfter: rep.RetryAfter, Budget: &bc, slots: loaded}
			leased := slices.ContainsFunc(rep.Kept, func(k KeptModel) bool { return len(k.Leases) > 0 })
			if !b.WaitForLeases || !leased || !time.Now().Before(deadline) {
				if victim != "" || b.WaitForLeases && leased {
					re.Err = fmt.Errorf("%w: the slot was not made within %v", context.DeadlineExceeded, c.opts.UnloadTimeout)
				}
				return newError(op, model, KindOutOfMemory, re)
			}
			if err := sleepCtx(ctx, min(c.opts.PollInterval, time.Until(deadline))); err != nil {
				re.Err = context.Cause(ctx)
				return newError(op, model, KindOutOfMemory, re)
			}
		}
		if ms, err = c.runningNow(ctx); err != nil {
			return err
		}
		if findRunning(ms, model) != nil {
			return errListedMeanwhile
		}
	}
}

// reserveLoad reserves need bytes on the budget's device for the load of
// model it admitted, host-wide, until the load lands (the holder releases
// it at the first chunk) or its generation ends: another program's
// hand-over on the host counts the load before its runner shows it, and
// two programs' admissions never both count the same free bytes. It is
// taken as Reserve takes one, under the lease directory's lock: when
// another holder took the room meanwhile, the load is refused with the
// *RoomError of that reading. Where host-wide leases are off it takes
// none (nil, nil): the in-process count of admitted loads stands alone.
func (c *OllamaClient) reserveLoad(ctx context.Context, op, model string, b *Budget, need uint64, who ReserveOptions) (*Lease, error) {
	if dir, _ := c.leaseDir(); dir == nil {
		return nil, nil
	}
	ttl := defaultReserveTTL
	if who.TTL > 0 {
		ttl = who.TTL
	} else if dl, ok := ctx.Deadline(); ok {
		ttl = min(max(time.Until(dl), time.Second), maxReserveTTL)
	}
	key := NormalizeModelName(model)
	opts := ReserveOptions{For: "load of " + key, Note: who.Note, PID: who.PID, Load: key, TTL: ttl}
	if who.For != "" {
		opts.For += " for " + who.For
	}
	if _, err := opts.validate(op); err != nil {
		opts.For, opts.Load = "a load", "?" // a name too long or odd to quote
		if who.For != "" {
			opts.For = "a load for " + who.For
		}
	}
	res, err := c.reserve(ctx, roomRequest{op: op, model: model, device: b.Device, need: need}, opts, ttl)
	var re *RoomError
	switch {
	case errors.As(err, &re):
		bc := *b
		re.Model, re.Budget = model, &bc
		return nil, newError(op, model, KindOutOfMemory, re)
	case err != nil && KindOf(err) == KindCanceled:
		return nil, err
	case err != nil:
		c.log.Warn("load admitted without a host-wide reservation", "model", model, "err", err)
		return nil, nil
	}
	return res, nil
}

// pendingCount is how many loads of distinct models this client admitted
// that the server does not list yet (in ms): slots they will take.
func (a *admission) pendingCount(ms []api.ProcessModelResponse) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[string]bool{}
	for p := range a.pending {
		if key := NormalizeModelName(p.model); !seen[key] && findRunning(ms, p.model) == nil {
			seen[key] = true
		}
	}
	return len(seen)
}

// pendingBytes is what the loads this client admitted and the server does
// not list yet (in ms) will hold, and whether one of them is of model.
func (a *admission) pendingBytes(ms []api.ProcessModelResponse, model string) (pending uint64, same bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for p := range a.pending {
		if NormalizeModelName(p.model) == NormalizeModelName(model) {
			return 0, true
		}
		if findRunning(ms, p.model) == nil {
			pending += p.need
		}
	}
	return pending, false
}

// awaitPending waits, within ctx, until every load this client admitted
// is listed by the server or has ended (its generation failed).
func (c *OllamaClient) awaitPending(ctx context.Context, model string) error {
	err := c.awaitListing(ctx, c.opts.PollInterval, func(ms []api.ProcessModelResponse) bool {
		pending, _ := c.admission.pendingBytes(ms, model)
		return pending == 0
	})
	var e *Error
	if err != nil && !errors.As(err, &e) {
		return newError("budget", model, KindCanceled, err)
	}
	return err
}

// awaitListing reads the server's listing, then again every interval,
// until done says the wait is over. It fails with a listing's *Error, or
// with ctx's cause while it sleeps.
func (c *OllamaClient) awaitListing(ctx context.Context, interval time.Duration, done func([]api.ProcessModelResponse) bool) error {
	for {
		ms, err := c.running(ctx)
		if err != nil {
			return err
		}
		if done(ms) {
			return nil
		}
		if err := sleepCtx(ctx, interval); err != nil {
			return err
		}
	}
}

// checkBudget reads the device and returns a *RoomError when a load of
// need bytes would break b, or nil when it fits.
func (c *OllamaClient) checkBudget(ctx context.Context, b *Budget, model string, need uint64) (*RoomError, error) {
	const op = "budget"
	snap, err := c.view(ctx) // others' reservations are not free
	if err == nil && snap == nil {
		err = errors.New("reader returned no snapshot")
	}
	if err != nil {
		return nil, readerError(ctx, op, model, err)
	}
	d := snap.Device(b.Device)
	if d == nil && b.OffWithoutGPU {
		c.budgetOff(fmt.Sprintf("the VRAM reader (%s) reports no device %d", snap.Source, b.Device))
		return nil, errBudgetOff
	}
	if d == nil {
		return nil, invalid(op, model, "device %d is not among the %d the VRAM reader reports", b.Device, len(snap.Devices))
	}
	bc := *b
	e := &RoomError{Model: model, Device: b.Device, Need: need + b.Headroom, Free: d.Free, Total: d.Total, Budget: &bc,
		Reserved: d.Reserved, RetryAfter: retryAfter(nil, d.Reserved, time.Now())}
	for _, p := range d.Processes {
		if p.Role == RoleOllamaRunner {
			e.Held += p.UsedBytes
		}
	}
	over := d.Free < need || d.Free-need < b.Headroom
	if b.MaxBytes > 0 && e.Held+need > b.MaxBytes {
		over = true
	}
	if !over {
		return nil, nil
	}
	if d.ProcessesKnown {
		e.Holders = d.Holders()
	}
	return e, nil
}

// budgetRoom runs Budget.MakeRoom for a load of need bytes that berr
// refused, and checks the budget again; madeRoom says whether a model was
// unloaded, verified. errListedMeanwhile: another party loaded the model
// meanwhile, so there is no load to admit. A room-making that refused or whose wait ended
// refuses the load with its *RoomError (Budget set). kept is room-making's
// hold on the room it made (keepRoom), for the caller to end once the
// load's own reservation stands.
func (c *OllamaClient) budgetRoom(ctx context.Context, b *Budget, model string, need uint64, berr *RoomError, ev *AdmissionEvent) (_ *RoomError, kept *roomHold, madeRoom bool, err error) {
	target := need
	if b.MaxBytes > 0 && berr.Held+need > b.MaxBytes {
		// Unloading Ollama models lowers what they hold as much as it
		// raises what is free.
		target = max(target, berr.Free+(berr.Held+need-b.MaxBytes))
	}
	c.log.Debug("making room for a load", "model", model, "need", need, "target", target)
	rq, err := c.roomRequestOf(EnsureRequest{Device: b.Device, Bytes: target, Reserve: b.Headroom, WaitForLeases: b.WaitForLeases},
		unloadMode{keepLoads: true, cause: CauseBudget})
	if err != nil {
		return nil, nil, false, err
	}
	rq.forLoad, rq.keep = model, true
	erep, eerr := c.makeRoom(ctx, rq)
	if erep != nil {
		kept = erep.keep
		for _, r := range erep.Evicted {
			madeRoom = madeRoom || r.Verified
		}
		ev.Evicted = append(ev.Evicted, erep.Evicted...)
	}
	if errors.Is(eerr, errListedMeanwhile) {
		// Another party loaded the model while room was made: a listed
		// model is no load, and is not checked.
		c.log.Debug("making room: the model was loaded meanwhile", "model", model)
		return nil, kept, madeRoom, errListedMeanwhile
	}
	var re *RoomError
	if errors.As(eerr, &re) {
		c.log.Debug("making room failed", "model", model, "err", eerr)
		re.Model, re.Budget, re.Held = model, berr.Budget, berr.Held
		return re, kept, madeRoom, nil
	}
	if eerr != nil {
		c.log.Debug("making room failed", "model", model, "err", eerr)
		if KindOf(eerr) == KindCanceled || ctx.Err() != nil {
			return nil, kept, madeRoom, eerr
		}
	}
	if berr, err = c.checkBudget(ctx, b, model, need); err != nil {
		return nil, kept, madeRoom, err
	}
	return berr, kept, madeRoom, nil
}
