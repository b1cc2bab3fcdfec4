package gpu

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/smi"
)

// defaultSMITimeout bounds one nvidia-smi run when
// ReaderOptions.SMITimeout is 0. nvidia-smi hangs when the driver is wedged.
const defaultSMITimeout = 10 * time.Second

// pidMax is PID_MAX_LIMIT on 64-bit Linux; a larger PID is garbage.
const pidMax = 1 << 22

// errSMITimeout is the cause when one nvidia-smi run exceeds its limit.
var errSMITimeout = errors.New("nvidia-smi did not answer in time")

// smiSource reads device memory and compute processes by running
// nvidia-smi: slower than NVML (two process starts per snapshot), but it
// needs neither cgo nor a matching NVML library. It holds no state between
// snapshots.
type smiSource struct {
	path    string
	timeout time.Duration
	run     func(ctx context.Context, path string, args ...string) ([]byte, error)
	proc    procFS
}

// NewSMIReader returns a reader that runs nvidia-smi. It returns an *Error
// of KindUnavailable when the executable is not found. It does not run
// nvidia-smi; NewAutoReader does.
func NewSMIReader(opts ReaderOptions) (*DeviceReader, error) {
	const op = "new nvidia-smi reader"
	if err := opts.validate(op); err != nil {
		return nil, err
	}
	s := &smiSource{path: opts.SMIPath, timeout: opts.SMITimeout, run: opts.SMIRun, proc: newProcFS(opts.ProcRoot)}
	if s.timeout == 0 {
		s.timeout = defaultSMITimeout
	}
	if s.path == "" {
		s.path = "nvidia-smi"
	}
	if s.run == nil {
		path, err := exec.LookPath(s.path)
		if err != nil {
			return nil, newError(op, "", vramguard.KindUnavailable, err)
		}
		s.path, s.run = path, smi.Run
	}
	return &DeviceReader{src: s}, nil
}

func (r *smiSource) name() string { return SourceSMI }

func (r *smiSource) close() error { return nil }

// snapshot runs the GPU query and then the compute-apps query. A failed
// GPU query fails the snapshot (KindUnavailable; KindTimeout when the run
// exceeded the timeout; KindCanceled with context.Cause(ctx) when ctx is
// done), and so does any line of it that cannot be read, since a device
// missing from a snapshot would look absent. A failed apps query only
// leaves ProcessesKnown false; unreadable apps lines are skipped.
func (r *smiSource) snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	const op = "nvidia-smi snapshot"
	out, err := r.query(ctx, smi.QueryGPUs)
	if err != nil {
		return nil, r.runError(op, ctx, err)
	}
	taken := time.Now()
	gpus, err := smi.ParseGPUs(out)
	if err != nil {
		return nil, newError(op, "", vramguard.KindUnavailable, err)
	}
	snap := &vramguard.VRAMSnapshot{Source: SourceSMI, Taken: taken, Devices: make([]vramguard.DeviceMemory, len(gpus))}
	for i, g := range gpus {
		snap.Devices[i] = vramguard.DeviceMemory{Index: g.Index, Name: g.Name, UUID: g.UUID, Total: g.Total, Free: g.Free, Used: g.Used}
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
func (r *smiSource) processes(apps []smi.App, uuid string, total uint64) []vramguard.GPUProcess {
	procs := []vramguard.GPUProcess{}
	for _, a := range apps {
		switch {
		case a.GPUUUID != uuid,
			a.PID == 0 || a.PID > pidMax,
			a.UsedKnown && total > 0 && a.UsedBytes > total:
			continue
		}
		if slices.ContainsFunc(procs, func(p vramguard.GPUProcess) bool { return p.PID == a.PID }) {
			continue
		}
		p := vramguard.GPUProcess{PID: a.PID, UsedBytes: a.UsedBytes, UsedKnown: a.UsedKnown}
		r.proc.describe(&p, a.Name)
		procs = append(procs, p)
	}
	return procs
}

func (r *smiSource) query(ctx context.Context, query string) ([]byte, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, r.timeout, errSMITimeout)
	defer cancel()
	out, err := r.run(ctx, r.path, query, smi.Format)
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx) // a Run that ignored ctx
	}
	return out, err
}

func (r *smiSource) runError(op string, ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return newError(op, "", vramguard.KindCanceled, context.Cause(ctx))
	case errors.Is(err, errSMITimeout):
		return newError(op, "", vramguard.KindTimeout, fmt.Errorf("%w (limit %v)", err, r.timeout))
	default:
		return newError(op, "", vramguard.KindUnavailable, err)
	}
}
