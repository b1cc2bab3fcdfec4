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
	// included, instead of as few as needed. Without Options.VRAM it is
	// the only way: EnsureFree cannot measure, and fails with
	// ErrNoVRAMReader.
	AllModels bool
	// PollInterval is the time between VRAM snapshots while waiting;
	// zero means Options.VRAMPollInterval. Timeout bounds the wait; zero
	// means only ctx bounds it. Both are passed to AwaitFree.
	PollInterval time.Duration
	Timeout      time.Duration
	// WaitForLeases makes a call that leases keep from making room wait,
	// under ctx, until they end (looking again every PollInterval),
	// instead of failing at once with a *RoomError.
	WaitForLeases bool
	// Member is, on a pool (NewPool), the member whose device is made
	// room on, by PoolMember.Name; Device is then that member's. It must
	// be set on a pool and empty otherwise.
	Member string
}

// EnsureReport says what EnsureFree did.
type EnsureReport struct {
	Evicted []UnloadReport // models unloaded, verified
	// Kept are the listed models it left: Options.Protected, or leased.
	Kept       []KeptModel
	Release    *ReleaseReport
	FreeBefore uint64 // free bytes on the device before (0 without a reader)
	FreeAfter  uint64
	Snapshot   *VRAMSnapshot // the last snapshot taken; nil without a reader
	Source     string        // the snapshot's source, or SourceNone
	Elapsed    time.Duration
}

// Freed returns the rise in free memory on the device EnsureFree was asked
// about (EnsureRequest.Device), FreeAfter minus FreeBefore: from before the
// unloads to the end of the wait. Release.FreedAllDevices measures only
// the release functions' run, summed over every device.
func (r *EnsureReport) Freed() int64 { return int64(r.FreeAfter) - int64(r.FreeBefore) }

// EnsureFree makes room for a load of req.Bytes (plus req.Reserve) on
// req.Device. This is the call an orchestrator makes right before loading a
// diffusion model or a text encoder.
//
// If the device already has the room, it does nothing. Otherwise it unloads
// Ollama models, verified, largest first and as few as Ollama's size_vram
// says are needed (or all, with AllModels), runs ReleaseVRAM, and waits with
// AwaitFree, polling every req.PollInterval (Options.VRAMPollInterval by
// default), until the GPU itself reports the room. On failure the error is
// that of AwaitFree (an *InsufficientVRAMError names who holds the memory)
// or of the unloads.
//
// It never unloads a model Options.Protected names or a lease keeps (any
// vramguard client's on the host): EnsureReport.Kept lists them. When the
// room cannot be made without them it unloads nothing and fails with
// KindOutOfMemory wrapping a *RoomError (ErrLeased, ErrProtected) that
// names them, their holders and, for leases with an end, when to retry;
// with req.WaitForLeases it waits for the leases instead.
//
// Without a VRAM reader it cannot measure. With req.AllModels it unloads
// every listed model, other programs' included, runs ReleaseVRAM and
// reports Source SourceNone; without AllModels it fails with an *Error of
// KindInvalidInput wrapping ErrNoVRAMReader, and sends nothing.
//
// On a closed client it fails with ErrClosed and sends nothing.
func (c *OllamaClient) EnsureFree(ctx context.Context, req EnsureRequest) (*EnsureReport, error) {
	if err := c.checkOpen("ensure free", ""); err != nil {
		return nil, err
	}
	if c.pool != nil || req.Member != "" {
		return c.ensureFreeOn(ctx, req)
	}
	return c.ensureFree(ctx, req, unloadMode{cause: CauseEnsureFree})
}

// ensureFreeOn is EnsureFree on one member of a pool, made by the
// member's own client (verified there as on one server).
func (c *OllamaClient) ensureFreeOn(ctx context.Context, req EnsureRequest) (*EnsureReport, error) {
	const op = "ensure free"
	if c.pool == nil {
		return nil, invalid(op, "", "EnsureRequest.Member %q: the client is no pool", req.Member)
	}
	for _, m := range c.pool.members {
		if m.name == req.Member {
			req.Member, req.Device = "", m.device
			return m.c.ensureFree(ctx, req, unloadMode{cause: CauseEnsureFree})
		}
	}
	return nil, invalid(op, "", "the pool has no member %q (EnsureRequest.Member)", req.Member)
}

