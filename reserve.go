package vramguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vramguard/vramguard/internal/lease"
)

// The bounds of a reservation's span (ReserveOptions.TTL).
const (
	defaultReserveTTL = 2 * time.Minute
	maxReserveTTL     = time.Hour
	maxReserveFor     = 256 // bytes of ReserveOptions.For
)

// ReserveOptions describes a reservation: free memory of one device kept
// for a recipient (Reserve, EnsureRequest.Reservation, a phase's hand-over);
// or, with Model, a hold on a model kept for a recipient (Reserve). The
// zero value keeps the bytes for two minutes for an unnamed recipient,
// not consumed as it allocates.
type ReserveOptions struct {
	// For names the recipient in every refusal the reservation or hold
	// causes, e.g. "ComfyUI render 42" (at most 256 bytes of printable
	// UTF-8): LeaseInfo.For, as every vramguard program on the host reads
	// it.
	For string
	// Note says what holds it, as LeaseInfo.Note ("phase prompts", or
	// the name of a client a proxy holds it for), under the same rules.
	Note string
	// PID is the recipient's process, when known (LeaseInfo.ForPID). For a
	// hold (Model) it only names the process. Where the VRAM reader
	// lists processes, the reservation is consumed as the device shows
	// that process's memory grow: it shrinks by as much (what it held when
	// the reservation was taken is the base), so reserved plus taken stays
	// what was reserved, and it ends when the whole room is taken. Without
	// a PID, or where the reader lists no processes, it stays whole until
	// released or until its TTL: consumption is measured, never assumed.
	PID uint32
	// TTL is how long the reservation or hold lasts unless released,
	// extended (Lease.Extend) or consumed first; zero means two minutes.
	// It must not be negative or above an hour: what is kept for someone
	// else always has an end, so that a recipient who went away does not
	// keep memory or a model for long.
	TTL time.Duration
	// Load, when set, names the model whose load in flight the
	// reservation stands for: a load admitted that the server does not
	// list yet, whose memory no reading shows whole. Room-making
	// elsewhere on the host (a phase's hand-over) then waits, within its
	// timeout, for it to end (the holder releases it once the server lists
	// the model) and plans with the loaded model, instead of refusing the
	// room or handing over bytes the load is about to take. A budget's
	// admission takes one for each load it admits; so does vramgate.
	// A hold (Model) has none.
	Load string
	// Model, when set, makes Reserve hold that model at this client's
	// server for the recipient instead of reserving memory: a lease on
	// the model, as HoldModel's, that names the recipient (For, PID) and
	// Note to every vramguard program on the host (LeaseInfo), and that
	// keeps this client's own calls too, as another program's lease does
	// (its UnloadModel is refused with ErrLeased, its room-making and
	// budget keep the model; ForceUnloadModel overrides it): a proxy
	// holding a model for its HTTP client holds it as the client's, not
	// its own. A reservation of room (EnsureRequest.Reservation,
	// PhaseOptions.Reserve, an admission's) takes no Model.
	Model string
}

// validate checks o, a reservation of room, for op and returns its TTL,
// defaults applied.
func (o ReserveOptions) validate(op string) (time.Duration, error) {
	if o.Model != "" {
		return 0, invalid(op, o.Model, "a reservation of room names no model (ReserveOptions.Model is for Reserve's hold on a model)")
	}
	return o.check(op, "reservation", "")
}

// check checks o's TTL and names for op, a "reservation" or a "hold"
// (of model), and returns its TTL, defaults applied.
func (o ReserveOptions) check(op, what, model string) (time.Duration, error) {
	switch {
	case o.TTL < 0 || o.TTL > maxReserveTTL:
		return 0, invalid(op, model, "%s TTL %v: it must be between 0 (two minutes) and %v", what, o.TTL, maxReserveTTL)
	}
	for _, f := range []struct{ name, s string }{{"For", o.For}, {"Note", o.Note}, {"Load", o.Load}} {
		switch {
		case len(f.s) > maxReserveFor:
			return 0, invalid(op, model, "%s's %s is %d bytes, more than %d", what, f.name, len(f.s), maxReserveFor)
		case !utf8.ValidString(f.s) || slices.ContainsFunc([]rune(f.s), func(r rune) bool { return !unicode.IsPrint(r) }):
			return 0, invalid(op, model, "%s's %s %q is not printable UTF-8", what, f.name, f.s)
		}
	}
	if o.TTL == 0 {
		return defaultReserveTTL, nil
	}
	return o.TTL, nil
}

