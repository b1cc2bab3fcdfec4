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
	DefaultQuiet        = time.Second
)

// FreeRequest says what Free asks of ComfyUI and how it measures the
// answer. The zero value unloads the models (POST /free
// {"unload_models": true}: torch's cache goes with them), does not wait
// for a running prompt, and reads the memory every 100 ms until two
// readings agree within 64 MiB after the memory moved, or agree with the
// reading before the free for 1 s (nothing moved), for at most 15 s.
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
	// saw 0.2 s to more than 5 s). A free still moving when it passes is
	// OutcomePending, never pinned.
	Settle time.Duration
	// Quiet is how long readings must agree with the reading before the
	// free for Free to say that nothing moved (the readings have settled
	// on what ComfyUI keeps); zero means DefaultQuiet. A free that only
	// starts to move later than Quiet (an asynchronous allocator under
	// load) is then reported partly freed: raise Quiet for such a GPU.
	Quiet time.Duration
	// Interval is the time between readings; zero means
	// DefaultFreeInterval.
	Interval time.Duration
	// Reserve, when set, keeps the memory the free measurably gave back
	// for the load it was freed for (an LLM's, say), so that no other
	// program on the host takes it first: see FreeReservation.
	Reserve *FreeReservation
}

// FreeReservation asks Free to reserve what it freed: after a free whose
// receipt says memory came back (Receipt.Released), the reservation of
// that much (at most Bytes, when set) on the device, as the holder
// client's OllamaClient.Reserve takes it (the device, read then with
// others' reservations taken out, must still have it free), is in
// Receipt.Reservation. Its recipient is ReserveOptions.For (with PID, it
// ends as that process allocates); its holder releases it, or its TTL
// ends it. ReserveOptions.Model (a hold on a model, not memory) has no
// place here: with it set the reservation is refused as invalid input. A free that gave nothing back, or whose reservation was
// refused, reserves nothing, and the receipt's NotChecked says why; the
// free's own outcome stands.
type FreeReservation struct {
	// Client holds the reservation: the vramguard client of the program
	// that will load (its own loads may use it). Required; it needs a
	// GPU reader of the same device.
	Client *vramguard.OllamaClient
	vramguard.ReserveOptions
	// Bytes caps the reservation; zero: all that came back.
	Bytes uint64
}

// Outcome is what a Free's receipt can say.
type Outcome string

const (
	// OutcomeFreed: the memory was measured back on the GPU (ComfyUI's
	// process holds less, or, where the reader cannot list it, the device
	// has more free) and the readings settled, with nothing pinned.
	// /system_stats' torch pool is a secondary view, never the only
	// source of a "freed".
	OutcomeFreed Outcome = "freed"
	// OutcomePending: the free is not done: a prompt is running
	// (Receipt.PromptID) and Free did not wait (ComfyUI applies the free
	// after it: wait for the prompt with Client.Wait and measure again),
	// or the readings were still moving, or had not yet moved, when
	// Settle or ctx ended: Receipt.Pending is what ComfyUI still held
	// beyond what a free leaves, on its way.
	OutcomePending Outcome = "pending"
	// OutcomePartlyFreed: once the readings settled, memory had not come
	// back: pinned by custom nodes outside ComfyUI's model management, or
	// held and not moving (Receipt.Pinned), or let go by torch but not
	// shown back by the driver (Receipt.NotReturned).
	OutcomePartlyFreed Outcome = "partly freed"
	// OutcomeNotMeasured: nothing on the GPU could measure the free (no
	// GPU reader, or it failed; torch's pool alone does not count), or
	// what was read cannot tell freed from held (see Receipt.NotChecked).
	// The free was sent.
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
	// Mode is the memory management ComfyUI runs with, from what
	// /system_stats reports (SystemStats.Mode) and, where that does not
	// say, how it behaves (a process holding far more than torch's pool:
	// DynamicVRAM's weights).
	Mode Mode
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
	// Pending is, for a free whose readings had not settled when its
	// bound ended, what ComfyUI still held on the GPU beyond what a free
	// leaves (the last settled free's remainder, else torch's allocated
	// memory): memory on its way, or not yet moving; zero when not read.
	Pending uint64
	// Settled: two readings in a row agreed within the tolerance after the
	// memory moved (or with nothing to free). Readings is how many were
	// taken after the free was sent.
	Settled   bool
	Readings  int
	Tolerance uint64
	// NotChecked names the checks not made, and why (a reservation asked
	// for and not taken among them).
	NotChecked []string
	// Reservation keeps what the free gave back, when FreeRequest.Reserve
	// asked for it and it was taken; nil otherwise.
	Reservation *vramguard.Lease
	// Elapsed is from the request to the last reading; Waited the part
	// spent waiting for a running prompt.
	Elapsed, Waited time.Duration
}

