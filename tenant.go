package vramguard

// The tenants: other holders of device memory that can give some back,
// registered with RegisterTenant. Room-making (room.go) asks them on
// their device.

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Tenant is another holder of device memory that can give some back when
// asked: a diffusion server's model cache, an allocator's pool. Registered
// with RegisterTenant, it is one more way room-making (EnsureFree,
// Budget.MakeRoom, Phase.End's hand-over) makes room on its device.
//
// The order is fixed: first the tenants with First set, then Ollama's
// models (the fewest bytes that make the room, never a protected, leased
// or in-use model; this client's own leased models last), then the other
// tenants, each step only while the room is still missing. A tenant's
// release counts as verified when the device shows, within the call's
// wait, Bytes more free than before it ran, or the room the call needs
// if that is less (for a tenant whose size is not known: the room);
// EnsureReport.Tenants says what each gave back.
type Tenant struct {
	// Name names the tenant in reports and logs.
	Name string
	// Device is the device it frees memory on.
	Device int
	// Bytes is what it can give back, when known. Zero: the memory the
	// device shows for PID, when set and listed; else unknown, and
	// room-making cannot count on it before it runs (a room that only
	// such a tenant might make is tried, not refused at once).
	Bytes uint64
	// PID is its process, when known: room-making reads what it holds
	// on the device from the reader.
	PID uint32
	// Size, when set, is asked at each plan what the tenant can give back
	// now (a cache that grows and shrinks): it overrides Bytes and PID. An
	// error or zero makes the size unknown for that plan. It must honour
	// ctx; a panic is recovered and counts as an error.
	Size func(ctx context.Context) (uint64, error)
	// First makes room-making ask it before unloading Ollama's models.
	First bool
	// Release gives the memory back. It should return once the tenant
	// has let go as far as it can tell; room-making then waits for the
	// device. A Release that fails is not waited for: one reading says
	// what it left. One that fails with an error of KindRefused (a tenant
	// busy with work the memory serves, a render say) refuses the room:
	// when the rest of the plan does not make it, room-making ends at
	// once with the *RoomError (its RetryAfter raised to the error's
	// RetryAfter() time.Duration, when it has one) instead of waiting for
	// memory the tenant keeps. Its ctx is bounded by the call's own bound
	// (EnsureRequest.Timeout, else Options.UnloadTimeout, and the caller's
	// ctx; for a budget's load the generation's timeouts); one that ends
	// with KindTimeout or context.DeadlineExceeded in its error ends
	// room-making the same way, with a *RoomError of KindTimeout. It must
	// honour ctx; a panic is recovered and reported.
	Release func(ctx context.Context) error
}

// TenantRelease says what one tenant's release gave back.
type TenantRelease struct {
	Name                  string
	FreeBefore, FreeAfter uint64 // the device's free bytes around the release and its wait
	// Verified: the device showed the memory back (see Tenant).
	Verified bool
	Err      error // the release's own failure
	Elapsed  time.Duration
}

// tenants holds a client's registered tenants, in registration order.
type tenants struct {
	mu     sync.Mutex
	nextID int
	list   []tenantEntry
}

type tenantEntry struct {
	id int
	t  Tenant
}

// RegisterTenant adds t to the ways room-making frees memory on
// t.Device. The returned func removes it; calling it twice is harmless.
// A tenant without a Name or a Release, with a negative Device, or with
// the Name of one registered already is refused with KindInvalidInput; on
// a closed client it fails with ErrClosed. It is safe for concurrent use.
func (c *OllamaClient) RegisterTenant(t Tenant) (unregister func(), err error) {
	const op = "register tenant"
	switch {
	case t.Name == "":
		return nil, invalid(op, "", "a tenant needs a Name")
	case t.Release == nil:
		return nil, invalid(op, "", "tenant %q needs a Release", t.Name)
	case t.Device < 0:
		return nil, invalid(op, "", "tenant %q: negative device index %d", t.Name, t.Device)
	case t.Bytes > maxBytes:
		return nil, invalid(op, "", "tenant %q: %s is more than MaxBytes", t.Name, vramFormatBytes(t.Bytes))
	}
	if err := c.checkOpen(op, ""); err != nil {
		return nil, err
	}
	ts := &c.tenants
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if slices.ContainsFunc(ts.list, func(e tenantEntry) bool { return e.t.Name == t.Name }) {
		return nil, invalid(op, "", "a tenant named %q is registered already", t.Name)
	}
	ts.nextID++
	id := ts.nextID
	ts.list = append(ts.list, tenantEntry{id: id, t: t})
	return func() {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		ts.list = slices.DeleteFunc(ts.list, func(e tenantEntry) bool { return e.id == id })
	}, nil
}

func (ts *tenants) on(device int) []tenantEntry {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var out []tenantEntry
	for _, e := range ts.list {
		if e.t.Device == device {
			out = append(out, e)
		}
	}
	return out
}