// Reserve keeps bytes of device's free memory for a recipient: every
// vramguard client on the host, in this process or any other (package
// pool's placements and vramgate's admissions included), counts them as
// not free, and cannot make them free, until the reservation ends. Only
// this client's own calls may use them (its loads, its room-making). It
// is a Lease (Info says what it keeps and for whom): it ends at Release,
// at its TTL (Lease.Extend moves it), when the recipient has taken it all
// (ReserveOptions.PID), when the client is closed, or when this process
// exits, SIGKILL included.
//
// It takes the reservation only when the device, read now with the
// reservations of others taken out (room another client is making among
// them: EnsureFree), has bytes free: otherwise it fails
// with KindOutOfMemory and the *RoomError that names the holders (other
// reservations as HolderReserved, with their end as RetryAfter). To make
// the room first, call EnsureFree with EnsureRequest.Reservation set. The
// check and the taking are one step across the host (the lease
// directory's lock), so two holders' reservations never share bytes.
// This client's own reservations are its calls' to use, a new
// reservation of its own included: release one whose recipient has
// allocated before reserving its room for another. A load another
// vramguard client's budget or vramgate admitted holds a reservation of
// its own until it lands
// (ReserveOptions.Load), so it is counted before its runner shows it; a
// load sent around them (a program talking to Ollama's own port) is not.
//
// A reservation of memory needs Options.VRAM (KindInvalidInput wrapping
// ErrNoVRAMReader without: nothing would be verified; a hold, below,
// needs none) and host-wide leases
// (KindUnavailable when LeaseOptions.Off or the directory is refused). A
// negative device, zero bytes or more than the device holds, or options
// that ReserveOptions rules out fail with KindInvalidInput; a device the
// reader does not list with KindNotFound; a closed client with ErrClosed.
//
// With opts.Model set, Reserve holds that model for the recipient
// instead: device and bytes must be 0, and For (or PID) must name the
// recipient (else KindInvalidInput). It takes
// a lease on the model at this client's server, as HoldModel does
// (neither loading nor unloading it, no VRAM reader needed), that lasts
// opts.TTL (zero: two minutes; Lease.Extend moves it, never past an hour
// from then) and names opts.For, opts.PID and opts.Note to every
// vramguard program on the host (LeaseInfo.For, ForPID, Note; its
// String puts the recipient first: "chat-ui via vramgate (pid 42, ...)").
// Unlike HoldModel's, this lease is not the client's own: the client's
// UnloadModel is refused with ErrLeased naming the recipient, and its
// room-making, budget and EnsureFree keep the model, as for another
// program's lease (KeptModel.Leases lists it); ForceUnloadModel
// overrides it, and Close releases it. It fails as HoldModel does: with
// KindUnavailable when leases are off, the directory is refused, or the
// client does not know its server's address.
func (c *OllamaClient) Reserve(ctx context.Context, device int, bytes uint64, opts ReserveOptions) (*Lease, error) {
	const op = "reserve"
	if opts.Model != "" {
		return c.holdFor(ctx, device, bytes, opts)
	}
	if device < 0 || bytes == 0 || bytes > maxBytes {
		return nil, invalid(op, "", "reserve %d bytes on device %d: want 1 to %d bytes on a device of index 0 or more", bytes, device, uint64(maxBytes))
	}
	ttl, err := opts.validate(op)
	if err != nil {
		return nil, err
	}
	if err := c.checkOpen(op, ""); err != nil {
		return nil, err
	}
	if c.opts.VRAM == nil {
		return nil, newError(op, "", KindInvalidInput, fmt.Errorf("%w: a reservation keeps measured free memory", ErrNoVRAMReader))
	}
	if err := ctx.Err(); err != nil {
		return nil, newError(op, "", KindCanceled, context.Cause(ctx))
	}
	return c.reserve(ctx, roomRequest{op: op, device: device, need: bytes}, opts, ttl)
}

