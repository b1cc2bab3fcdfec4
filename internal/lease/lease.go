package lease

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"time"
)

// MaxFileBytes bounds a lease file. [Parse] refuses longer input, Acquire
// refuses a record that encodes longer, and Live skips a longer file
// without reading it.
const MaxFileBytes = 4096

// MaxBytes bounds a reservation's Bytes and ForBase (1 PiB, the library's
// bound on any byte count): Parse refuses more.
const MaxBytes = 1 << 50

// The kinds of error, matched with errors.Is.
var (
	// ErrMalformed: bytes that are not a lease (see [Parse]), or a
	// record that Acquire cannot write as one.
	ErrMalformed = errors.New("malformed lease")
	// ErrUnsafeDir: a lease directory that another user could write to or
	// replace (see [Open]).
	ErrUnsafeDir = errors.New("unsafe lease directory")
	// ErrUnsupported: a platform without flock(2). It also matches
	// errors.ErrUnsupported.
	ErrUnsupported error = &unsupportedError{}
)

type unsupportedError struct{}

func (*unsupportedError) Error() string { return "leases need flock(2), which this platform lacks" }
func (*unsupportedError) Unwrap() error { return errors.ErrUnsupported }

// Error is what every function of the package returns on failure: what was
// being done (Op), on which file or directory (Path, "" for Parse), its kind
// (ErrMalformed, ErrUnsafeDir, ErrUnsupported; nil for a plain OS error)
// and the cause (Err, often an *fs.PathError or a syscall.Errno). Both Kind
// and Err match with errors.Is and errors.As.
type Error struct {
	Op   string // "open", "acquire", "extend", "release", "live", "reserved", "lock", "parse"
	Path string
	Kind error
	Err  error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("lease ")
	b.WriteString(e.Op)
	if e.Path != "" {
		b.WriteString(" ")
		b.WriteString(e.Path)
	}
	if e.Kind != nil {
		b.WriteString(": ")
		b.WriteString(e.Kind.Error())
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns Kind and Err, those that are set.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Record is one lease or reservation as its file says.
type Record struct {
	Version int    `json:"v"`      // 1
	ID      string `json:"id"`     // random, 16 lower-case hex digits; the file is "<ID>.lease"
	Server  string `json:"server"` // the Ollama server, as NormalizeServer returns it
	Model   string `json:"model"`  // the model name as the caller gave it (the caller normalizes)
	PID     int    `json:"pid"`
	Program string `json:"program"`        // the holder's program name (filepath.Base(os.Args[0]) by default)
	Note    string `json:"note,omitempty"` // free text, e.g. the phase name
	// Created is when the lease was taken, by the holder's clock (UTC).
	Created time.Time `json:"created"`
	// Until is when the lease ends of itself (UTC); zero: when released.
	// The holder releases it on its own timer; readers ignore it from then
	// on even if the holder is late.
	Until time.Time `json:"until,omitzero"`

	// A reservation (Bytes above zero) is a claim on free memory of one
	// device rather than a hold on a model: Model is empty, Server may be,
	// and its file is "<ID>.reserve" (see # Reservations in the package
	// doc). Device is the device's index as the holder's VRAM reader
	// numbers it, UUID its UUID where the reader gives one (the name that
	// is the same for every reader on the host); For names the recipient
	// the bytes are kept for (free text); ForPID is the recipient's
	// process when known and ForBase what that process held on the device
	// when the reservation was taken, so that a reader can see the
	// reservation consumed as the process grows. A lease on a model may
	// name a recipient too (For, ForPID: the one a proxy holds it for);
	// the other reservation fields it never has.
	Device  int    `json:"device,omitempty"`
	UUID    string `json:"uuid,omitempty"` // the device's UUID, when its reader gives one
	Bytes   uint64 `json:"bytes,omitempty"`
	For     string `json:"for,omitempty"`
	ForPID  int    `json:"for_pid,omitempty"`
	ForBase uint64 `json:"for_base,omitempty"`
	// Load names the model whose load a reservation stands for while the
	// load is in flight (a load admitted, not listed by the server yet):
	// room-making waits for such a reservation to end, bounded, rather
	// than refuse the room it would leave.
	Load string `json:"load,omitempty"`

	// Path is the file and UID its owner: filled in by Live, not in the
	// JSON.
	Path string `json:"-"`
	UID  int    `json:"-"`
}

// Options configure [Open]. The zero value means the default directory,
// only the current user's leases, no logging and the real clock.
type Options struct {
	// Dir is the lease directory. "" is $XDG_RUNTIME_DIR/vramguard/leases
	// where XDG_RUNTIME_DIR is set to an absolute path, else
	// filepath.Join(os.TempDir(), "vramguard-<euid>", "leases"). A
	// relative path is made absolute against the working directory once,
	// in Open.
	Dir string
	// Shared lets the users of one group share a directory on purpose: the
	// directory may be group-writable (never accessible to others), may
	// belong to another user if its group is one of ours, and lease files
	// of other users count if their group is the directory's. See the
	// package doc (# Threat model) for what that trusts.
	Shared bool
	// Logger gets one record per ignored file, per path and reason, per
	// Dir: Debug for a stale lease or an abandoned temporary file removed,
	// Warn for a file that should not be there (a symlink, another user's
	// file, a live file that does not parse). nil discards.
	Logger *slog.Logger
	// Now is the clock Acquire sets Created by and Live decides by whether
	// a lease's Until has passed and whether a temporary file is a minute
	// old (by its modification time). nil is time.Now. It is called from
	// every goroutine that uses the Dir.
	Now func() time.Time
}

// IsReservation reports whether r is a reservation (Bytes above zero)
// rather than a lease on a model.
func (r Record) IsReservation() bool { return r.Bytes > 0 }

// suffix is the file name ending of r's kind.
func (r Record) suffix() string {
	if r.IsReservation() {
		return reserveSuffix
	}
	return leaseSuffix
}

const (
	leaseSuffix   = ".lease"
	reserveSuffix = ".reserve"
	tempPrefix    = ".tmp-"
)

// NewID returns a new random lease ID: 16 lower-case hex digits.
func NewID() (string, error) {
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(raw[:]), nil
}
