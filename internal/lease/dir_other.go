//go:build !darwin && !dragonfly && !freebsd && !illumos && !linux && !netbsd && !openbsd

package lease

import (
	"context"
	"time"
)

// Dir is an open lease directory. This platform has no flock(2), so Open
// never returns one.
type Dir struct{ path string }

// Open fails with an *Error of Kind ErrUnsupported: this platform has no
// flock(2), which the liveness rule rests on.
func Open(opts Options) (*Dir, error) {
	return nil, &Error{Op: "open", Path: opts.Dir, Kind: ErrUnsupported}
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

// Held is a lease this process holds. This platform has none.
type Held struct{ rec Record }

// Acquire fails with ErrUnsupported.
func (d *Dir) Acquire(Record) (*Held, error) {
	return nil, &Error{Op: "acquire", Path: d.path, Kind: ErrUnsupported}
}

// Record returns the lease as written.
func (h *Held) Record() Record { return h.rec }

// Release does nothing: no Held exists on this platform.
func (h *Held) Release() error { return nil }

// Live fails with ErrUnsupported.
func (d *Dir) Live(server, model string) ([]Record, error) {
	return nil, &Error{Op: "live", Path: d.path, Kind: ErrUnsupported}
}

// Extend fails with ErrUnsupported.
func (h *Held) Extend(d *Dir, until time.Time) error {
	return &Error{Op: "extend", Kind: ErrUnsupported}
}

// Reserved fails with ErrUnsupported.
func (d *Dir) Reserved(device int) ([]Record, error) {
	return nil, &Error{Op: "reserved", Path: d.path, Kind: ErrUnsupported}
}

// Lock fails with ErrUnsupported.
func (d *Dir) Lock(ctx context.Context) (func(), error) {
	return nil, &Error{Op: "lock", Path: d.path, Kind: ErrUnsupported}
}
