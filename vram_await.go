package vramguard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// vramHoldersShown bounds how many holders an error message names.
const vramHoldersShown = 5

// errAwaitTimeout is the cause of a wait that ran out of AwaitRequest.Timeout.
var errAwaitTimeout = errors.New("await timeout passed")

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

// InsufficientVRAMError says that a device did not get the free memory a
// caller waited for, and who holds it. AwaitFree returns it wrapped in an
// *Error, so errors.As finds either.
type InsufficientVRAMError struct {
	Device int
	Need   uint64 // Bytes + Reserve
	Free   uint64 // free bytes in the last snapshot
	Total  uint64 // the device's memory
	// Snapshot is the last snapshot that listed the device.
	Snapshot *VRAMSnapshot
	// Holders are the device's processes in that snapshot, largest first
	// (unknown figures last); nil when the source cannot list processes.
	Holders []GPUProcess
	// Err is why the wait ended: context.Cause of the caller's ctx, or the
	// timeout. LastErr is the reader's error when the last poll failed.
	Err, LastErr error
}

func (e *InsufficientVRAMError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "device %d has %s free of %s, needs %s", e.Device,
		vramFormatBytes(e.Free), vramFormatBytes(e.Total), vramFormatBytes(e.Need))
	var d *DeviceMemory
	if e.Snapshot != nil {
		d = e.Snapshot.Device(e.Device)
	}
	switch {
	case d != nil && !d.ProcessesKnown:
		b.WriteString("; processes unknown")
	case len(e.Holders) == 0:
		b.WriteString("; no process listed (the memory is held by the driver or by processes it does not show)")
	default:
		vramWriteHolders(&b, e.Holders)
	}
	if e.LastErr != nil {
		fmt.Fprintf(&b, "; last reading failed: %v", e.LastErr)
	}
	return b.String()
}

// vramWriteHolders writes "; held by " and the first vramHoldersShown
// holders, largest first as given.
func vramWriteHolders(b *strings.Builder, holders []GPUProcess) {
	b.WriteString("; held by ")
	for i, p := range holders {
		if i == vramHoldersShown {
			fmt.Fprintf(b, " and %d more", len(holders)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(vramDescribeHolder(p))
	}
}

// Unwrap returns Err and LastErr, so that errors.Is sees the context's
// cause and the reader's error.
func (e *InsufficientVRAMError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Err, e.LastErr} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// vramDescribeHolder formats a process for a message, naming the model a
// runner serves when known:
// `pid 4242 "/usr/lib/ollama/llama-server --model /ro..." (ollama runner, model tiny-a) 5.2 GiB`.
func vramDescribeHolder(p GPUProcess) string {
	const maxCmd = 60
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d", p.PID)
	if p.Command != "" {
		cmd := p.Command
		if len(cmd) > maxCmd {
			cmd = cmd[:maxCmd] + "..."
		}
		fmt.Fprintf(&b, " %q", cmd)
	}
	fmt.Fprintf(&b, " (%s", p.Role)
	if m := p.Model; m != "" {
		if strings.ContainsFunc(m, func(r rune) bool { return r == ' ' || !unicode.IsPrint(r) }) {
			m = strconv.Quote(m) // a name from some process's argv
		}
		fmt.Fprintf(&b, ", model %s", m)
	}
	if p.Orphaned {
		b.WriteString(", orphaned")
	}
	b.WriteString(") ")
	if p.UsedKnown {
		b.WriteString(vramFormatBytes(p.UsedBytes))
	} else {
		b.WriteString("memory unknown")
	}
	return b.String()
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
// ctx is done; its cause is an *InsufficientVRAMError naming the holders
// from the last snapshot, or, if no snapshot ever succeeded, the last
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
	e := &InsufficientVRAMError{
		Device: device, Need: need, Free: d.Free, Total: d.Total,
		Snapshot: last, Err: cause, LastErr: lastErr,
	}
	if d.ProcessesKnown {
		e.Holders = append([]GPUProcess{}, d.Processes...)
		vramSortHolders(e.Holders)
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
