package vramguard

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"time"

	"github.com/vramguard/vramguard/internal/smi"
)

// vramDefaultSMITimeout bounds one nvidia-smi run when SMIOptions.Timeout
// is 0. nvidia-smi hangs when the driver is wedged.
const vramDefaultSMITimeout = 10 * time.Second

// vramPIDMax is PID_MAX_LIMIT on 64-bit Linux; a larger PID is garbage.
const vramPIDMax = 1 << 22

// errSMITimeout is the cause when one nvidia-smi run exceeds its limit.
var errSMITimeout = errors.New("nvidia-smi did not answer in time")

// SMIOptions configures an SMIReader. The zero value runs the nvidia-smi
// found on PATH, allows each run 10 seconds, and resolves process commands
// under /proc.
type SMIOptions struct {
	// Path is the nvidia-smi executable; "" looks up "nvidia-smi" on PATH.
	Path string
	// Timeout bounds each nvidia-smi run (two per snapshot); 0 means 10s.
	// Negative is refused.
	Timeout time.Duration
	// ProcRoot is where procfs is mounted; "" means /proc. See NVMLOptions.
	ProcRoot string
	// Run runs nvidia-smi and returns its standard output. nil runs Path
	// with os/exec, killing it when ctx is done. Set it to reach
	// nvidia-smi another way (ssh, docker exec) or in tests; Path is then
	// passed through unchecked ("" becomes "nvidia-smi").
	Run func(ctx context.Context, path string, args ...string) ([]byte, error)
}

// SMIReader reads device memory and compute processes by running
// nvidia-smi. It is slower than NVMLReader (two process starts per
// snapshot) but needs neither cgo nor a matching NVML library.
//
// It is safe for concurrent use; it holds no state between snapshots. The
// zero value is not usable: its Snapshot returns KindUnavailable.
type SMIReader struct {
	path    string
	timeout time.Duration
	run     func(ctx context.Context, path string, args ...string) ([]byte, error)
	proc    vramProcFS
}

var _ VRAMReader = (*SMIReader)(nil)

// NewSMIReader returns a reader that runs nvidia-smi. It returns an *Error
// of KindUnavailable when the executable is not found, and KindInvalidInput
// for a negative timeout. It does not run nvidia-smi; NewAutoReader does.
func NewSMIReader(opts SMIOptions) (*SMIReader, error) {
	const op = "new nvidia-smi reader"
	if opts.Timeout < 0 {
		return nil, invalid(op, "", "negative timeout %v", opts.Timeout)
	}
	r := &SMIReader{path: opts.Path, timeout: opts.Timeout, run: opts.Run, proc: newVRAMProcFS(opts.ProcRoot)}
	if r.timeout == 0 {
		r.timeout = vramDefaultSMITimeout
	}
	if r.path == "" {
		r.path = "nvidia-smi"
	}
	if r.run == nil {
		path, err := exec.LookPath(r.path)
		if err != nil {
			return nil, newError(op, "", KindUnavailable, err)
		}
		r.path, r.run = path, smi.Run
	}
	return r, nil
}

