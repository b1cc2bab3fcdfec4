package comfyui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
)

// Defaults of FreeRequest's zero values.
const (
	DefaultTolerance    = 64 << 20 // 64 MiB
	DefaultSettle       = 15 * time.Second
	DefaultFreeInterval = 100 * time.Millisecond
)

// FreeRequest says what Free asks of ComfyUI and how it measures the
// answer. The zero value unloads the models (POST /free
// {"unload_models": true}: torch's cache goes with them), does not wait
// for a running prompt, and reads the memory every 100 ms until two
// readings agree within 64 MiB, for at most 15 s.
type FreeRequest struct {
	// DropCache also sends free_memory: ComfyUI drops its node cache, so
	// an identical prompt runs again instead of being answered from the
	// cache (and reloads its models).
	DropCache bool
	// Wait makes Free wait, under ctx, for the prompt ComfyUI is running:
	// ComfyUI applies /free only after it. Without Wait such a free is
	// OutcomePending.
	Wait bool
	// Tolerance is how far two readings may differ and still agree, and
	// how little held memory still counts as none; zero means
	// DefaultTolerance.
	Tolerance uint64
	// Settle bounds the wait for the memory to come back, from the
	// moment ComfyUI can apply the free; zero means DefaultSettle (users
	// saw 0.2 s to more than 5 s).
	Settle time.Duration
	// Interval is the time between readings; zero means
	// DefaultFreeInterval.
	Interval time.Duration
}

// Outcome is what a Free's receipt can say.
type Outcome string

const (
	// OutcomeFreed: the memory was measured back: ComfyUI's torch pool
	// (/system_stats) holds nothing allocated beyond the tolerance, and
	// the GPU reader shows it back, each where it was read; readings
	// settled.
	OutcomeFreed Outcome = "freed"
	// OutcomePending: a prompt is running (Receipt.PromptID) and Free did
	// not wait: ComfyUI applies the free after it. Wait for the prompt
	// (Client.Wait) and measure again with another Free.
	OutcomePending Outcome = "pending"
	// OutcomePartlyFreed: memory did not come back: pinned by custom
	// nodes outside ComfyUI's model management (Receipt.Pinned), not yet
	// given back to the driver (Receipt.NotReturned), or readings that did
	// not settle within the bound.
	OutcomePartlyFreed Outcome = "partly freed"
	// OutcomeNotMeasured: nothing could measure the free (no GPU reader,
	// no answer from /system_stats), or what was read cannot tell freed
	// from held (see Receipt.NotChecked). The free was sent.
	OutcomeNotMeasured Outcome = "not measured"
)

// Measure is one figure before and after a free.
type Measure struct {
	Before, After uint64
	Known         bool // read both before and after
}

// Receipt is what a Free measured. It never says more than it read: a
// figure that was not read is not Known, and each check not made is named
// in NotChecked.
type Receipt struct {
	Outcome Outcome
	// PromptID is the prompt running when the free was sent (pending:
	// the free applies after it).
	PromptID string
	// Queued is the number of prompts waiting behind the running one: the
	// next one loads its models again right after the free.
	Queued int
	Device int
	// PID is ComfyUI's process, as found (Options.PID or Client.Process);
	// 0 when not found.
	PID uint32
	// Process is the memory the GPU reader shows for PID; Free the
	// device's free memory.
	Process, Free Measure
	// Torch is ComfyUI's reserved pool (/system_stats torch_vram_total).
	Torch Measure
	// Pinned is what torch still has allocated once settled (custom
	// nodes' memory that /free does not reach); PinnedKnown says whether
	// /system_stats answered.
	Pinned      uint64
	PinnedKnown bool
	// NotReturned is what torch let go that the driver did not show back
	// (an asynchronous allocator): zero when either was not read.
	NotReturned uint64
	// Settled: two readings in a row agreed within the tolerance after the
	// memory moved (or with nothing to free). Readings is how many were
	// taken after the free was sent.
	Settled   bool
	Readings  int
	Tolerance uint64
	// NotChecked names the checks not made, and why.
	NotChecked []string
	// Elapsed is from the request to the last reading; Waited the part
	// spent waiting for a running prompt.
	Elapsed, Waited time.Duration
}

