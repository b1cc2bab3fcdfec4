package vramguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// ReaderOptions configures the readers the library ships (NewNVMLReader,
// NewSMIReader, NewAutoReader). The zero value reads the system's NVML
// library (libnvidia-ml.so.1, opened by the constructor), runs the
// nvidia-smi found on PATH with 10 seconds for each run, and resolves
// process commands under /proc. Each reader ignores the fields of the
// other source; every constructor refuses a negative SMITimeout.
type ReaderOptions struct {
	// ProcRoot is where procfs is mounted; "" means /proc. Commands are
	// not resolved when this program runs in a child PID namespace (a
	// container without --pid=host), where the driver's host PIDs name
	// other processes: Command is then empty (or nvidia-smi's process
	// name) and Role as far as that tells.
	ProcRoot string

	// SMIPath is the nvidia-smi executable; "" looks up "nvidia-smi" on
	// PATH.
	SMIPath string
	// SMITimeout bounds each nvidia-smi run (two per snapshot); 0 means
	// 10s. Negative is refused with KindInvalidInput.
	SMITimeout time.Duration
	// SMIRun runs nvidia-smi and returns its standard output. nil runs
	// SMIPath with os/exec, killing it when ctx is done. Set it to reach
	// nvidia-smi another way (ssh, docker exec) or in tests; SMIPath is
	// then passed through unchecked ("" becomes "nvidia-smi").
	SMIRun func(ctx context.Context, path string, args ...string) ([]byte, error)
}

func (o ReaderOptions) validate(op string) error {
	if o.SMITimeout < 0 {
		return invalid(op, "", "negative nvidia-smi timeout %v", o.SMITimeout)
	}
	return nil
}

// DeviceReader is the VRAMReader the library ships: it reads device memory
// and GPU processes through NVML or nvidia-smi, whichever its constructor
// opened (Source says which). Every constructor returns one, so a caller
// closes it without knowing which source it got.
//
// It is safe for concurrent use. A nil or zero DeviceReader is not usable:
// Snapshot returns KindUnavailable, Close nil and Source SourceNone.
type DeviceReader struct {
	src    vramSource // nil in the zero value
	closed atomic.Bool
}

var (
	_ VRAMReader = (*DeviceReader)(nil)
	_ io.Closer  = (*DeviceReader)(nil)
)

// vramSource is one way of reading the GPU: NVML or nvidia-smi.
type vramSource interface {
	name() string // SourceNVML or SourceSMI
	snapshot(ctx context.Context) (*VRAMSnapshot, error)
	close() error
}

// errReaderClosed is the cause of a Snapshot after Close.
var errReaderClosed = errors.New("reader closed")

// Snapshot reads every device. When ctx is done it returns an *Error of
// KindCanceled holding context.Cause(ctx); a failed read, or a reader that
// is closed, gives KindUnavailable. NVML calls cannot be interrupted: ctx
// is checked before and between devices. An nvidia-smi run that exceeds
// SMITimeout gives KindTimeout.
//
// Through NVML, Used counts driver-reserved memory as used, so Free+Used is
// Total whichever memory call the driver offers. Through nvidia-smi, a
// failed or unreadable GPU query fails the snapshot (a device missing from
// it would look absent), while a failed process query only leaves
// ProcessesKnown false; nvidia-smi lists compute processes only, in MiB.
func (r *DeviceReader) Snapshot(ctx context.Context) (*VRAMSnapshot, error) {
	if r == nil || r.src == nil {
		return nil, newError("vram snapshot", "", KindUnavailable,
			errors.New("reader not made by NewNVMLReader, NewSMIReader or NewAutoReader"))
	}
	if r.closed.Load() {
		return nil, newError(r.src.name()+" snapshot", "", KindUnavailable, errReaderClosed)
	}
	return r.src.snapshot(ctx)
}

// Close releases what the reader holds: it shuts NVML down, waiting for a
// Snapshot in progress; an nvidia-smi reader holds nothing. Snapshot then
// fails with KindUnavailable. Later calls do nothing and return nil. A
// failed NVML shutdown gives KindUnavailable wrapping the nvml.Return.
func (r *DeviceReader) Close() error {
	if r == nil || r.src == nil || r.closed.Swap(true) {
		return nil
	}
	return r.src.close()
}

// Source returns where the reader's figures come from: SourceNVML or
// SourceSMI, as in VRAMSnapshot.Source; SourceNone for a nil or zero
// reader.
func (r *DeviceReader) Source() string {
	if r == nil || r.src == nil {
		return SourceNone
	}
	return r.src.name()
}

// NewAutoReader returns the best reader this machine offers: through NVML
// when it initialises, else through nvidia-smi if that is found and
// answers one snapshot within ctx. When neither works it returns an *Error
// of KindUnavailable wrapping both failures (KindCanceled when ctx is done
// first); callers then run without GPU truth (see EnsureFree). A negative
// opts.SMITimeout gives KindInvalidInput before anything is tried.
//
// Close the reader when done: for an NVML reader that shuts NVML down.
func NewAutoReader(ctx context.Context, opts ReaderOptions) (*DeviceReader, error) {
	return newAutoReader(ctx, opts, NewNVMLReader)
}

// newAutoReader is NewAutoReader opening NVML with openNVML (tests pass
// NewNVMLReaderFrom with a go-nvml mock).
func newAutoReader(ctx context.Context, opts ReaderOptions, openNVML func(ReaderOptions) (*DeviceReader, error)) (*DeviceReader, error) {
	const op = "new auto reader"
	if err := opts.validate(op); err != nil {
		return nil, err
	}
	nr, nerr := openNVML(opts)
	if nerr == nil {
		return nr, nil
	}
	sr, serr := NewSMIReader(opts)
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