// Released is the memory measured back on the GPU: the process's drop
// where the reader lists it, else the device's gain; zero when the GPU
// was not read (torch's pool alone does not count).
func (r *Receipt) Released() uint64 {
	switch {
	case r.Process.Known:
		return sub(r.Process.Before, r.Process.After)
	case r.Free.Known:
		return sub(r.Free.After, r.Free.Before)
	}
	return 0
}

// String is the receipt in one line.
func (r *Receipt) String() string {
	var b strings.Builder
	switch r.Outcome {
	case OutcomePending:
		if r.Readings == 0 {
			fmt.Fprintf(&b, "free pending: prompt %s is running; ComfyUI applies the free after it (nothing measured yet)", r.PromptID)
			return b.String()
		}
		fmt.Fprintf(&b, "free pending: %s back in %v, %s still held and not settled", formatBytes(r.Released()), r.Elapsed.Round(time.Millisecond), formatBytes(r.Pending))
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
	if r.Mode != ModeUnknown {
		parts = append(parts, string(r.Mode))
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
	// held is what ComfyUI holds on the GPU: proc, else (the reader lists
	// processes but not ComfyUI's) the device's used memory less every
	// listed process's.
	held                uint64
	heldKnown           bool
	torch, torchFree    uint64
	statsKnown          bool
	mode                Mode
	readerErr, statsErr error
	procsListed         bool
}

// Free asks ComfyUI to give its memory back (POST /free) and measures
// whether it did, per FreeRequest: before, it reads the GPU (ComfyUI's
// process by PID when the reader lists processes, else the device's free
// memory) and /system_stats (torch's pool, a secondary view), and the
// queue; after, it reads both every Interval until two readings agree
// within Tolerance after the memory moved, or agree with the first for
// Quiet (nothing moved), or Settle passes, and says what it found in the
// receipt (see Outcome). A /system_stats that answers late while ComfyUI
// unloads is skipped for that reading, not an error.
//
// The error is the free's own failure (ComfyUI refused or did not answer
// /free), or ctx ending: then Free returns the receipt of what it read so
// far as well (pending), and the error, of KindTimeout when a deadline
// passed (KindCanceled otherwise), holds a *WaitError with it. A free that
// gave back less is a receipt, not an error.
func (c *Client) Free(ctx context.Context, fr FreeRequest) (*Receipt, error) {
	const op = "comfyui: free"
	if err := c.checkOpen(op); err != nil {
		return nil, err
	}
	if fr.Settle < 0 || fr.Interval < 0 || fr.Quiet < 0 {
		return nil, invalidf(op, "negative Settle, Quiet or Interval")
	}
	if fr.Reserve != nil && fr.Reserve.Client == nil {
		return nil, invalidf(op, "FreeRequest.Reserve without a Client to hold the reservation")
	}
	fr.Tolerance = cmp.Or(fr.Tolerance, DefaultTolerance)
	fr.Settle = cmp.Or(fr.Settle, DefaultSettle)
	fr.Quiet = cmp.Or(fr.Quiet, DefaultQuiet)
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
	floor, floorKnown := c.floor.get()
	ended := func(last reading) (*Receipt, error) {
		rc.Mode = modeOf(before, last)
		judge(rc, before, last, c.opts.VRAM != nil, c.floorOf(floor, floorKnown, last, rc.Mode))
		rc.Elapsed = time.Since(start)
		return rc, &vramguard.Error{Op: op, Kind: ctxKind(ctx), Err: &WaitError{PromptID: rc.PromptID, Queued: rc.Queued, Waited: rc.Elapsed, Receipt: rc, Err: ctxCause(ctx)}}
	}
	if len(q.Running) > 0 {
		rc.PromptID, rc.Queued = q.Running[0].PromptID, len(q.Pending)
		if !fr.Wait {
			if fr.Reserve != nil {
				rc.NotChecked = append(rc.NotChecked, "reservation: the free is pending behind a running prompt (FreeRequest.Wait waits for it)")
			}
			rc.Outcome, rc.Elapsed = OutcomePending, time.Since(start)
			rc.Mode = modeOf(before, before)
			rc.Process.Before, rc.Free.Before, rc.Torch.Before = before.proc, before.free, before.torch
			return rc, nil
		}
		ws := time.Now()
		if _, err := c.wait(ctx, rc.PromptID, false); err != nil {
			if ctx.Err() != nil {
				rc.Waited = time.Since(ws)
				return ended(before)
			}
			if k := vramguard.KindOf(err); k != vramguard.KindServer && k != vramguard.KindOutOfMemory && !isInterrupted(err) {
				return nil, err // the wait itself failed (a server gone); a prompt that failed still ends
			}
		}
		rc.Waited = time.Since(ws)
		// The "before" is what ComfyUI held once the prompt ended.
		before = c.read(ctx, rc.PID)
	}
	// Settled: two readings agree and ComfyUI holds no more than what a
	// free leaves (the floor), or the readings have not changed for Quiet
	// (a free that moves in steps is not taken for done between two).
	var last reading
	prev, settled := before, false
	changed := time.Now()
	deadline := changed.Add(fr.Settle)
	t := time.NewTicker(fr.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if rc.Readings == 0 {
				last = before
			}
			return ended(last)
		case <-t.C:
		}
		last = c.read(ctx, rc.PID)
		rc.Readings++
		if !agree(prev, last, fr.Tolerance) {
			changed = time.Now()
		} else if rc.Readings > 1 {
			mode := modeOf(before, last)
			if atFloor(last, fr.Tolerance, c.floorOf(floor, floorKnown, last, mode), mode, c.pinned.get()) || time.Since(changed) >= fr.Quiet {
				settled = true
				break
			}
		}
		prev = last
		if time.Now().After(deadline) {
			break
		}
	}
	rc.Settled = settled
	rc.Mode = modeOf(before, last)
	judge(rc, before, last, c.opts.VRAM != nil, c.floorOf(floor, floorKnown, last, rc.Mode))
	if rc.Settled {
		if rc.PinnedKnown {
			c.pinned.set(rc.Pinned)
		}
		if last.heldKnown {
			c.floor.set(last.held)
		}
	}
	rc.Elapsed = time.Since(start)
	if fr.Reserve != nil {
		c.reserve(ctx, rc, fr.Reserve)
	}
	return rc, nil
}

// reserve takes fr's reservation of what rc measured coming back.
func (c *Client) reserve(ctx context.Context, rc *Receipt, fr *FreeReservation) {
	n := rc.Released()
	if fr.Bytes > 0 {
		n = min(n, fr.Bytes)
	}
	if n == 0 {
		rc.NotChecked = append(rc.NotChecked, "reservation: nothing measurably came back to reserve")
		return
	}
	l, err := fr.Client.Reserve(ctx, rc.Device, n, fr.ReserveOptions)
	if err != nil {
		rc.NotChecked = append(rc.NotChecked, "reservation: "+err.Error())
		c.log.Warn("comfyui: what the free gave back is not reserved", "bytes", n, "err", err)
		return
	}
	rc.Reservation = l
}

// floorOf is what a settled free leaves ComfyUI holding: the last settled
// free's remainder when known; else, in DynamicVRAM mode (or an unknown
// one), torch's allocated memory in r (custom nodes' memory, which /free
// does not reach, the weights being outside the pool); in ModelPatcher
// mode, whose pool holds the models, what the last receipt found pinned.
func (c *Client) floorOf(floor uint64, known bool, r reading, mode Mode) uint64 {
	switch {
	case known:
		return floor
	case mode == ModeModelPatcher:
		return c.pinned.get()
	case r.statsKnown:
		return sub(r.torch, r.torchFree)
	}
	return 0
}

// modeOf is the mode /system_stats reports, else the one the readings
// show: a process holding more than torch's pool by over 1 GiB holds
// weights outside it (DynamicVRAM).
func modeOf(rs ...reading) Mode {
	for _, r := range rs {
		if r.mode != ModeUnknown {
			return r.mode
		}
	}
	for _, r := range rs {
		if r.procKnown && r.statsKnown && r.proc > r.torch+1<<30 {
			return ModeDynamicVRAM
		}
	}
	return ModeUnknown
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
			r.proc, r.procKnown, r.held, r.heldKnown = heldOn(d, pid)
		}
	}
	st, err := c.SystemStats(ctx)
	switch {
	case err != nil:
		r.statsErr = err
	case len(st.Devices) == 0 || st.Devices[0].Type != "cuda":
		r.statsErr = fmt.Errorf("/system_stats lists no CUDA device (%d devices)", len(st.Devices))
		r.mode = st.Mode()
	default:
		d := st.Devices[0]
		r.torch, r.torchFree, r.statsKnown = d.TorchVRAMTotal, d.TorchVRAMFree, true
		r.mode = st.Mode()
	}
	return r
}

