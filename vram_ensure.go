package vramguard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ollama/ollama/api"
)

// ErrNoVRAMReader: EnsureFree had no Options.VRAM to measure with and no
// EnsureRequest.AllModels; it unloaded nothing (KindInvalidInput).
var ErrNoVRAMReader = errors.New("no VRAM reader to measure free memory")

// EnsureRequest asks EnsureFree for free memory on a device.
type EnsureRequest struct {
	Device  int    // device index
	Bytes   uint64 // bytes the next load needs
	Reserve uint64 // extra headroom on top of Bytes
	// AllModels unloads every model the server lists, other programs'
	// included and whatever their device, but protected, leased and
	// in-use ones, instead of as few as needed. Without Options.VRAM it is
	// the only way: EnsureFree cannot measure, and fails with
	// ErrNoVRAMReader. Its report's Plan lists them in the victim
	// policy's order (idle models, then this client's own leased ones,
	// then those its generations run on; within each the fewest bytes to
	// load again first): a caller that needs only one gone (a slot, as
	// vramgate's -max-loaded) takes the first.
	AllModels bool
	// DryRun plans and does nothing: the report's Plan says which models
	// would be unloaded and which tenants asked, Kept which models are
	// kept and by whom, RetryAfter when the first lease ends; the error
	// is the *RoomError the call would fail with at once. A plan that
	// rests on a tenant of unknown size is no refusal: only the device
	// can tell.
	DryRun bool
	// PollInterval is the time between VRAM snapshots while waiting;
	// zero means Options.VRAMPollInterval. Timeout bounds each wait of the
	// call (for the device to show what a step freed, for leases); zero
	// means Options.UnloadTimeout. ctx bounds the whole call.
	PollInterval time.Duration
	Timeout      time.Duration
	// WaitForLeases makes a call that leases (or other holders'
	// reservations) keep from making room wait, within Timeout, until they
	// end (looking again every PollInterval), instead of failing at once
	// with a *RoomError.
	WaitForLeases bool
	// KeepInUse keeps the models this client's generations run on, as a
	// budget's room-making does (KeptModel.InUse), instead of taking them
	// last: for a caller that makes room for a load of its own beside its
	// other calls, not for memory it will take itself. It keeps those that
	// run when the plan is made; the unload of a planned victim waits for
	// a generation that began on it later only once its request went out
	// (one held before it, as a pool's placement turn holds it, goes on
	// after the room is made).
	KeepInUse bool
	// KeepOwn keeps the models this client's own leases hold (its phases',
	// HoldModel's) as another program's leases are kept (KeptModel.Leases
	// names them), instead of taking them last: a caller that would rather
	// make room elsewhere than unload what its phases keep warm. The holds
	// it took for someone else (Reserve with ReserveOptions.Model) are not
	// its own: they are kept with or without it.
	KeepOwn bool
	// Reservation, when set, keeps the room once made (Bytes plus
	// Reserve) for the recipient it names, as Reserve does: the report's
	// Reservation holds it, and every other vramguard client on the host
	// counts those bytes as not free until it ends. It is taken under the
	// host-wide lock from a reading made then; when that reading no longer
	// has the room, the call makes it again (twice at most) when a load
	// another client admitted meanwhile took it, and otherwise fails with
	// the *RoomError of that reading and reserves nothing. This client's
	// own standing reservations are its to use here too: release one
	// whose recipient has allocated. It needs a VRAM reader and cannot go
	// with DryRun (KindInvalidInput), and host-wide leases
	// (KindUnavailable when LeaseOptions.Off or the directory is refused).
	Reservation *ReserveOptions
}

