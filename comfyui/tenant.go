package comfyui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/procs"
)

// HolderName is the name ComfyUI's process has where holders are reported
// through Reader (DeviceMemory.Holders, refusals, metrics).
const HolderName = "ComfyUI"

// WhileBusy says what a ComfyUI tenant does when room-making asks for its
// memory while ComfyUI's queue runs a prompt.
type WhileBusy uint8

const (
	// Wait waits, under the room-making call's ctx (for a budget's load,
	// the generation's timeouts), for the queue to drain, then frees.
	Wait WhileBusy = iota
	// Refuse refuses at once with a *BusyError (KindRefused): the load is
	// refused with a *RoomError whose RetryAfter is at least
	// TenantOptions.RetryAfter, and the render is left alone.
	Refuse
)

// DefaultRetryAfter is TenantOptions.RetryAfter's zero value.
const DefaultRetryAfter = 5 * time.Second

// TenantOptions configure Client.Tenant. The zero value names the tenant
// "ComfyUI", asks it after Ollama's idle models, unloads models only, and
// waits for a running queue to drain.
type TenantOptions struct {
	// Name names the tenant in reports; "" means HolderName.
	Name string
	// First frees ComfyUI before Ollama's idle models (the order is the
	// caller's choice: an LLM step that matters more than the render
	// cache, or the other way round). Room-making asks tenants for every
	// room it makes on the device, a hand-over to ComfyUI itself
	// (Phase.End with NeedBytes) included: with First that hand-over frees
	// ComfyUI's cache too before unloading the phase's models.
	First bool
	// DropCache also drops ComfyUI's node cache (FreeRequest.DropCache).
	DropCache bool
	// WhileBusy is what to do while a prompt runs or waits: Wait or
	// Refuse.
	WhileBusy WhileBusy
	// RetryAfter is what a Refuse advertises; zero means
	// DefaultRetryAfter (ComfyUI does not say how long a prompt will take).
	RetryAfter time.Duration
	// Free measures each release (its Tolerance, Settle and Interval;
	// DropCache and Wait are the tenant's own).
	Free FreeRequest
	// OnFree, when set, receives each release's receipt.
	OnFree func(*Receipt)
}

// Tenant is ComfyUI as a vramguard.Tenant on Options.Device: register it
// with OllamaClient.RegisterTenant and room-making (EnsureFree, a budget
// with MakeRoom, Phase.End's hand-over) frees ComfyUI when it needs the
// memory, in the order TenantOptions.First says, and verifies on its own
// reader that the device shows it back.
//
// Its Size is what /system_stats says torch has reserved, less what the
// last receipt found pinned (unknown when /system_stats does not answer).
// Its Release is Free with Wait: while the queue is busy it waits for it
// to drain or refuses (TenantOptions.WhileBusy); a receipt that shows
// memory pinned or not given back is a *FreeError, so that room-making
// goes on at once with what it has instead of waiting for memory that is
// not coming; a pending or unmeasured receipt is left to room-making's
// own reading of the device.
func (c *Client) Tenant(o TenantOptions) vramguard.Tenant {
	o.Name = cmp.Or(o.Name, HolderName)
	o.RetryAfter = cmp.Or(o.RetryAfter, DefaultRetryAfter)
	return vramguard.Tenant{
		Name:   o.Name,
		Device: c.opts.Device,
		First:  o.First,
		Size: func(ctx context.Context) (uint64, error) {
			st, err := c.SystemStats(ctx)
			if err != nil {
				return 0, err
			}
			if len(st.Devices) == 0 || st.Devices[0].Type != "cuda" {
				return 0, errors.New("/system_stats lists no CUDA device")
			}
			return sub(st.Devices[0].TorchVRAMTotal, c.pinned.get()), nil
		},
		Release: func(ctx context.Context) error {
			q, err := c.Queue(ctx)
			if err != nil {
				return err
			}
			if q.Busy() {
				if o.WhileBusy == Refuse {
					id := ""
					if len(q.Running) > 0 {
						id = q.Running[0].PromptID
					}
					return &vramguard.Error{Op: "comfyui: release", Kind: vramguard.KindRefused,
						Err: &BusyError{PromptID: id, Queued: len(q.Running) + len(q.Pending), After: o.RetryAfter}}
				}
				c.log.Debug("comfyui: room-making waits for the queue to drain", "running", len(q.Running), "pending", len(q.Pending))
				if err := c.WaitIdle(ctx); err != nil {
					return err
				}
			}
			fr := o.Free
			fr.DropCache, fr.Wait = o.DropCache, true
			rc, err := c.Free(ctx, fr)
			if err != nil {
				return err
			}
			if o.OnFree != nil {
				o.OnFree(rc)
			}
			if rc.Outcome == OutcomePartlyFreed {
				return &FreeError{Receipt: rc}
			}
			return nil
		},
	}
}

