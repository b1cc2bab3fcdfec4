package vramguard

// The tenants: the one registry of what can give device memory back when
// asked, registered with RegisterTenant. Room-making (room.go) asks the
// tenants on its device; ReleaseVRAM (cleanup.go) runs them all, and the
// library's own release steps the tenants on no device.

import (
	"context"
	"slices"
	"sync"
	"time"
)

// noDevice is Tenant.Device for a tenant on no one device.
const noDevice = -1

// Tenant is something that holds device memory and can give some back
// when asked: a diffusion server's model cache, a CUDA caching
// allocator's pool (the Go side of torch.cuda.empty_cache), a Go-side
// buffer pool. Registered with RegisterTenant, it is asked:
//
//   - by room-making on its Device (EnsureFree, Budget.MakeRoom, Phase.End's
//     hand-over), as a step of the plan, only while the room is missing,
//     its release verified on the device;
//   - by ReleaseVRAM, and Cleanup or CleanupAsync with Release: every
//     tenant, on a device or on none, in registration order, needed or not;
//   - by the library's own release steps (after room-making's steps, at
//     Phase.End, after a Guard's use with Release): only the tenants on no
//     device (Device -1). A tenant on a device is room-making's to ask
//     where its memory is needed, so that ending an LLM step never empties
//     a diffusion server's cache that the next step renders from.
//
// A function that only empties a cache is a tenant on no device, run by
// ReleaseVRAM and by every release step:
//
//	c.RegisterTenant(vramguard.Tenant{Name: "torch cache", Device: -1, Release: emptyCache})
//
// Registered on its device instead, room-making asks it too, after
// Ollama's models (before them with First). Give it Size when the
// allocator can say what it caches: a tenant of unknown size turns a room
// that only it might make from refused at once into tried, its wait
// lasting until the room shows or the call's bound passes.
//
// Room-making's order is fixed: first the tenants with First set, then
// Ollama's models (the fewest bytes that make the room, never a protected,
// leased or in-use model; this client's own leased models last), then the
// other tenants, each step only while the room is still missing. A
// tenant's release counts as verified when the device shows, within the
// call's wait, Bytes more free than before it ran, or the room the call
// needs if that is less (for a tenant whose size is not known: the room);
// EnsureReport.Tenants says what each gave back. ReleaseVRAM waits for
// nothing and verifies nothing: its report reads the device before and
// after.
type Tenant struct {
	// Name names the tenant in reports and logs.
	Name string
	// Device is the device it frees memory on; -1 is no one device (a
	// cache spread over several, a Go-side pool): room-making, which
	// verifies each release on its device, never asks such a tenant, so
	// Bytes, PID, Size and First, which only room-making reads, must be
	// unset.
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
	// honour ctx; a panic is recovered and reported. Run by ReleaseVRAM or
	// a release step, nothing waits for the device after it: its ctx is
	// that call's (Cleanup's bound, for Cleanup), and its failure is
	// joined into the call's error.
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

// RegisterTenant adds t to the client's tenants: the ways room-making
// frees memory on t.Device, and what ReleaseVRAM runs (see Tenant for
// who asks which). The returned func removes it from both; calling it
// twice is harmless. A tenant without a Name or a Release, with a Device
// below -1, on no device (-1) with Bytes, PID, Size or First set, or with
// the Name of one registered already is refused with KindInvalidInput; on
// a closed client it fails with ErrClosed. It is safe for concurrent use.
func (c *OllamaClient) RegisterTenant(t Tenant) (unregister func(), err error) {
	const op = "register tenant"
	switch {
	case t.Name == "":
		return nil, invalid(op, "", "a tenant needs a Name")
	case t.Release == nil:
		return nil, invalid(op, "", "tenant %q needs a Release", t.Name)
	case t.Device < noDevice:
		return nil, invalid(op, "", "tenant %q: device index %d (-1 is no one device)", t.Name, t.Device)
	case t.Device == noDevice && (t.Bytes != 0 || t.PID != 0 || t.Size != nil || t.First):
		return nil, invalid(op, "", "tenant %q on no device (-1) sets Bytes, PID, Size or First, which only room-making on a device reads", t.Name)
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

// on is the tenants room-making asks on device (never those on no device).
func (ts *tenants) on(device int) []tenantEntry {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var out []tenantEntry
	for _, e := range ts.list {
		if e.t.Device == device && device != noDevice {
			out = append(out, e)
		}
	}
	return out
}

// releasing is the tenants a release step runs, in registration order:
// all of them (ReleaseVRAM, Cleanup with Release), or only those on no
// device (the library's own release steps; see Tenant).
func (ts *tenants) releasing(all bool) []tenantEntry {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if all {
		return slices.Clone(ts.list)
	}
	var out []tenantEntry
	for _, e := range ts.list {
		if e.t.Device == noDevice {
			out = append(out, e)
		}
	}
	return out
}