// holdFor is Reserve with opts.Model: a hold on the model for the
// recipient opts names, kept from this client's own calls too.
func (c *OllamaClient) holdFor(ctx context.Context, device int, bytes uint64, opts ReserveOptions) (*Lease, error) {
	const op = "reserve"
	model := opts.Model
	if err := validModelName(op, model); err != nil {
		return nil, err
	}
	switch {
	case device != 0 || bytes != 0:
		return nil, invalid(op, model, "a hold on a model (ReserveOptions.Model) keeps no memory: it takes device 0 and bytes 0, not device %d and %d bytes", device, bytes)
	case opts.Load != "":
		return nil, invalid(op, model, "a hold on a model (ReserveOptions.Model) has no Load (%q): Load names the load a reservation stands for", opts.Load)
	case strings.TrimSpace(opts.For) == "" && opts.PID == 0:
		return nil, invalid(op, model, "a hold for someone else (ReserveOptions.Model) names them: set For (or PID); HoldModel holds a model for this client itself")
	}
	ttl, err := opts.check(op, "hold", model)
	if err != nil {
		return nil, err
	}
	if err := c.checkOpen(op, model); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, newError(op, model, KindCanceled, context.Cause(ctx))
	}
	l, err := c.hold(op, model, ttl, lease.Record{For: opts.For, ForPID: int(opts.PID), Note: opts.Note}, true)
	if err != nil {
		return nil, err
	}
	c.log.Debug("model held for a recipient", "model", l.info.Model, "for", opts.For, "until", l.Info().Until.Format(time.TimeOnly))
	return l, nil
}

// reserve takes a reservation of rq.need bytes on rq.device, under the
// lease directory's lock, when the device (others' reservations taken out)
// has them free now.
func (c *OllamaClient) reserve(ctx context.Context, rq roomRequest, opts ReserveOptions, ttl time.Duration) (*Lease, error) {
	dir, err := c.leaseDir()
	if dir == nil {
		if err == nil {
			err = errors.New("leases are off (LeaseOptions.Off)")
		}
		return nil, newError(rq.op, "", KindUnavailable, fmt.Errorf("no reservation: %w", err))
	}
	unlock, err := dir.Lock(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, newError(rq.op, "", KindCanceled, context.Cause(ctx))
		}
		return nil, newError(rq.op, "", KindUnavailable, err)
	}
	defer unlock()
	_, d, err := c.readDevice(ctx, rq)
	if err != nil {
		return nil, err
	}
	// This client's own reservations are its calls' to use, a new
	// reservation of its own included (a pipeline's next hand-over after
	// a render that has its room): they are not taken out of the room.
	if d.Free < rq.need {
		re := &RoomError{Device: d.Index, Need: rq.need, Free: d.Free, Total: d.Total, Reserved: d.Reserved,
			RetryAfter: retryAfter(nil, d.Reserved, time.Now())}
		if d.ProcessesKnown {
			re.Holders = d.Holders()
		}
		return nil, newError(rq.op, "", KindOutOfMemory, re)
	}
	r := lease.Record{Device: d.Index, UUID: d.UUID, Bytes: rq.need, For: opts.For, Note: opts.Note, ForPID: int(opts.PID), Load: opts.Load, Until: time.Now().Add(ttl)}
	if c.host != "" {
		r.Server = lease.NormalizeServer(c.host)
	}
	if opts.PID != 0 && d.ProcessesKnown {
		r.ForBase = pidBytes(d, opts.PID)
	}
	l, err := c.acquire(dir, r, ttl, false)
	if err != nil {
		return nil, newError(rq.op, "", KindUnavailable, err)
	}
	level := slog.LevelInfo
	if opts.Load != "" {
		level = slog.LevelDebug // one per admitted load
	}
	c.log.Log(ctx, level, "memory reserved", "device", d.Index, "bytes", rq.need, "for", opts.For, "until", l.Info().Until.Format(time.TimeOnly))
	return l, nil
}