// Released is the memory measured back: the process's drop where the
// reader lists it, else the device's gain, else torch's pool's drop;
// zero when nothing was measured.
func (r *Receipt) Released() uint64 {
	switch {
	case r.Process.Known:
		return sub(r.Process.Before, r.Process.After)
	case r.Free.Known:
		return sub(r.Free.After, r.Free.Before)
	case r.Torch.Known:
		return sub(r.Torch.Before, r.Torch.After)
	}
	return 0
}

// String is the receipt in one line.
func (r *Receipt) String() string {
	var b strings.Builder
	switch r.Outcome {
	case OutcomePending:
		fmt.Fprintf(&b, "free pending: prompt %s is running; ComfyUI applies the free after it (nothing measured yet)", r.PromptID)
		return b.String()
	case OutcomeNotMeasured:
		b.WriteString("free sent, not measured")
	default:
		fmt.Fprintf(&b, "%s %s in %v", r.Outcome, formatBytes(r.Released()), r.Elapsed.Round(time.Millisecond))
	}
	var parts []string
	if r.Process.Known {
		parts = append(parts, fmt.Sprintf("process %s → %s", formatBytes(r.Process.Before), formatBytes(r.Process.After)))
	} else if r.Free.Known {
		parts = append(parts, fmt.Sprintf("device free %s → %s", formatBytes(r.Free.Before), formatBytes(r.Free.After)))
	}
	if r.Torch.Known {
		parts = append(parts, fmt.Sprintf("torch pool %s → %s", formatBytes(r.Torch.Before), formatBytes(r.Torch.After)))
	}
	if r.PinnedKnown && r.Pinned > r.Tolerance {
		parts = append(parts, formatBytes(r.Pinned)+" pinned")
	}
	if r.NotReturned > r.Tolerance {
		parts = append(parts, formatBytes(r.NotReturned)+" not back at the driver")
	}
	if r.Outcome != OutcomeNotMeasured {
		if r.Settled {
			parts = append(parts, fmt.Sprintf("settled after %d readings", r.Readings))
		} else {
			parts = append(parts, fmt.Sprintf("not settled after %d readings", r.Readings))
		}
	}
	if len(parts) > 0 {
		b.WriteString(" (" + strings.Join(parts, ", ") + ")")
	}
	for _, n := range r.NotChecked {
		b.WriteString("; not checked: " + n)
	}
	return b.String()
}

// reading is one look at the memory: each figure with whether it was read.
type reading struct {
	proc, free           uint64
	procKnown, freeKnown bool
	torch, torchFree     uint64
	statsKnown           bool
	readerErr, statsErr  error
	procsListed          bool
}