// EnsureReport says what EnsureFree did.
type EnsureReport struct {
	Evicted []UnloadReport // models unloaded, verified
	// Plan is what room-making set out to do at its first reading, in
	// order: the models to unload and the tenants (Tenant.Name) to ask;
	// for a dry run, what it would do. It is nil when the call refused
	// (nothing would be done). Evicted and Tenants say what was done:
	// later readings may need less (a tenant gave more) or more.
	Plan []string
	// Kept are the listed models it left: protected, leased, in use, or
	// on a device the reader does not name (KeptModel says which).
	Kept []KeptModel
	// RetryAfter is the time until the first lease among Kept ends; zero
	// when none has an end.
	RetryAfter time.Duration
	Tenants    []TenantRelease // the tenants asked, in order
	// Release is the release step after the plan: the Release of the
	// tenants on no device (Tenant.Device -1), then the GC; nil when none
	// ran (no room to make, a refusal, a dry run).
	Release    *ReleaseReport
	FreeBefore uint64 // free bytes on the device before (0 without a reader)
	FreeAfter  uint64
	// Snapshot is the last snapshot taken, as this client sees the
	// device: other holders' reservations taken out of Free and listed in
	// DeviceMemory.Reserved (so are FreeBefore and FreeAfter); nil without
	// a reader.
	Snapshot *VRAMSnapshot
	Source   string // the snapshot's source, or SourceNone
	// Reservation keeps the room made for EnsureRequest.Reservation's
	// recipient (its Info says how much, on which device and until when);
	// nil when none was asked for or taken. Release it once the recipient
	// has allocated, or leave it to its TTL or consumption.
	Reservation *Lease
	Elapsed     time.Duration
	// keep is room-making's host-wide hold on the room it made, left for
	// a caller that turns it into its reservation (roomRequest.keep).
	keep *roomHold
}

// EnsureFree makes room for a load of req.Bytes (plus req.Reserve) on
// req.Device. This is the call an orchestrator makes right before loading a
// diffusion model or a text encoder.
//
// It first waits, within req.Timeout, for this client's calls started
// before it until their generation begins (their budget admission,
// Options.Budget, or their model's capabilities question included), then
// for those still loading a model until the server lists it (or they
// ended), so that the plan counts what those loads hold; not with
// req.KeepInUse (a caller that makes room beside its own calls counts them
// itself), req.DryRun or req.AllModels. A call started while the room is
// being made is not held.
//
// If the device then has the room, it sends nothing. Otherwise it plans
// first (arithmetic before any unload): a model counts for the device its
// runner's memory is on, by the reader's attribution; when the free memory
// plus all that may be evicted there cannot reach the need, it unloads
// nothing and fails at once with KindOutOfMemory wrapping a *RoomError
// that names the holders (other programs included) and the models it
// kept. Otherwise it asks the registered tenants marked First
// (RegisterTenant), unloads Ollama models on that device, verified, the
// fewest bytes that make the room (never a model Options.Protected names,
// or one a lease keeps, any vramguard client's on the host; this client's
// own leased models, then the ones its generations run on, last, or never
// with req.KeepInUse), asks the other tenants if the room is still
// missing, runs the release step (EnsureReport.Release: the Release of the
// tenants on no device, Tenant.Device -1, then the GC; unlike ReleaseVRAM
// it asks no tenant on a device outside the plan), and waits with
// AwaitFree, polling every req.PollInterval, until the GPU itself reports
// the room. Each wait is bounded by req.Timeout; one that
// ends is KindOutOfMemory with the *RoomError of the last reading, its
// cause kept (errors.Is sees ctx's). With req.WaitForLeases it waits for
// leases that keep it from making room instead of refusing. When, after a
// step, the rest of the plan can no longer make the room (another holder
// leased a model it counted on, another program took memory), it plans
// again as at the start: it refuses at once, or waits for the leases with
// req.WaitForLeases, asking no tenant twice. A reader that
// lists several devices but does not say which a model is on keeps that
// model (ErrUnattributed) rather than evict it blind. A runner the device
// shows and the server does not list is leaving or loading: when its
// memory would make the room, the call waits for it once, within
// req.Timeout, before it refuses.
//
// Other holders' reservations on the device (Reserve, another program's
// phase hand-over) are not free to it and cannot be made free: the plan
// counts the device's free memory less what they have left, a refusal
// names them (RoomError.Reserved, and HolderReserved among its holders)
// with the first one's end as RetryAfter, and WaitForLeases waits for them
// as for leases. This client's own reservations are its to use. With
// req.Reservation the room, once made, is reserved in turn.
//
// From its plan until it returns, the room it makes is kept host-wide: a
// reservation of req.Bytes plus req.Reserve held by this client
// (LeaseInfo.For "the room it is making", Note the call) that every other
// vramguard client on the host counts as not free, the device shown
// overdrawn (DeviceMemory.Overdrawn) while the victims leave, so that what
// the unloads free is not taken by another program's admission, Reserve
// or room-making before this call sees it. They are refused with the
// usual *RoomError naming it, matching ErrLeased as every reservation's
// refusal does. Its Until stays a few seconds away, renewed while the call
// runs, so such a refusal's RetryAfter is seconds; it ends when the call
// returns (a panic included), or becomes req.Reservation's reservation
// first. A program that loads around vramguard (Ollama's own port) is not
// kept out.
//
// Without a VRAM reader it cannot measure. With req.AllModels it unloads
// every listed model not kept, other programs' included, runs the
// release step and reports Source SourceNone; without AllModels it fails with an *Error
// of KindInvalidInput wrapping ErrNoVRAMReader, and sends nothing.
//
// On a closed client it fails with ErrClosed and sends nothing.
func (c *OllamaClient) EnsureFree(ctx context.Context, req EnsureRequest) (*EnsureReport, error) {
	if err := c.checkOpen("ensure free", ""); err != nil {
		return nil, err
	}
	return c.ensureFree(ctx, req, unloadMode{cause: CauseEnsureFree, keepLoads: req.KeepInUse, keepInUse: req.KeepInUse, keepOwn: req.KeepOwn})
}

