package vramguardtest

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
)

// PSGPU is a fake GPU whose memory follows what any Ollama server's
// /api/ps lists: a real server on a machine without a GPU, or a [Server].
// Each listed model is a runner process holding the model's size_vram, or
// its whole size when the server lists size_vram 0 (a server without a
// GPU: the fake counts the model as if it ran on this device), with role [vramguard.RoleOllamaRunner], Model set
// to the listed name and a fake PID derived from it. Other programs'
// memory is added with Reserve. It is the device of one member in a test
// of several servers.
//
// Every snapshot reads /api/ps once, so a load shows only once the server
// lists the model (Ollama lists a model when its load ends), and an unload
// as soon as the listing drops it. A snapshot whose listing fails fails
// with the listing's error, as a driver would.
//
// A PSGPU is safe for concurrent use. Its zero value is not usable: set
// Client and Total.
type PSGPU struct {
	// Client reads the server's /api/ps.
	Client *api.Client
	// Total is the device's size in bytes.
	Total uint64
	// Index is the device index the snapshot reports (0 by default).
	Index int
	// Name is the device name; empty means "Simulated GPU".
	Name string

	mu       sync.Mutex
	reserved map[string]uint64
	commands map[string]string // the command an owner is listed with, where not the owner itself (SetHeld)
}

var _ vramguard.VRAMReader = (*PSGPU)(nil)

// Reserve adds bytes held by owner, another program on the device (an
// image pipeline's text encoder, say); repeated calls add up. It fails when
// fewer than bytes are free at a fresh listing (concurrent reservations
// are counted against each other).
func (g *PSGPU) Reserve(ctx context.Context, owner string, bytes uint64) error {
	models, err := g.list(ctx)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	used := models
	for _, b := range g.reserved {
		used += b
	}
	if free := g.Total - min(used, g.Total); bytes > free {
		return &VRAMError{Owner: owner, Requested: bytes, Free: free}
	}
	if g.reserved == nil {
		g.reserved = make(map[string]uint64)
	}
	g.reserved[owner] += bytes
	return nil
}

// list is the bytes the server's listed models hold.
func (g *PSGPU) list(ctx context.Context) (uint64, error) {
	snap, err := g.Snapshot(ctx)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, p := range snap.Devices[0].Processes {
		if p.Role == vramguard.RoleOllamaRunner {
			n += p.UsedBytes
		}
	}
	return n, nil
}

// Release frees what owner reserved; an unknown owner is ignored.
func (g *PSGPU) Release(owner string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.reserved, owner)
	delete(g.commands, owner)
}

// Snapshot lists the server's models as runners and the reservations as
// other processes. Used is their sum, capped at Total; Free the rest.
func (g *PSGPU) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, &vramguard.Error{Op: "snapshot", Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	resp, err := g.Client.ListRunning(ctx)
	if err != nil {
		return nil, &vramguard.Error{Op: "snapshot", Kind: vramguard.KindUnavailable, Err: fmt.Errorf("fake GPU: /api/ps: %w", err)}
	}
	d := vramguard.DeviceMemory{
		Index: g.Index, Name: cmp.Or(g.Name, "Simulated GPU"), UUID: fmt.Sprintf("GPU-ps-%d", g.Index),
		Total: g.Total, ProcessesKnown: true, Processes: []vramguard.GPUProcess{},
	}
	var used uint64
	for _, m := range resp.Models {
		size := uint64(max(m.SizeVRAM, 0))
		if size == 0 {
			size = uint64(max(m.Size, 0))
		}
		used += size
		d.Processes = append(d.Processes, vramguard.GPUProcess{
			PID: fakePID("runner " + m.Name), UsedBytes: size, UsedKnown: true,
			Command: "ollama runner (" + m.Name + ")", Role: vramguard.RoleOllamaRunner, Model: m.Name,
		})
	}
	g.mu.Lock()
	owners := make([]string, 0, len(g.reserved))
	for o := range g.reserved {
		owners = append(owners, o)
	}
	slices.Sort(owners)
	for _, o := range owners {
		used += g.reserved[o]
		d.Processes = append(d.Processes, vramguard.GPUProcess{
			PID: fakePID("owner " + o), UsedBytes: g.reserved[o], UsedKnown: true, Command: cmp.Or(g.commands[o], o), Role: vramguard.RoleOther,
		})
	}
	g.mu.Unlock()
	d.Used = min(used, g.Total)
	d.Free = g.Total - d.Used
	return &vramguard.VRAMSnapshot{Source: GPUSource, Taken: time.Now(), Devices: []vramguard.DeviceMemory{d}}, nil
}

// fakePID is a stable fake process id for a name, above the range real
// systems hand out first.
func fakePID(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(strings.ToLower(name)))
	return 1<<22 + h.Sum32()%(1<<22)
}

// SetHeld sets what owner holds to bytes (it does not add), listed with
// command, as a process whose use grows and shrinks (a fake ComfyUI of
// package comfyuitest).
// Growth is checked against a fresh listing, as Reserve is, and fails with
// a [*VRAMError] (or the listing's error) changing nothing; shrinking
// always succeeds without a listing; zero releases the owner. The owner's
// PID, fakePID("owner "+owner), is stable.
func (g *PSGPU) SetHeld(ctx context.Context, owner, command string, bytes uint64) error {
	g.mu.Lock()
	cur := g.reserved[owner]
	g.mu.Unlock()
	var models uint64
	if bytes > cur {
		var err error
		if models, err = g.list(ctx); err != nil {
			return err
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	cur = g.reserved[owner]
	if bytes > cur {
		used := models
		for _, b := range g.reserved {
			used += b
		}
		if free := g.Total - min(used, g.Total); bytes-cur > free {
			return &VRAMError{Owner: command, Requested: bytes - cur, Free: free}
		}
	}
	if bytes == 0 {
		delete(g.reserved, owner)
		delete(g.commands, owner)
		return nil
	}
	if g.reserved == nil {
		g.reserved = make(map[string]uint64)
	}
	if g.commands == nil {
		g.commands = make(map[string]string)
	}
	g.reserved[owner] = bytes
	g.commands[owner] = command
	return nil
}

// HeldPID is the PID owner ([PSGPU.Reserve], [PSGPU.SetHeld]) is listed
// under: fakePID("owner "+owner), stable whether or not it holds anything.
func (g *PSGPU) HeldPID(owner string) uint32 { return fakePID("owner " + owner) }

// DeviceMemory is the device's total and free bytes at a fresh listing.
func (g *PSGPU) DeviceMemory(ctx context.Context) (total, free uint64, err error) {
	snap, err := g.Snapshot(ctx)
	if err != nil {
		return 0, 0, err
	}
	d := snap.Devices[0]
	return d.Total, d.Free, nil
}