// The span of room-making's hold on the room it is making (keepRoom),
// renewed every holdRenew while its call runs: its end, and so the
// RetryAfter of a refusal it causes, stays a few seconds away, and the
// hold of a call that stopped renewing (its process stuck) ends within
// that span. A holder that exits ends it at once, as any lease.
const (
	holdSpan  = 5 * time.Second
	holdRenew = time.Second
)

// roomHold is room-making's hold on the room it is making: a reservation
// renewed while the call runs.
type roomHold struct {
	l    *Lease
	stop chan struct{}
	done chan struct{}
}

// keepRoom keeps, host-wide, the room rq is about to make on its device
// while it is made: a reservation of rq.need bytes, taken with plan p
// before its first step and without the free check of reserve (the bytes
// are still the victims'; other programs see the device overdrawn until
// the victims leave, DeviceMemory.Overdrawn), so that no other vramguard
// program's admission, Reserve or room-making takes what p's unloads and
// releases free before this call sees it free (composition oracle seeds
// 1796429849072189095, 1796429849072185979: a chat program's budget
// loaded into room a pool's placement and an EnsureFree had made, and the
// maker was refused after evicting). It lasts holdSpan, renewed every
// holdRenew until the call ends it (room.go, makeRoom) or turns it into
// the reservation it was asked for (EnsureFree's, a budget's load
// reservation) before ending it. Taken under the lease directory's lock,
// with the device read again: fresh is false when that reading no longer
// lets p make the room (another holder reserved or took memory since the
// plan), and nothing is taken: the caller plans again. nil, true where
// leases are off or the directory or reader fails: the room is then made
// as before, anyone's until taken (logged at debug).
func (c *OllamaClient) keepRoom(ctx context.Context, rq roomRequest, p roomPlan) (h *roomHold, fresh bool) {
	dir, _ := c.leaseDir()
	if dir == nil {
		return nil, true
	}
	unlock, err := dir.Lock(ctx)
	if err != nil {
		c.log.Debug("room-making: the room is not kept while it is made", "device", rq.device, "err", err)
		return nil, true
	}
	defer unlock()
	_, d, err := c.readDevice(ctx, rq)
	if err != nil {
		return nil, true // the plan's own readings report it
	}
	if !p.unknown && d.Free+p.known() < rq.need+d.Overdrawn {
		return nil, false
	}
	note := rq.op
	if rq.forLoad != "" {
		note = "budget, for the load of " + rq.forLoad
	}
	if len(note) > maxReserveFor || !utf8.ValidString(note) {
		note = rq.op
	}
	r := lease.Record{Device: d.Index, UUID: d.UUID, Bytes: rq.need, For: roomHoldFor, Note: note, Until: time.Now().Add(holdSpan)}
	if c.host != "" {
		r.Server = lease.NormalizeServer(c.host)
	}
	l, err := c.acquire(dir, r, holdSpan, false)
	if err != nil {
		c.log.Debug("room-making: the room is not kept while it is made", "device", rq.device, "err", err)
		return nil, true
	}
	h = &roomHold{l: l, stop: make(chan struct{}), done: make(chan struct{})}
	go h.renew()
	return h, true
}

// roomHoldFor is the recipient a hold on a room being made names.
const roomHoldFor = "the room it is making"

// renew extends the hold every holdRenew until stopped, or until an
// extension fails (the hold ended: the client closed, say).
func (h *roomHold) renew() {
	defer close(h.done)
	t := time.NewTicker(holdRenew)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			if h.l.Extend(holdSpan) != nil {
				return
			}
		}
	}
}

// endKeep ends the hold keepRoom took, if any; a failure is logged (the
// hold's span ends it anyway, and this process's exit).
func (c *OllamaClient) endKeep(h *roomHold) {
	if h == nil {
		return
	}
	close(h.stop)
	<-h.done
	if err := h.l.Release(); err != nil {
		c.log.Warn("room-making: the hold on the room made was not released; it ends at its span", "until", h.l.Info().Until.Format(time.TimeOnly), "err", err)
	}
}

// pidBytes is what process pid holds on d, as the reader lists it.
func pidBytes(d *DeviceMemory, pid uint32) uint64 {
	var n uint64
	for _, p := range d.Processes {
		if p.PID == pid && p.UsedKnown {
			n += p.UsedBytes
		}
	}
	return n
}