// heldOn is what ComfyUI (pid) holds on d: its process's memory where the
// reader lists it (proc); else, where the reader lists processes, the
// device's used memory less what Ollama's processes hold (ComfyUI in a
// container, or its process not found: another program's memory then
// counts as ComfyUI's, an overstatement room-making verifies on the
// device, never an understatement that would refuse a load by
// arithmetic); else unknown.
func heldOn(d *vramguard.DeviceMemory, pid uint32) (proc uint64, procKnown bool, held uint64, heldKnown bool) {
	if !d.ProcessesKnown {
		return 0, false, 0, false
	}
	var ollama uint64
	for _, p := range d.Processes {
		switch {
		case pid != 0 && p.PID == pid && p.UsedKnown:
			proc += p.UsedBytes
			procKnown = true
		case p.Role == vramguard.RoleOllamaRunner || p.Role == vramguard.RoleOllamaServer || p.Role == vramguard.RoleOllamaDiscovery:
			if !p.UsedKnown {
				return proc, procKnown, proc, procKnown // Ollama's use unknown: no remainder to count
			}
			ollama += p.UsedBytes
		}
	}
	if procKnown {
		return proc, true, proc, true
	}
	return 0, false, sub(sub(d.Total, d.Free), ollama), true
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

// moved says whether the memory came back on the GPU by more than tol
// since before: the process holds less or (without the process) the
// device has more free. Without a GPU reading, torch's pool shrinking
// counts as movement (the receipt is then not measured all the same).
func moved(before, now reading, tol uint64) bool {
	switch {
	case before.procKnown && now.procKnown:
		return sub(before.proc, now.proc) > tol
	case before.freeKnown && now.freeKnown:
		return sub(now.free, before.free) > tol
	case before.statsKnown && now.statsKnown:
		return sub(before.torch, now.torch) > tol
	}
	return false
}

// atFloor says whether r shows ComfyUI holding no more than what a free
// leaves: no more than floor on the GPU; or, without that, in
// ModelPatcher mode (where torch's pool holds the models) a pool no
// larger than what was found pinned last time. DynamicVRAM's pool reads
// about 0 with its weights resident: it never says nothing is held.
func atFloor(r reading, tol, floor uint64, mode Mode, pinned uint64) bool {
	if r.heldKnown {
		return r.held <= floor+tol
	}
	return mode == ModeModelPatcher && r.statsKnown && r.torch <= pinned+tol
}

// judge fills in the receipt's figures and outcome from the readings
// before and after (see Outcome); floor is what a settled free leaves.
func judge(rc *Receipt, before, after reading, haveReader bool, floor uint64) {
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
	if !gpuKnown {
		rc.Outcome = OutcomeNotMeasured
		if rc.Torch.Known {
			rc.NotChecked = append(rc.NotChecked, "whether the memory came back: torch's pool alone cannot say (DynamicVRAM's weights are outside it)")
		}
		return
	}
	if !rc.Settled {
		// Not settled: nothing is called pinned; what is still held
		// beyond what a free leaves is on its way, or not yet moving.
		rc.Outcome = OutcomePending
		if after.heldKnown {
			rc.Pending = sub(after.held, floor)
		}
		return
	}
	if after.statsKnown {
		rc.Pinned, rc.PinnedKnown = sub(after.torch, after.torchFree), true
	}
	if rc.Torch.Known && rc.Process.Known {
		rc.NotReturned = sub(sub(rc.Torch.Before, rc.Torch.After), sub(rc.Process.Before, rc.Process.After))
	}
	mv := moved(before, after, tol)
	switch {
	case rc.PinnedKnown && rc.Pinned > tol, rc.NotReturned > tol:
		rc.Outcome = OutcomePartlyFreed
	case !mv && after.heldKnown && after.held > floor+tol:
		// Settled on memory that did not move: held, measured not to
		// come back.
		rc.Outcome = OutcomePartlyFreed
		rc.Pinned, rc.PinnedKnown = max(rc.Pinned, sub(after.held, floor)), true
	case !mv && !after.heldKnown && !rc.Torch.Known:
		// The device's free memory alone cannot tell a ComfyUI with
		// nothing loaded from one whose memory is pinned.
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

// floorSeen is what ComfyUI held on the GPU after the last settled free:
// what a free leaves (its CUDA context, pinned memory), not counted in the
// tenant's size and not waited for.
type floorSeen struct {
	mu    sync.Mutex
	n     uint64
	known bool
}

func (f *floorSeen) get() (uint64, bool) { f.mu.Lock(); defer f.mu.Unlock(); return f.n, f.known }
func (f *floorSeen) set(n uint64)        { f.mu.Lock(); defer f.mu.Unlock(); f.n, f.known = n, true }

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
