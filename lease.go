package vramguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/vramguard/vramguard/internal/lease"
)

// ErrLeased: a lease keeps the model: another program's, another client's,
// a phase's (see OllamaClient.HoldModel) or one this client holds for
// someone else (OllamaClient.Reserve with ReserveOptions.Model).
// UnloadModel of a leased model fails with it (KindRefused); every other
// unload leaves the model and says so in UnloadReport.Leased.
var ErrLeased = errors.New("model is leased")

// ErrProtected: Options.Protected keeps the model out of room-making
// (EnsureFree, Budget.MakeRoom, UnloadAll).
var ErrProtected = errors.New("model is protected")

// LeaseOptions configures host-wide leases (Options.Leases). The zero value
// takes and honours leases in the per-user default directory.
//
// A lease names its server as "host:port" (localhost and 0.0.0.0 read as
// 127.0.0.1, Ollama's port by default). A client built on a caller's own
// api.Client without Options.Host cannot name its server: it cannot take
// leases, and it honours every lease on a model of that name, whatever
// the server.
type LeaseOptions struct {
	// Dir is the lease directory. Empty means $XDG_RUNTIME_DIR/vramguard/leases,
	// else a directory under the temp dir made with mode 0700. A directory
	// that another user owns, or whose mode lets group or others in at all
	// (anything but 0700; 0770 with Shared), is refused: no lease is
	// taken or honoured, and one WARN line says why.
	Dir string
	// Shared accepts a group-writable directory (mode 0770) and the leases
	// of the other users of its group: set it, with the same Dir, in every
	// program of users who share one GPU on purpose. Without it another
	// user's leases are neither read nor honoured.
	Shared bool
	// Off makes this client neither take leases (its phases run without)
	// nor honour other programs' leases.
	Off bool
	// Honour names other servers ("host:port", as Options.Host) whose
	// leases this client honours as its own server's: the servers its
	// requests reach under another address (a proxy's upstream, a pool's
	// members). Its own leases still name its own server.
	Honour []string
}

// LeaseInfo describes a lease, as every vramguard client on the host sees
// it: a hold on a model (HoldModel, a phase's, or one taken for someone
// else: Reserve with ReserveOptions.Model, which names them in For), or a
// reservation of free memory on a device (Reserve, a hand-over's,
// EnsureRequest.Reservation's, a budget's admitted load's, or room-making's
// hold on the room it is making, whose For is "the room it is making"),
// which has Bytes above zero and no Model.
type LeaseInfo struct {
	ID      string
	Model   string
	Server  string // the Ollama server, "host:port"; for a reservation, its holder's (informational)
	PID     int    // the holder's process
	Program string // the holder's program name
	Note    string // what holds it, e.g. "phase prompts"
	Created time.Time
	Until   time.Time // zero: until released, or until the holder exits

	// A reservation's device and bytes; the recipient (For, as
	// ReserveOptions.For) and the recipient's process (ForPID, 0: not
	// known) of a reservation or of a hold taken for someone else (a
	// proxy's HTTP client, say: Reserve with ReserveOptions.Model; "" and 0
	// for any other hold). Taken is what a reservation's recipient has
	// allocated of Bytes as the device showed it at the reading that
	// listed the reservation (DeviceMemory.Reserved); zero where not
	// measured.
	Device int
	Bytes  uint64
	For    string
	ForPID uint32
	Taken  uint64
	// Load names the model whose load in flight the reservation stands
	// for (ReserveOptions.Load); "" for any other.
	Load string
}