// taken is what of reservation r its recipient has allocated, as d shows
// it: the growth of its process over the base, at most r.Bytes; zero
// without a recipient process or where d lists no processes.
func taken(r lease.Record, d *DeviceMemory) uint64 {
	if r.ForPID <= 0 || !d.ProcessesKnown {
		return 0
	}
	now := pidBytes(d, uint32(r.ForPID))
	if now <= r.ForBase {
		return 0
	}
	return min(r.Bytes, now-r.ForBase)
}

// view is the device as this client may use it: the reader's snapshot
// with other holders' live reservations taken out of each device's Free
// and listed in its Reserved (what each has left after its recipient's
// allocations). Room-making, a budget's admission and Reserve read the
// device through it; an unload's verification reads the reader itself.
// This client's own reservations are its to use, and are released here
// once their recipient has taken them whole.
func (c *OllamaClient) view(ctx context.Context) (*VRAMSnapshot, error) {
	snap, err := c.opts.VRAM.Snapshot(ctx)
	if err != nil || snap == nil {
		return snap, err
	}
	dir, _ := c.leaseDir()
	if dir == nil {
		return snap, nil // leases off (a choice) or refused (warned once)
	}
	rs, err := dir.Reserved(-1)
	if err != nil {
		c.log.Warn("reservations not read: admissions do not see them", "err", err)
		return snap, nil
	}
	if len(rs) == 0 {
		return snap, nil
	}
	out := *snap
	out.Devices = slices.Clone(snap.Devices)
	for _, r := range rs {
		d := reservedDevice(&out, r)
		if d == nil {
			continue // a device this reader does not list
		}
		took := taken(r, d)
		if l, ok := c.ownOf(r.ID); ok {
			if l != nil && took >= r.Bytes {
				c.log.Info("reservation consumed: its recipient took the whole room", "device", r.Device, "bytes", r.Bytes, "for", r.For)
				_ = l.Release() // its file goes; nothing to report to a reader
			}
			continue
		}
		if took >= r.Bytes {
			continue // consumed: its holder ends it when it looks
		}
		info := infoOf(r)
		info.Taken = took
		left := r.Bytes - took
		d.Overdrawn += left - min(d.Free, left)
		d.Free -= min(d.Free, left)
		d.Reserved = append(d.Reserved, info)
	}
	return &out, nil
}

// ownOf, asked once a reading of the lease directory is done, says
// whether lease id, which the reading listed, is this client's: one it
// holds (the *Lease), or one it released since the reading began or is
// taking (nil, true: the file was listed before it went, or before the
// client tracked it). A lease this client took and released while the
// directory was read, or released a moment before a reading that listed
// it, is its own, never another holder's (composition oracle seed
// 1796445258199302218: a pool's phase hand-over was refused, naming the
// hold on the room its own client's EnsureFree had just released).
func (c *OllamaClient) ownOf(id string) (*Lease, bool) {
	c.leases.mu.Lock()
	defer c.leases.mu.Unlock()
	for l := range c.leases.held {
		if l.info.ID == id {
			return l, true
		}
	}
	_, gone := c.leases.gone[id]
	return nil, gone || c.leases.taking[id]
}

// reservedDevice is the device of snap that reservation r is on: by its
// UUID where r and the reader give one (the same for every reader on the
// host: a pool numbers its members' devices its own way), else by index.
func reservedDevice(snap *VRAMSnapshot, r lease.Record) *DeviceMemory {
	if r.UUID != "" {
		for i := range snap.Devices {
			if d := &snap.Devices[i]; d.UUID == r.UUID {
				return d
			}
		}
		if slices.ContainsFunc(snap.Devices, func(d DeviceMemory) bool { return d.UUID != "" }) {
			return nil // the reader names its devices, and not this one
		}
	}
	return snap.Device(r.Device)
}

// viewReader is the client's view as a VRAMReader, for AwaitFree.
type viewReader struct{ c *OllamaClient }

func (v viewReader) Snapshot(ctx context.Context) (*VRAMSnapshot, error) { return v.c.view(ctx) }

var _ VRAMReader = viewReader{}