// ensureFree is EnsureFree for the library's own calls too (Phase.End's
// hand-over, which Close makes too). mode is the unloads' (the library's
// own calls do not cut the client's generations: unloadMode{keepLoads: true}).
func (c *OllamaClient) ensureFree(ctx context.Context, req EnsureRequest, mode unloadMode) (*EnsureReport, error) {
	rq, err := c.roomRequestOf(req, mode)
	if err != nil {
		return nil, err
	}
	if !req.DryRun && !req.KeepInUse && !req.AllModels && c.opts.VRAM != nil {
		// Room for memory the caller takes itself: this client's loads in
		// flight land first, so that the plan sees what they hold instead
		// of making room they take (composition oracle seed
		// 1796234028231654201). A caller making room beside its own calls
		// (KeepInUse, a pool's placement: itself such a load) counts them
		// its own way, and a budget's admission counts what it admitted.
		c.awaitOwnLoads(ctx, rq)
	}
	var ttl time.Duration
	if req.Reservation != nil {
		ttl, _ = req.Reservation.validate(rq.op) // checked by roomRequestOf
	}
	rq.keep = req.Reservation != nil
	for attempt := 0; ; attempt++ {
		rep, err := c.makeRoom(ctx, rq)
		if err != nil || req.Reservation == nil {
			return rep, err
		}
		// The room made is held until the reservation stands (a panic
		// of the reader's included).
		res, err := func() (*Lease, error) {
			defer c.endKeep(rep.keep)
			return c.reserve(ctx, rq, *req.Reservation, ttl)
		}()
		rep.keep = nil
		var re *RoomError
		if err != nil && attempt < maxReserveAttempts && ctx.Err() == nil && errors.As(err, &re) && slices.ContainsFunc(re.Reserved, func(r LeaseInfo) bool { return r.Load != "" }) {
			// Another program admitted a load after the room was made:
			// its reservation keeps the room. Make it again: the plan
			// waits for that load to land and counts the loaded model.
			c.log.Debug("room taken by a load admitted meanwhile; making it again", "device", rq.device, "need", rq.need)
			continue
		}
		rep.Reservation = res
		return rep, err
	}
}