// Reader returns inner with ComfyUI's process named: where a snapshot
// lists it (by Options.PID, or the process Client.Process finds), its
// Command is HolderName, so that DeviceMemory.Holders, a budget's refusal,
// vramwatch and the metrics adapters name ComfyUI as a holder. The
// snapshot is a copy; inner's is not changed. A process that cannot be
// found leaves the snapshot as inner gave it (looked for again at most
// every 30 s).
func (c *Client) Reader(inner vramguard.VRAMReader) vramguard.VRAMReader {
	return &namingReader{inner: inner, c: c}
}

type namingReader struct {
	inner vramguard.VRAMReader
	c     *Client
}

func (r *namingReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	snap, err := r.inner.Snapshot(ctx)
	if err != nil || snap == nil {
		return snap, err
	}
	pid := r.c.pid(ctx)
	if pid == 0 {
		return snap, nil
	}
	out := *snap
	out.Devices = slices.Clone(snap.Devices)
	for i := range out.Devices {
		d := &out.Devices[i]
		if !slices.ContainsFunc(d.Processes, func(p vramguard.GPUProcess) bool { return p.PID == pid }) {
			continue
		}
		d.Processes = slices.Clone(d.Processes)
		for j := range d.Processes {
			if d.Processes[j].PID == pid {
				d.Processes[j].Command = HolderName
			}
		}
	}
	return &out, nil
}

// pidCache remembers ComfyUI's process once found, and when the last
// search failed.
type pidCache struct {
	mu       sync.Mutex
	pid      uint32
	failedAt time.Time
}

// pidRetry is how long after a failed search the next may run.
const pidRetry = 30 * time.Second

// pid is Options.PID, else the process Process finds (remembered; a
// failed search is not repeated for pidRetry); 0 when none.
func (c *Client) pid(ctx context.Context) uint32 {
	if c.opts.PID != 0 {
		return c.opts.PID
	}
	pc := &c.pids
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.pid != 0 || (!pc.failedAt.IsZero() && time.Since(pc.failedAt) < pidRetry) {
		return pc.pid
	}
	pid, err := c.Process(ctx)
	if err != nil {
		pc.failedAt = time.Now()
		c.log.Debug("comfyui: process not found", "err", err)
		return 0
	}
	pc.pid = pid
	return pid
}

// Process finds ComfyUI's process on this machine: the live process that
// listens on the client's URL's port and whose command line ends with
// /system_stats' argv (so a proxy on that port, or another program, is
// never taken for it). It fails with KindNotFound when the URL's host is
// not this machine's loopback, when nothing on this machine's process
// table listens there (ComfyUI in a container or on another host: set
// Options.PID), or when the listener's command line is not ComfyUI's.
func (c *Client) Process(ctx context.Context) (uint32, error) {
	const op = "comfyui: process"
	host, portText, err := net.SplitHostPort(c.base.Host)
	if err != nil {
		portText = map[string]string{"http": "80", "https": "443"}[c.base.Scheme]
		host = c.base.Host
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); !(host == "localhost" || ip != nil && ip.IsLoopback()) {
		return 0, &vramguard.Error{Op: op, Kind: vramguard.KindNotFound, Err: fmt.Errorf("ComfyUI at %s is not on this machine's loopback: set Options.PID", c.base.Host)}
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return 0, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("port %q: %w", portText, err)}
	}
	st, err := c.SystemStats(ctx)
	if err != nil {
		return 0, err
	}
	argv := st.System.Argv
	if len(argv) == 0 {
		return 0, &vramguard.Error{Op: op, Kind: vramguard.KindNotFound, Err: errors.New("/system_stats gives no argv to match a process by")}
	}
	pid, why, err := procs.Listening(c.procRoot, port, "ComfyUI", func(p procs.Process) bool { return holdsArgv(p.Args, argv) })
	if err != nil {
		return 0, &vramguard.Error{Op: op, Kind: vramguard.KindUnavailable, Err: err}
	}
	if pid == 0 {
		return 0, &vramguard.Error{Op: op, Kind: vramguard.KindNotFound, Err: errors.New(why)}
	}
	return uint32(pid), nil
}

// holdsArgv says whether args (a process's command line, "python
// main.py --listen" say) ends with argv (Python's sys.argv: the script,
// then its flags), the script compared by base name.
func holdsArgv(args, argv []string) bool {
	i := len(args) - len(argv)
	return len(argv) > 0 && i >= 0 && filepath.Base(args[i]) == filepath.Base(argv[0]) && slices.Equal(args[i+1:], argv[1:])
}