// Snapshot runs the GPU query and then the compute-apps query. A failed
// GPU query fails the snapshot (KindUnavailable; KindTimeout when the run
// exceeded SMIOptions.Timeout; KindCanceled with context.Cause(ctx) when
// ctx is done), and so does any line of it that cannot be read, since a
// device missing from a snapshot would look absent. A failed apps query
// only leaves ProcessesKnown false; unreadable apps lines are skipped.
//
// nvidia-smi lists compute processes only (not graphics contexts), in MiB.
func (r *SMIReader) Snapshot(ctx context.Context) (*VRAMSnapshot, error) {
	const op = "nvidia-smi snapshot"
	if r.run == nil {
		return nil, newError(op, "", KindUnavailable, errors.New("reader not made by NewSMIReader"))
	}
	out, err := r.query(ctx, smi.QueryGPUs)
	if err != nil {
		return nil, r.runError(op, ctx, err)
	}
	taken := time.Now()
	gpus, err := smi.ParseGPUs(out)
	if err != nil {
		return nil, newError(op, "", KindUnavailable, err)
	}
	snap := &VRAMSnapshot{Source: SourceSMI, Taken: taken, Devices: make([]DeviceMemory, len(gpus))}
	for i, g := range gpus {
		snap.Devices[i] = DeviceMemory{Index: g.Index, Name: g.Name, UUID: g.UUID, Total: g.Total, Free: g.Free, Used: g.Used}
	}

	out, err = r.query(ctx, smi.QueryApps)
	if err != nil {
		if ctx.Err() != nil {
			return nil, r.runError(op, ctx, err)
		}
		return snap, nil // figures without processes
	}
	apps, _ := smi.ParseApps(out) // keeps the lines it could read
	for i := range snap.Devices {
		d := &snap.Devices[i]
		d.ProcessesKnown = d.UUID != ""
		if d.ProcessesKnown {
			d.Processes = r.processes(apps, d.UUID, d.Total)
		}
	}
	return snap, nil
}

// processes returns the sane apps on the device with the given UUID: no
// PID 0 or beyond PID_MAX_LIMIT, no figure above the device's total, one
// entry per PID.
func (r *SMIReader) processes(apps []smi.App, uuid string, total uint64) []GPUProcess {
	procs := []GPUProcess{}
	for _, a := range apps {
		switch {
		case a.GPUUUID != uuid,
			a.PID == 0 || a.PID > vramPIDMax,
			a.UsedKnown && total > 0 && a.UsedBytes > total:
			continue
		}
		if slices.ContainsFunc(procs, func(p GPUProcess) bool { return p.PID == a.PID }) {
			continue
		}
		p := GPUProcess{PID: a.PID, UsedBytes: a.UsedBytes, UsedKnown: a.UsedKnown}
		r.proc.describe(&p, a.Name)
		procs = append(procs, p)
	}
	return procs
}

func (r *SMIReader) query(ctx context.Context, query string) ([]byte, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, r.timeout, errSMITimeout)
	defer cancel()
	out, err := r.run(ctx, r.path, query, smi.Format)
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx) // a Run that ignored ctx
	}
	return out, err
}

func (r *SMIReader) runError(op string, ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return newError(op, "", KindCanceled, context.Cause(ctx))
	case errors.Is(err, errSMITimeout):
		return newError(op, "", KindTimeout, fmt.Errorf("%w (limit %v)", err, r.timeout))
	default:
		return newError(op, "", KindUnavailable, err)
	}
}

// Close does nothing; it lets callers of NewAutoReader close whichever
// reader they got.
func (r *SMIReader) Close() error { return nil }

// AutoOptions configures NewAutoReader. The zero value uses the defaults of
// both readers.
type AutoOptions struct {
	NVML NVMLOptions
	SMI  SMIOptions
}

// NewAutoReader returns the best VRAM reader this machine offers: an
// *NVMLReader when NVML initialises, else an *SMIReader if nvidia-smi is
// found and answers one snapshot within ctx. When neither works it returns
// an *Error of KindUnavailable wrapping both failures; callers then run
// without GPU truth (EnsureFree and friends accept a nil reader).
//
// The reader returned has a Close method (both types implement io.Closer);
// close it when done, which shuts NVML down.
func NewAutoReader(ctx context.Context, opts AutoOptions) (VRAMReader, error) {
	const op = "new auto reader"
	nr, nerr := NewNVMLReader(opts.NVML)
	if nerr == nil {
		return nr, nil
	}
	sr, serr := NewSMIReader(opts.SMI)
	if serr == nil {
		_, serr = sr.Snapshot(ctx)
		if serr == nil {
			return sr, nil
		}
	}
	if ctx.Err() != nil {
		return nil, newError(op, "", KindCanceled, context.Cause(ctx))
	}
	return nil, newError(op, "", KindUnavailable, fmt.Errorf("no GPU reader: nvml: %w; nvidia-smi: %w", nerr, serr))
}