// String names the holder for a message: "caption (pid 42, phase
// prompts, until 12:00:01)"; for a hold taken for someone else the
// recipient first, "chat-ui via vramgate (pid 42, until 12:00:01)" (with
// the recipient's process, "chat-ui (pid 7) via vramgate ..."); for a
// reservation "orchestrator (pid 42, 10.0 GiB on device 0 for ComfyUI
// render 42, until 12:00:01)".
func (l LeaseInfo) String() string {
	s := fmt.Sprintf("%s (pid %d", l.Program, l.PID)
	if l.Bytes == 0 && (l.For != "" || l.ForPID != 0) {
		who := printable(l.For)
		switch {
		case who == "":
			who = fmt.Sprintf("pid %d", l.ForPID)
		case l.ForPID != 0:
			who += fmt.Sprintf(" (pid %d)", l.ForPID)
		}
		s = who + " via " + s
	}
	if l.Bytes > 0 {
		s += fmt.Sprintf(", %s on device %d", vramFormatBytes(l.Bytes), l.Device)
		if l.Taken > 0 {
			s += fmt.Sprintf(" (%s taken)", vramFormatBytes(min(l.Taken, l.Bytes)))
		}
		if l.For != "" {
			s += " for " + printable(l.For)
		}
	}
	if l.Note != "" {
		s += ", " + l.Note
	}
	if !l.Until.IsZero() {
		s += ", until " + l.Until.Format(time.TimeOnly)
	}
	return s + ")"
}

// printable is s, quoted when it holds a rune that is not printable (a
// lease's For as another program wrote it).
func printable(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

func infoOf(r lease.Record) LeaseInfo {
	return LeaseInfo{ID: r.ID, Model: r.Model, Server: r.Server, PID: r.PID, Program: r.Program,
		Note: r.Note, Created: r.Created, Until: r.Until,
		Device: r.Device, Bytes: r.Bytes, For: r.For, ForPID: uint32(r.ForPID), Load: r.Load}
}

// LeasedError is the cause of a refused UnloadModel: who holds the model.
type LeasedError struct {
	Model  string
	Leases []LeaseInfo
}

func (e *LeasedError) Error() string {
	ls := make([]string, len(e.Leases))
	for i, l := range e.Leases {
		ls[i] = l.String()
	}
	return fmt.Sprintf("%s is leased by %s", e.Model, strings.Join(ls, ", "))
}

// Unwrap returns ErrLeased.
func (e *LeasedError) Unwrap() error { return ErrLeased }

// leases is a client's view of the host's leases: the directory, opened
// once, and the leases this client holds, released by Close.
type leases struct {
	once sync.Once
	dir  *lease.Dir // nil when off or refused
	err  error      // why dir is nil, when not off

	mu   sync.Mutex
	held map[*Lease]struct{}
	// gone are the IDs of leases this client released in the last
	// goneFor, with when: a reading of the directory that began before a
	// release may still list the lease, and it is this client's own.
	gone map[string]time.Time
	// taking are the IDs of leases this client is taking (acquire).
	taking map[string]bool
}

// goneFor is how long a released lease's ID is remembered as this
// client's (leases.gone): far longer than one reading of the directory.
const goneFor = time.Minute

// leaseDir opens the lease directory on first use; nil when leases are off
// or the directory was refused (logged once).
func (c *OllamaClient) leaseDir() (*lease.Dir, error) {
	l := &c.leases
	l.once.Do(func() {
		if c.opts.Leases.Off {
			return
		}
		l.dir, l.err = lease.Open(lease.Options{Dir: c.opts.Leases.Dir, Shared: c.opts.Leases.Shared, Logger: c.log})
		if l.err != nil {
			c.log.Warn("host-wide leases off: the lease directory is refused", "err", l.err)
		}
	})
	return l.dir, l.err
}

// heldLeases returns the live leases on model ("": on every model) at
// this client's server that keep this client's calls: other holders',
// and the holds this client took for someone else (Reserve with
// ReserveOptions.Model). Its own leases (its phases', its HoldModel's)
// keep other clients' unloads, not its own.
func (c *OllamaClient) heldLeases(model string) []LeaseInfo {
	d, _ := c.leaseDir()
	if d == nil {
		return nil
	}
	// Without a host ("" for a caller's api.Client) every server's count.
	if model != "" {
		model = NormalizeModelName(model)
	}
	rs, err := d.Live(c.host, model)
	if err != nil {
		c.log.Warn("leases not read", "model", model, "err", err)
		return nil
	}
	if c.host != "" {
		for _, h := range c.opts.Leases.Honour {
			more, err := d.Live(h, model)
			if err != nil {
				c.log.Warn("leases not read", "model", model, "server", h, "err", err)
				continue
			}
			rs = append(rs, more...)
		}
	}
	var out []LeaseInfo
	for _, r := range rs {
		if l, ok := c.ownOf(r.ID); !ok || l != nil && l.forOther {
			out = append(out, infoOf(r))
		}
	}
	return out
}

// isProtected reports whether Options.Protected names model.
func (c *OllamaClient) isProtected(model string) bool {
	key := NormalizeModelName(model)
	return slices.ContainsFunc(c.opts.Protected, func(m string) bool { return NormalizeModelName(m) == key })
}

// Lease is a hold that every other vramguard client on the host honours:
// on a model (HoldModel, a phase's), while it lasts their unloads leave
// the model (UnloadModel is refused with ErrLeased) and their room-making
// does not evict it; on free memory (Reserve, a hand-over's reservation),
// their admissions and room-making count its bytes as not free. A hold on
// a model taken for someone else (Reserve with ReserveOptions.Model) is
// honoured by its own client too. It ends at Release, at its Until, when
// the client is closed, or when the holding process exits, SIGKILL
// included (the operating system drops its lock); a reservation also when
// its recipient has taken it whole. A Lease is safe for concurrent use.
type Lease struct {
	c    *OllamaClient
	held *lease.Held
	info LeaseInfo // ID, Model, Device, Bytes, For and ForPID never change: read without mu
	// forOther marks a hold taken for someone else (Reserve with
	// ReserveOptions.Model): it keeps this client's calls as another
	// holder's lease does, and it always has an end, as a reservation.
	forOther bool
	// mu guards timer and info's Until: a short lease's timer may fire
	// before track stores it, and Extend moves both.
	mu    sync.Mutex
	timer *time.Timer // ends the lease at its Until; nil without one
	once  sync.Once
	err   error
	ended bool // under mu: Release has begun
}

// Info describes the lease.
func (l *Lease) Info() LeaseInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.info
}

