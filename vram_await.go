package vramguard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// vramHoldersShown bounds how many holders an error message names.
const vramHoldersShown = 5

// errAwaitTimeout is the cause of a wait that ran out of AwaitRequest.Timeout.
var errAwaitTimeout = errors.New("its timeout passed")

// AwaitRequest asks AwaitFree for free memory on one device.
//
// The zero value waits for nothing on device 0: it returns at the first
// snapshot that lists the device.
type AwaitRequest struct {
	Device  int    // the device's index, as in DeviceMemory.Index
	Bytes   uint64 // bytes the next allocation needs; at most MaxBytes
	Reserve uint64 // headroom on top of Bytes; at most MaxBytes
	// PollInterval is the time between snapshots, counted from the end of
	// one to the start of the next. 0 means 250 ms (the client default, DefaultOptions);
	// negative is refused.
	PollInterval time.Duration
	// Timeout bounds the wait; 0 means only ctx bounds it. Negative is
	// refused.
	Timeout time.Duration
}

// AwaitFree polls r until device req.Device has at least req.Bytes +
// req.Reserve bytes free, and returns the snapshot that showed it.
//
// It is the step between "Ollama says the model is unloaded" and "the
// driver has the memory back", which can take seconds after a runner
// exits.
//
// A reader error is retried at the next poll until the wait ends; AwaitFree
// logs nothing. The wait ends with an *Error of KindTimeout when
// req.Timeout passes, or KindCanceled (holding context.Cause(ctx)) when
// ctx is done; its cause is a *RoomError naming the holders from
// the last snapshot (its Err the wait's cause), or, if no snapshot ever succeeded, the last
// reader error. A device that is missing from a successful snapshot gives
// KindNotFound, one with less memory in total than needed KindInvalidInput,
// one whose source reports no figures (Total 0) KindUnavailable; these are
// not retried. A nil r, a negative device, interval or timeout, or a byte
// count above MaxBytes give KindInvalidInput before any snapshot.
//
// AwaitFree is safe for concurrent use if r is; it starts no goroutines.
func AwaitFree(ctx context.Context, r VRAMReader, req AwaitRequest) (*VRAMSnapshot, error) {
	const op = "await free"
	switch {
	case r == nil:
		return nil, invalid(op, "", "nil VRAM reader")
	case req.Device < 0:
		return nil, invalid(op, "", "negative device index %d", req.Device)
	case req.PollInterval < 0:
		return nil, invalid(op, "", "negative poll interval %v", req.PollInterval)
	case req.Timeout < 0:
		return nil, invalid(op, "", "negative timeout %v", req.Timeout)
	case req.Bytes > maxBytes || req.Reserve > maxBytes:
		return nil, invalid(op, "", "%d bytes (+%d reserve) is more than %d", req.Bytes, req.Reserve, uint64(maxBytes))
	}
	if ctx.Err() != nil {
		return nil, newError(op, "", KindCanceled, context.Cause(ctx))
	}
	need := req.Bytes + req.Reserve
	interval := req.PollInterval
	if interval == 0 {
		interval = defaultVRAMPollInterval
	}
	parent := ctx
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, req.Timeout, errAwaitTimeout)
		defer cancel()
	}

	var (
		last    *VRAMSnapshot
		lastErr error
		timer   *time.Timer
	)
	for {
		snap, err := r.Snapshot(ctx)
		if err == nil && snap == nil {
			err = errors.New("reader returned no snapshot")
		}
		switch {
		case err != nil:
			if ctx.Err() == nil { // else the error is the wait's end, not the reader's
				lastErr = err
			}
		default:
			lastErr = nil
			d := snap.Device(req.Device)
			switch {
			case d == nil:
				return snap, newError(op, "", KindNotFound, fmt.Errorf("no device %d in the %s snapshot (%d devices)", req.Device, snap.Source, len(snap.Devices)))
			case d.Total == 0:
				return snap, newError(op, "", KindUnavailable, fmt.Errorf("device %d reports no memory figures (%s)", req.Device, snap.Source))
			case need > d.Total:
				return snap, invalid(op, "", "needs %s but device %d has %s in total", vramFormatBytes(need), req.Device, vramFormatBytes(d.Total))
			case d.Free >= need:
				return snap, nil
			}
			last = snap
		}

		if timer == nil {
			timer = time.NewTimer(interval)
			defer timer.Stop()
		} else {
			timer.Reset(interval)
		}
		select {
		case <-ctx.Done():
			return last, vramAwaitEnded(op, parent, ctx, req.Device, need, last, lastErr)
		case <-timer.C:
		}
	}
}

// vramAwaitEnded builds the error of a wait that ran out: KindCanceled when
// the caller's ctx (parent) is done, else KindTimeout.
func vramAwaitEnded(op string, parent, ctx context.Context, device int, need uint64, last *VRAMSnapshot, lastErr error) error {
	kind, cause := KindTimeout, context.Cause(ctx)
	if parent.Err() != nil {
		kind, cause = KindCanceled, context.Cause(parent)
	}
	if last == nil {
		if lastErr != nil {
			return newError(op, "", kind, fmt.Errorf("no reading of device %d: %w (last reader error: %w)", device, cause, lastErr))
		}
		return newError(op, "", kind, fmt.Errorf("no reading of device %d: %w", device, cause))
	}
	d := last.Device(device)
	e := &RoomError{Device: device, Need: need, Free: d.Free, Total: d.Total, Reserved: d.Reserved, Err: cause, LastErr: lastErr}
	if d.ProcessesKnown {
		e.Holders = d.Holders()
	}
	return newError(op, "", kind, e)
}

// vramSortHolders sorts processes by memory, largest first, unknown
// figures last, then by PID.
func vramSortHolders(ps []GPUProcess) {
	slices.SortFunc(ps, func(a, b GPUProcess) int {
		if a.UsedKnown != b.UsedKnown {
			if a.UsedKnown {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.UsedBytes, a.UsedBytes), cmp.Compare(a.PID, b.PID))
	})
}

// vramFormatBytes formats n in binary units for messages.
func vramFormatBytes(n uint64) string {
	const (
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case n >= gib:
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	case n >= mib:
		return fmt.Sprintf("%.1f MiB", float64(n)/mib)
	default:
		return fmt.Sprintf("%d B", n)
	}
}