// maxReserveAttempts bounds how often EnsureFree makes its room again when
// loads admitted meanwhile keep the reservation from being taken.
const maxReserveAttempts = 2

// awaitOwnLoads waits, within rq.timeout, for the calls of this client
// started before it until their generation begins (a call being admitted
// by Options.Budget has sent nothing yet), then until every model on which
// this client has a generation with no reply yet is listed by the server,
// or those generations ended or streamed: a load that does not land within
// the bound is planned around as it is (the device shows what it holds so
// far), and logged.
func (c *OllamaClient) awaitOwnLoads(ctx context.Context, rq roomRequest) {
	wctx, cancel := context.WithTimeout(ctx, rq.timeout)
	defer cancel()
	for _, begun := range c.book.startingNow() {
		select {
		case <-begun:
		case <-wctx.Done():
			if ctx.Err() == nil {
				c.log.Debug("room-making: this client's calls still being admitted did not begin in time; planned without them", "timeout", rq.timeout)
			}
			return
		}
	}
	if len(c.book.loadingModels()) == 0 {
		return // no listing asked for
	}
	// At the slower of the two intervals: every /api/ps request is one
	// more chance of Ollama's listing race (README).
	err := c.awaitListing(wctx, max(rq.interval, c.opts.PollInterval), func(ms []api.ProcessModelResponse) bool {
		return !slices.ContainsFunc(c.book.loadingModels(), func(m string) bool { return findRunning(ms, m) == nil })
	})
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		c.log.Debug("room-making: this client's loads did not land in time; planned without them", "models", c.book.loadingModels(), "timeout", rq.timeout)
	}
	// Any other failure: the plan's own reading reports it.
}

// roomRequestOf checks req and makes it the room-making's request.
func (c *OllamaClient) roomRequestOf(req EnsureRequest, mode unloadMode) (roomRequest, error) {
	const op = "ensure free"
	if req.Bytes > maxBytes || req.Reserve > maxBytes {
		return roomRequest{}, invalid(op, "", "%d bytes (+%d reserve) is more than %d", req.Bytes, req.Reserve, uint64(maxBytes))
	}
	if req.Device < 0 || req.PollInterval < 0 || req.Timeout < 0 {
		return roomRequest{}, invalid(op, "", "negative device, poll interval or timeout")
	}
	if c.opts.VRAM == nil && !req.AllModels {
		return roomRequest{}, newError(op, "", KindInvalidInput,
			fmt.Errorf("%w; set AllModels to unload every model the server lists, other programs' included", ErrNoVRAMReader))
	}
	if r := req.Reservation; r != nil {
		switch {
		case req.DryRun:
			return roomRequest{}, invalid(op, "", "a dry run reserves nothing: Reservation with DryRun")
		case c.opts.VRAM == nil:
			return roomRequest{}, newError(op, "", KindInvalidInput, fmt.Errorf("%w: a reservation keeps measured free memory", ErrNoVRAMReader))
		case req.Bytes+req.Reserve == 0:
			return roomRequest{}, invalid(op, "", "a reservation of 0 bytes")
		}
		if _, err := r.validate(op); err != nil {
			return roomRequest{}, err
		}
	}
	return roomRequest{
		op: op, device: req.Device, need: req.Bytes + req.Reserve,
		interval:   cmp.Or(req.PollInterval, c.opts.VRAMPollInterval),
		timeout:    cmp.Or(req.Timeout, c.opts.UnloadTimeout),
		waitLeases: req.WaitForLeases, dryRun: req.DryRun, all: req.AllModels,
		mode: mode,
	}, nil
}

// readerError types a VRAM reader's failure: KindCanceled when ctx is
// done, the reader's own *Error as it is, anything else as
// KindUnavailable (the GPU could not be read). It is never KindServer:
// the server said nothing.
func readerError(ctx context.Context, op, model string, err error) error {
	if ctx.Err() != nil {
		return newError(op, model, KindCanceled, context.Cause(ctx))
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return newError(op, model, KindUnavailable, err)
}