// Extend makes the lease end d from now instead of at its Until: every
// client on the host sees the new end at its next reading. Zero d, for a
// lease on a model, makes it last until Release; a lease Reserve took (a
// reservation, or a hold for someone else) always has an end, at most an
// hour away (ReserveOptions.TTL). A released or expired lease cannot be
// extended (KindInvalidInput wrapping ErrClosed); a negative or too long d
// fails with KindInvalidInput; a failure to write the lease's file with
// KindUnavailable, the lease unchanged.
func (l *Lease) Extend(d time.Duration) error {
	const op = "extend"
	switch {
	case d < 0:
		return invalid(op, l.info.Model, "negative lease span %v", d)
	case l.info.Bytes > 0 && (d == 0 || d > maxReserveTTL):
		return invalid(op, "", "reservation span %v: it must be above 0 and at most %v", d, maxReserveTTL)
	case l.forOther && (d == 0 || d > maxReserveTTL):
		return invalid(op, l.info.Model, "span %v of a hold for someone else: it must be above 0 and at most %v", d, maxReserveTTL)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return newError(op, l.info.Model, KindInvalidInput, fmt.Errorf("lease %s has ended: %w", l.info.ID, ErrClosed))
	}
	var until time.Time
	if d > 0 {
		until = time.Now().Add(d)
	}
	dir, _ := l.c.leaseDir()
	if err := l.held.Extend(dir, until); err != nil {
		return newError(op, l.info.Model, KindUnavailable, err)
	}
	l.info.Until = until
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if d > 0 {
		l.timer = time.AfterFunc(d, func() { _ = l.Release() })
	}
	return nil
}