// Free asks ComfyUI to give its memory back (POST /free) and measures
// whether it did, per FreeRequest: before, it reads the GPU (ComfyUI's
// process by PID when the reader lists processes, else the device's free
// memory) and /system_stats (torch's pool), and the queue; after, it reads
// both every Interval until two readings agree within Tolerance after the
// memory moved, or Settle passes, and says what it found in the receipt
// (see Outcome). A /system_stats that answers late while ComfyUI unloads
// is skipped for that reading, not an error. The error is the free's own
// failure (ComfyUI refused or did not answer /free, ctx ended); a free
// that gave back less is a receipt, not an error.
func (c *Client) Free(ctx context.Context, fr FreeRequest) (*Receipt, error) {
	const op = "comfyui: free"
	if err := c.checkOpen(op); err != nil {
		return nil, err
	}
	if fr.Settle < 0 || fr.Interval < 0 {
		return nil, invalidf(op, "negative Settle or Interval")
	}
	fr.Tolerance = cmp.Or(fr.Tolerance, DefaultTolerance)
	fr.Settle = cmp.Or(fr.Settle, DefaultSettle)
	fr.Interval = cmp.Or(fr.Interval, DefaultFreeInterval)
	start := time.Now()
	rc := &Receipt{Device: c.opts.Device, Tolerance: fr.Tolerance}
	rc.PID = c.pid(ctx)
	before := c.read(ctx, rc.PID)

	q, err := c.Queue(ctx)
	if err != nil {
		return nil, err
	}
	body := map[string]bool{"unload_models": true}
	if fr.DropCache {
		body["free_memory"] = true
	}
	if err := c.do(ctx, op, http.MethodPost, "/free", body, nil, c.opts.Timeout); err != nil {
		return nil, err
	}
	// A prompt that started between the two reads holds the free as well.
	if len(q.Running) == 0 {
		if q2, err := c.Queue(ctx); err == nil {
			q = q2
		}
	}
	if len(q.Running) > 0 {
		rc.PromptID, rc.Queued = q.Running[0].PromptID, len(q.Pending)
		if !fr.Wait {
			rc.Outcome, rc.Elapsed = OutcomePending, time.Since(start)
			rc.Process.Before, rc.Free.Before, rc.Torch.Before = before.proc, before.free, before.torch
			return rc, nil
		}
		ws := time.Now()
		if _, err := c.Wait(ctx, rc.PromptID); err != nil && vramguard.KindOf(err) != vramguard.KindServer &&
			vramguard.KindOf(err) != vramguard.KindOutOfMemory && !isInterrupted(err) {
			return nil, err // the wait itself failed (ctx, a server gone); a prompt that failed still ends
		}
		rc.Waited = time.Since(ws)
		// The "before" is what ComfyUI held once the prompt ended.
		before = c.read(ctx, rc.PID)
	}
	var last reading
	prev, settledOnce := reading{}, false
	deadline := time.Now().Add(fr.Settle)
	t := time.NewTicker(fr.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, &vramguard.Error{Op: op, Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
		case <-t.C:
		}
		last = c.read(ctx, rc.PID)
		rc.Readings++
		if rc.Readings > 1 && agree(prev, last, fr.Tolerance) && (moved(before, last, fr.Tolerance) || nothingHeld(before, fr.Tolerance, c.pinned.get())) {
			settledOnce = true
			break
		}
		prev = last
		if time.Now().After(deadline) {
			break
		}
	}
	rc.Settled = settledOnce
	judge(rc, before, last, c.opts.VRAM != nil)
	if rc.PinnedKnown && rc.Settled {
		c.pinned.set(rc.Pinned)
	}
	rc.Elapsed = time.Since(start)
	return rc, nil
}

func isInterrupted(err error) bool {
	var ee *ExecutionError
	return errors.As(err, &ee) && ee.Interrupted
}

// read takes one reading: the GPU reader (ComfyUI's process by pid, and
// the device's free memory) and /system_stats, each only if it answers.
func (c *Client) read(ctx context.Context, pid uint32) reading {
	var r reading
	if c.opts.VRAM != nil {
		snap, err := c.opts.VRAM.Snapshot(ctx)
		switch {
		case err != nil:
			r.readerErr = err
		case snap == nil || snap.Device(c.opts.Device) == nil:
			r.readerErr = fmt.Errorf("the GPU reader lists no device %d", c.opts.Device)
		default:
			d := snap.Device(c.opts.Device)
			r.free, r.freeKnown = d.Free, true
			r.procsListed = d.ProcessesKnown
			if pid != 0 && d.ProcessesKnown {
				for _, p := range d.Processes {
					if p.PID == pid && p.UsedKnown {
						r.proc += p.UsedBytes
						r.procKnown = true
					}
				}
			}
		}
	}
	st, err := c.SystemStats(ctx)
	switch {
	case err != nil:
		r.statsErr = err
	case len(st.Devices) == 0 || st.Devices[0].Type != "cuda":
		r.statsErr = fmt.Errorf("/system_stats lists no CUDA device (%d devices)", len(st.Devices))
	default:
		d := st.Devices[0]
		r.torch, r.torchFree, r.statsKnown = d.TorchVRAMTotal, d.TorchVRAMFree, true
	}
	return r
}

// agree says whether two readings agree within tol on every figure both
// read, and both read at least one.
func agree(a, b reading, tol uint64) bool {
	n := 0
	for _, f := range []struct {
		x, y uint64
		ok   bool
	}{
		{a.proc, b.proc, a.procKnown && b.procKnown},
		{a.free, b.free, a.freeKnown && b.freeKnown && !(a.procKnown && b.procKnown)},
		{a.torch, b.torch, a.statsKnown && b.statsKnown},
	} {
		if !f.ok {
			continue
		}
		n++
		if diff(f.x, f.y) > tol {
			return false
		}
	}
	return n > 0
}