// ensureFree is EnsureFree for the library's own calls (Phase.End, which
// Close makes too).
// mode is the unloads' (the library's own calls do not cut the client's
// generations: unloadMode{keepLoads: true}).
func (c *OllamaClient) ensureFree(ctx context.Context, req EnsureRequest, mode unloadMode) (*EnsureReport, error) {
	const op = "ensure free"
	start := time.Now()
	if req.Bytes > maxBytes || req.Reserve > maxBytes {
		return nil, invalid(op, "", "%d bytes (+%d reserve) is more than %d", req.Bytes, req.Reserve, uint64(maxBytes))
	}
	if req.Device < 0 || req.PollInterval < 0 || req.Timeout < 0 {
		return nil, invalid(op, "", "negative device, poll interval or timeout")
	}
	if c.opts.VRAM == nil && !req.AllModels {
		return nil, newError(op, "", KindInvalidInput,
			fmt.Errorf("%w; set AllModels to unload every model the server lists, other programs' included", ErrNoVRAMReader))
	}
	interval := req.PollInterval
	if interval == 0 {
		interval = c.opts.VRAMPollInterval
	}
	rep := &EnsureReport{Source: SourceNone}
	need := req.Bytes + req.Reserve

	var free uint64
	if c.opts.VRAM != nil {
		snap, err := c.opts.VRAM.Snapshot(ctx)
		if err != nil {
			return rep, readerError(ctx, op, "", err)
		}
		d := snap.Device(req.Device)
		if d == nil {
			return rep, newError(op, "", KindNotFound, errors.New("no such device"))
		}
		if need > d.Total {
			return rep, invalid(op, "", "need %d bytes but device %d has %d in total", need, req.Device, d.Total)
		}
		free = d.Free
		rep.FreeBefore, rep.FreeAfter, rep.Snapshot, rep.Source = free, free, snap, snap.Source
		if free >= need && !req.AllModels {
			rep.Elapsed = time.Since(start)
			return rep, nil
		}
	}

	running, err := c.roomToMake(ctx, req, mode, rep, need, interval)
	if err != nil {
		return rep, err
	}
	victims := pickVictims(running, need, free, req.AllModels)
	var errs []error
	if len(victims) > 0 {
		reps, err := c.unloadMany(ctx, victims, mode)
		rep.Evicted = reps
		if err != nil {
			errs = append(errs, err)
		}
	}
	rr, err := c.releaseVRAM(ctx)
	rep.Release = rr
	if err != nil {
		errs = append(errs, err)
	}
	if c.opts.VRAM != nil {
		waitStart := time.Now()
		snap, err := AwaitFree(ctx, c.opts.VRAM, AwaitRequest{
			Device:       req.Device,
			Bytes:        req.Bytes,
			Reserve:      req.Reserve,
			PollInterval: interval,
			Timeout:      req.Timeout,
		})
		ev := VRAMWaitEvent{Device: req.Device, Need: need, Waited: time.Since(waitStart), Err: err}
		if snap != nil {
			rep.Snapshot = snap
			if d := snap.Device(req.Device); d != nil {
				rep.FreeAfter, ev.Free = d.Free, d.Free
			}
		}
		hookCtx(c, c.opts.Hooks.OnVRAMWait, ctx, ev)
		if err != nil {
			errs = append(errs, err)
		}
	}
	rep.Elapsed = time.Since(start)
	return rep, errors.Join(errs...)
}

// pickVictims chooses models to unload: all of them when all is set,
// otherwise the largest first until Ollama's size_vram figures say the
// device would have need bytes free. If even all of them would not do, it
// returns all of them (the rest is someone else's, and AwaitFree will say
// whose).
func pickVictims(running []api.ProcessModelResponse, need, free uint64, all bool) []string {
	ms := slices.Clone(running)
	slices.SortFunc(ms, func(a, b api.ProcessModelResponse) int {
		return cmp.Or(cmp.Compare(b.SizeVRAM, a.SizeVRAM), cmp.Compare(b.Size, a.Size), cmp.Compare(a.Model, b.Model))
	})
	var out []string
	for _, m := range ms {
		if !all && free >= need {
			break
		}
		out = append(out, m.Model)
		if m.SizeVRAM > 0 {
			free += uint64(m.SizeVRAM)
		}
	}
	return out
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