// Release ends the lease. It is idempotent; the first call's error is
// returned by every call.
func (l *Lease) Release() error {
	l.once.Do(func() {
		l.mu.Lock()
		t := l.timer
		l.ended = true
		l.mu.Unlock()
		if t != nil {
			t.Stop()
		}
		l.err = l.held.Release()
		l.c.leases.mu.Lock()
		delete(l.c.leases.held, l)
		now := time.Now()
		if l.c.leases.gone == nil {
			l.c.leases.gone = make(map[string]time.Time)
		}
		for id, at := range l.c.leases.gone {
			if now.Sub(at) > goneFor {
				delete(l.c.leases.gone, id)
			}
		}
		l.c.leases.gone[l.info.ID] = now
		l.c.leases.mu.Unlock()
	})
	return l.err
}

// HoldModel takes a host-wide lease on model at this client's server for
// d (zero: until Release). It neither loads nor unloads the model: it
// keeps every other vramguard client on the host, in this process or any
// other, from unloading it while it lasts (ForceUnloadModel overrides it).
// This client's own calls are not kept by its own leases: to keep a model
// from this client's room-making, name it in Options.Protected. To hold a
// model for someone else (a proxy for its HTTP client), so that every
// program on the host, this client included, keeps it as that someone's
// and names them, call Reserve with ReserveOptions.Model.
//
// It fails with KindInvalidInput for a bad name or a negative d, with
// ErrClosed on a closed client, and with KindUnavailable when leases are
// off (LeaseOptions.Off) or the lease directory is refused.
func (c *OllamaClient) HoldModel(ctx context.Context, model string, d time.Duration) (*Lease, error) {
	const op = "hold"
	if err := validModelName(op, model); err != nil {
		return nil, err
	}
	if d < 0 {
		return nil, invalid(op, model, "negative lease span %v", d)
	}
	if err := c.checkOpen(op, model); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, newError(op, model, KindCanceled, context.Cause(ctx))
	}
	return c.hold(op, model, d, lease.Record{}, false)
}

// hold takes a lease on model at this client's server for d (zero: until
// Release). who carries what the lease says of its holder beyond its
// process: Note, and for a hold taken for someone else (forOther) the
// recipient, For and ForPID.
func (c *OllamaClient) hold(op, model string, d time.Duration, who lease.Record, forOther bool) (*Lease, error) {
	dir, err := c.leaseDir()
	if dir == nil {
		if err == nil {
			err = errors.New("leases are off (LeaseOptions.Off)")
		}
		return nil, newError(op, model, KindUnavailable, err)
	}
	if c.host == "" {
		return nil, newError(op, model, KindUnavailable, errors.New("the client does not know its server's address (a caller's api.Client without Options.Host): a lease could not name it"))
	}
	r := lease.Record{Server: lease.NormalizeServer(c.host), Model: NormalizeModelName(model), Note: who.Note, For: who.For, ForPID: who.ForPID}
	if d > 0 {
		r.Until = time.Now().Add(d)
	}
	l, err := c.acquire(dir, r, d, forOther)
	if err != nil {
		return nil, newError(op, model, KindUnavailable, err)
	}
	return l, nil
}

// acquire takes lease r in dir and tracks it (track). Its ID is chosen
// first and counted as this client's (leases.taking) until it is tracked:
// a reading of the directory meanwhile lists it, and it is this client's
// own (ownOf).
func (c *OllamaClient) acquire(dir *lease.Dir, r lease.Record, d time.Duration, forOther bool) (*Lease, error) {
	id, err := lease.NewID()
	if err != nil {
		return nil, err
	}
	r.ID = id
	c.leases.mu.Lock()
	if c.leases.taking == nil {
		c.leases.taking = make(map[string]bool)
	}
	c.leases.taking[id] = true
	c.leases.mu.Unlock()
	defer func() {
		c.leases.mu.Lock()
		delete(c.leases.taking, id)
		c.leases.mu.Unlock()
	}()
	h, err := dir.Acquire(r)
	if err != nil {
		return nil, err
	}
	return c.track(h, d, forOther), nil
}