// moved says whether the memory came back by more than tol since before:
// torch's pool shrank, the process holds less, or (without the process)
// the device has more free.
func moved(before, now reading, tol uint64) bool {
	switch {
	case before.statsKnown && now.statsKnown && sub(before.torch, now.torch) > tol:
		return true
	case before.procKnown && now.procKnown:
		return sub(before.proc, now.proc) > tol
	case before.freeKnown && now.freeKnown:
		return sub(now.free, before.free) > tol
	}
	return false
}

// nothingHeld says whether there was nothing to free before: torch's pool
// no more than what was found pinned last time, within tol.
func nothingHeld(before reading, tol, pinned uint64) bool {
	return before.statsKnown && before.torch <= pinned+tol
}

// judge fills in the receipt's figures and outcome from the readings
// before and after (see Outcome).
func judge(rc *Receipt, before, after reading, haveReader bool) {
	tol := rc.Tolerance
	rc.Process = Measure{before.proc, after.proc, before.procKnown && after.procKnown}
	rc.Free = Measure{before.free, after.free, before.freeKnown && after.freeKnown}
	rc.Torch = Measure{before.torch, after.torch, before.statsKnown && after.statsKnown}
	switch {
	case !haveReader:
		rc.NotChecked = append(rc.NotChecked, "the GPU: no reader (Options.VRAM)")
	case !rc.Free.Known:
		rc.NotChecked = append(rc.NotChecked, "the GPU: "+errText(cmpErr(after.readerErr, before.readerErr)))
	case rc.PID == 0:
		rc.NotChecked = append(rc.NotChecked, "ComfyUI's process: not found (set Options.PID); the device's free memory stands in")
	case !after.procsListed:
		rc.NotChecked = append(rc.NotChecked, "ComfyUI's process: the reader lists no processes; the device's free memory stands in")
	case !rc.Process.Known:
		rc.NotChecked = append(rc.NotChecked, fmt.Sprintf("ComfyUI's process: the reader does not list pid %d; the device's free memory stands in", rc.PID))
	}
	if !rc.Torch.Known {
		rc.NotChecked = append(rc.NotChecked, "torch's pool and pinned memory: /system_stats "+errText(cmpErr(after.statsErr, before.statsErr)))
	}
	gpuKnown := rc.Process.Known || rc.Free.Known
	if !gpuKnown && !rc.Torch.Known {
		rc.Outcome = OutcomeNotMeasured
		return
	}
	if after.statsKnown {
		rc.Pinned, rc.PinnedKnown = sub(after.torch, after.torchFree), true
	}
	if rc.Torch.Known && rc.Process.Known {
		rc.NotReturned = sub(sub(rc.Torch.Before, rc.Torch.After), sub(rc.Process.Before, rc.Process.After))
	}
	switch {
	case !rc.Settled:
		rc.Outcome = OutcomePartlyFreed
	case rc.PinnedKnown && rc.Pinned > tol, rc.NotReturned > tol:
		rc.Outcome = OutcomePartlyFreed
	case !rc.Torch.Known && !moved(before, after, tol):
		// The GPU alone cannot tell a ComfyUI with nothing loaded from one
		// whose memory is pinned.
		rc.Outcome = OutcomeNotMeasured
		rc.NotChecked = append(rc.NotChecked, "whether anything was held: nothing came back, and without /system_stats an empty ComfyUI and pinned memory look alike")
	default:
		rc.Outcome = OutcomeFreed
	}
}

func errText(err error) string {
	if err == nil {
		return "not read"
	}
	return err.Error()
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// pinnedSeen is what the last settled receipt found pinned: a later
// free counts it as held, not as memory to wait for.
type pinnedSeen struct {
	mu sync.Mutex
	n  uint64
}

func (p *pinnedSeen) get() uint64  { p.mu.Lock(); defer p.mu.Unlock(); return p.n }
func (p *pinnedSeen) set(n uint64) { p.mu.Lock(); defer p.mu.Unlock(); p.n = n }

func sub(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

func diff(a, b uint64) uint64 { return max(a, b) - min(a, b) }

// formatBytes prints n in binary units, one decimal.
func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
