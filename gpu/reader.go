package gpu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/vramguard/vramguard"
)

// The sources a DeviceReader names in vramguard.VRAMSnapshot.Source and
// returns from Source.
const (
	SourceNVML = "nvml"       // read through NVML: NewNVMLReader
	SourceSMI  = "nvidia-smi" // read by running nvidia-smi: NewSMIReader
)

// ReaderOptions configures NewNVMLReader, NewSMIReader and NewAutoReader.
// The zero value opens the system's NVML (libnvidia-ml.so.1), runs the
// nvidia-smi on PATH with 10 seconds a run, and reads commands from /proc.
// Every constructor refuses a negative SMITimeout.
type ReaderOptions struct {
	// ProcRoot is where procfs is mounted; "" means /proc. In a child PID
	// namespace (a container without --pid=host) the driver's host PIDs
	// name other processes, so commands are not read from it.
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

// DeviceReader is the vramguard.VRAMReader the library ships, reading
// devices and their processes through NVML or nvidia-smi (Source says
// which). Every constructor returns one: close it without asking which it
// got.
//
// It is safe for concurrent use. A nil or zero DeviceReader is not usable:
// Snapshot returns KindUnavailable, Close nil and Source
// vramguard.SourceNone.
type DeviceReader struct {
	src    source // nil in the zero value
	closed atomic.Bool
}

var (
	_ vramguard.VRAMReader = (*DeviceReader)(nil)
	_ io.Closer            = (*DeviceReader)(nil)
)

// source is one way of reading the GPU: NVML or nvidia-smi.
type source interface {
	name() string // SourceNVML or SourceSMI
	snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error)
	close() error
}

// errReaderClosed is the cause of a Snapshot after Close.
var errReaderClosed = errors.New("reader closed")

// Snapshot reads every device. It fails with an *Error of KindCanceled
// holding context.Cause(ctx) when ctx is done (NVML calls cannot be
// interrupted: ctx is checked between devices), KindTimeout when an
// nvidia-smi run exceeds SMITimeout, and KindUnavailable when the devices
// cannot be read or the reader is closed. An unreadable process list only
// leaves ProcessesKnown false; nvidia-smi lists compute processes only.
// Through NVML, Used includes memory the driver reserves, so Free+Used is
// Total.
func (r *DeviceReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if r == nil || r.src == nil {
		return nil, newError("vram snapshot", "", vramguard.KindUnavailable,
			errors.New("reader not made by NewNVMLReader, NewSMIReader or NewAutoReader"))
	}
	if r.closed.Load() {
		return nil, newError(r.src.name()+" snapshot", "", vramguard.KindUnavailable, errReaderClosed)
	}
	return r.src.snapshot(ctx)
}

// Close shuts NVML down, waiting for a Snapshot in progress (an nvidia-smi
// reader holds nothing); Snapshot then fails with KindUnavailable. Later
// calls return nil. A failed shutdown is KindUnavailable wrapping the
// nvml.Return.
func (r *DeviceReader) Close() error {
	if r == nil || r.src == nil || r.closed.Swap(true) {
		return nil
	}
	return r.src.close()
}

// Source returns SourceNVML or SourceSMI, as its snapshots say;
// vramguard.SourceNone for a nil or zero reader.
func (r *DeviceReader) Source() string {
	if r == nil || r.src == nil {
		return vramguard.SourceNone
	}
	return r.src.name()
}

// NewAutoReader returns a reader through NVML when it initialises, else
// through nvidia-smi if that answers one snapshot within ctx; close it when
// done. When neither works it returns an *Error of KindUnavailable
// wrapping both failures (KindCanceled when ctx is done first). Invalid
// opts give KindInvalidInput before anything is tried.
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
		return nil, newError(op, "", vramguard.KindCanceled, context.Cause(ctx))
	}
	return nil, newError(op, "", vramguard.KindUnavailable, fmt.Errorf("no GPU reader: nvml: %w; nvidia-smi: %w", nerr, serr))
}
