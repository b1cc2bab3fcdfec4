package comfyui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// Wait waits for the queue to drain, then frees, within the
	// room-making call's own bound (EnsureRequest.Timeout, else
	// Options.UnloadTimeout; for a budget's load the generation's
	// timeouts; a phase's timeout; ctx). When the bound ends first the
	// room is refused with a *RoomError of KindTimeout holding a
	// *WaitError that names the running prompt.
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
	// Free measures each release (its Tolerance, Settle, Quiet and
	// Interval; DropCache and Wait are the tenant's own).
	Free FreeRequest
	// OnFree, when set, receives each release's receipt.
	OnFree func(*Receipt)
}

// Tenant is ComfyUI as a vramguard.Tenant on Options.Device: register it
// with OllamaClient.RegisterTenant and room-making (EnsureFree, a budget
// with MakeRoom, Phase.End's hand-over) frees ComfyUI when it needs the
// memory, in the order TenantOptions.First says, and verifies on its own
// reader that the device shows it back. OllamaClient.ReleaseVRAM, and
// Cleanup with Release, ask it too, needed or not, under their own ctx;
// a Guard's or a phase's release step does not.
//
// Its Size is measured on the device, in both of ComfyUI's modes: what
// the GPU reader lists for ComfyUI's process (Options.PID or
// Client.Process), else, where the reader lists processes, the device's
// used memory less what Ollama's processes hold (other programs' memory
// then counts as ComfyUI's: tried, and verified on the device, rather
// than a load refused by arithmetic); less what the last settled
// free left (its context, pinned memory), or before any free, less
// torch's allocated memory in /system_stats (custom nodes'). /system_stats'
// torch pool is never the size: with DynamicVRAM it reads about 0 while
// ComfyUI holds its weights. Without a reader, or one that lists no
// processes, the size is unknown (an error): the tenant is tried, not
// counted.
//
// Its Release is Free with Wait, under the ctx room-making passes it
// (bounded by the call's own timeout: EnsureRequest.Timeout, a budget's
// FirstChunk or Total, a phase's timeout, the caller's ctx). While the
// queue is busy it waits for it to drain or refuses
// (TenantOptions.WhileBusy). A wait the bound ends (the queue, or a free
// still settling) is an error of KindTimeout where a deadline passed
// (KindCanceled otherwise) holding a *WaitError with the running prompt's
// id, the queue's length and, for a free, its receipt: room-making then
// ends with a *RoomError of that kind naming ComfyUI among the holders. A
// receipt that shows memory pinned (settled, not coming back) is a
// *FreeError, so that room-making goes on at once with what it has
// instead of waiting for memory that is not coming; a pending or
// unmeasured receipt is left to room-making's own reading of the device.
// Its debug log line names the mode and the --reserve-vram and
// --vram-headroom ComfyUI was started with, when /system_stats shows them.
func (c *Client) Tenant(o TenantOptions) vramguard.Tenant {
	o.Name = cmp.Or(o.Name, HolderName)
	o.RetryAfter = cmp.Or(o.RetryAfter, DefaultRetryAfter)
	return vramguard.Tenant{
		Name:   o.Name,
		Device: c.opts.Device,
		First:  o.First,
		Size:   c.size,
		Release: func(ctx context.Context) error {
			const op = "comfyui: release"
			start := time.Now()
			q, err := c.Queue(ctx)
			if err != nil {
				return err
			}
			if q.Busy() {
				id := ""
				if len(q.Running) > 0 {
					id = q.Running[0].PromptID
				}
				n := len(q.Running) + len(q.Pending)
				if o.WhileBusy == Refuse {
					return &vramguard.Error{Op: op, Kind: vramguard.KindRefused,
						Err: &BusyError{PromptID: id, Queued: n, After: o.RetryAfter}}
				}
				c.logLaunch(ctx, "comfyui: room-making waits for the queue to drain", "running", len(q.Running), "pending", len(q.Pending), "prompt_id", id)
				if err := c.WaitIdle(ctx); err != nil {
					if ctx.Err() == nil {
						return err
					}
					return &vramguard.Error{Op: op, Kind: ctxKind(ctx), Err: &WaitError{PromptID: id, Queued: n, Waited: time.Since(start), Err: ctxCause(ctx)}}
				}
			}
			fr := o.Free
			fr.DropCache, fr.Wait = o.DropCache, true
			rc, err := c.Free(ctx, fr)
			if rc != nil && o.OnFree != nil {
				o.OnFree(rc)
			}
			if err != nil {
				var we *WaitError
				if errors.As(err, &we) {
					we.Waited = time.Since(start)
					return &vramguard.Error{Op: op, Kind: vramguard.KindOf(err), Err: we}
				}
				return err
			}
			c.log.Debug("comfyui: released", "receipt", rc.String())
			if rc.Outcome == OutcomePartlyFreed {
				return &FreeError{Receipt: rc}
			}
			return nil
		},
	}
}

// size is the tenant's Size (see Tenant).
func (c *Client) size(ctx context.Context) (uint64, error) {
	if c.opts.VRAM == nil {
		return 0, errors.New("no GPU reader (Options.VRAM): ComfyUI's size is unknown")
	}
	r := c.read(ctx, c.pid(ctx))
	switch {
	case r.readerErr != nil:
		return 0, r.readerErr
	case !r.heldKnown:
		return 0, errors.New("the GPU reader lists no processes: ComfyUI's size is unknown")
	}
	floor, known := c.floor.get()
	return sub(r.held, c.floorOf(floor, known, r, modeOf(r))), nil
}

// logLaunch logs msg at debug level with ComfyUI's mode and the
// --reserve-vram and --vram-headroom it was started with, where
// /system_stats shows them.
func (c *Client) logLaunch(ctx context.Context, msg string, args ...any) {
	if !c.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	if st, err := c.SystemStats(ctx); err == nil {
		args = append(args, "mode", string(st.Mode()))
		if n, ok := st.GBFlag("--reserve-vram"); ok {
			args = append(args, "reserve_vram", formatBytes(n))
		}
		if n, ok := st.GBFlag("--vram-headroom"); ok {
			args = append(args, "vram_headroom", formatBytes(n))
		}
	}
	c.log.Debug(msg, args...)
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