// track makes h a Lease of this client (released by Close), ended by its
// own timer after d when d is above zero; forOther marks a hold taken for
// someone else.
func (c *OllamaClient) track(h *lease.Held, d time.Duration, forOther bool) *Lease {
	l := &Lease{c: c, held: h, info: infoOf(h.Record()), forOther: forOther}
	c.leases.mu.Lock()
	if c.leases.held == nil {
		c.leases.held = make(map[*Lease]struct{})
	}
	c.leases.held[l] = struct{}{}
	c.leases.mu.Unlock()
	if d > 0 {
		l.mu.Lock()
		l.timer = time.AfterFunc(d, func() { _ = l.Release() })
		l.mu.Unlock()
	}
	return l
}

// releaseLeases ends every lease this client holds (Close).
func (c *OllamaClient) releaseLeases() error {
	c.leases.mu.Lock()
	ls := make([]*Lease, 0, len(c.leases.held))
	for l := range c.leases.held {
		ls = append(ls, l)
	}
	c.leases.mu.Unlock()
	var errs []error
	for _, l := range ls {
		if err := l.Release(); err != nil {
			errs = append(errs, newError("close", l.info.Model, KindInternal, fmt.Errorf("lease release: %w", err)))
		}
	}
	return errors.Join(errs...)
}

// ForceUnloadModel is UnloadModel ignoring leases, this client's and other
// programs': for an operator who must have the memory back. It says in
// its report which leases it overrode.
func (c *OllamaClient) ForceUnloadModel(ctx context.Context, model string) (*UnloadReport, error) {
	if err := validModelName("unload", model); err != nil {
		return nil, err
	}
	if err := c.checkOpen("unload", model); err != nil {
		return nil, err
	}
	overridden := c.heldLeases(model)
	rep, err := c.unloadModel(ctx, model, unloadMode{cause: CauseUnloadModel, force: true})
	if rep != nil {
		rep.Leased = overridden
	}
	return rep, err
}

// leftLeased is the start of every unload: a model a lease keeps is left
// (kept true), with the report saying by whom; an explicit UnloadModel
// (mode.refuseLeased) is refused with ErrLeased.
func (c *OllamaClient) leftLeased(model string, mode unloadMode) (rep *UnloadReport, err error, kept bool) {
	if mode.force {
		return nil, nil, false
	}
	ls := c.heldLeases(model)
	if mode.cause == CauseGuard || mode.cause == CausePhaseEnd {
		// A model another live phase of this client keeps warm is in use
		// there: the last holder's End unloads it.
		key := NormalizeModelName(model)
		for _, l := range c.phaseHolds(mode.phase) {
			if l.Model == key {
				ls = append(ls, l)
			}
		}
	}
	if len(ls) == 0 {
		return nil, nil, false
	}
	rep = &UnloadReport{Model: model, Cause: mode.cause, Leased: ls}
	c.log.Info("model left: leased", "model", model, "cause", mode.cause, "holder", ls[0].String())
	if mode.refuseLeased {
		return rep, newError("unload", model, KindRefused, &LeasedError{Model: model, Leases: ls}), true
	}
	return rep, nil, true
}

// ownLeases are the leases on models this client holds as its own (not
// those it holds for someone else, which heldLeases lists).
func (c *OllamaClient) ownLeases() []LeaseInfo {
	c.leases.mu.Lock()
	defer c.leases.mu.Unlock()
	out := make([]LeaseInfo, 0, len(c.leases.held))
	for l := range c.leases.held {
		if l.info.Bytes > 0 || l.forOther {
			continue // a reservation holds no model; a hold for another is not this client's
		}
		info := l.Info()
		info.Model = NormalizeModelName(info.Model)
		out = append(out, info)
	}
	return out
}

// ownLeased is the set of models (normalized) this client holds leases on
// as its own: its phases' and HoldModel's.
func (c *OllamaClient) ownLeased() map[string]bool {
	c.leases.mu.Lock()
	defer c.leases.mu.Unlock()
	out := make(map[string]bool, len(c.leases.held))
	for l := range c.leases.held {
		if l.info.Bytes == 0 && !l.forOther {
			out[NormalizeModelName(l.info.Model)] = true
		}
	}
	return out
}
