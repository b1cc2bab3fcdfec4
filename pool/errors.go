package pool

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"syscall"

	"github.com/vramguard/vramguard"
)

// ErrUnreachable: a member's server did not answer (it refused the
// connection, cut it, or took longer than Options.AnswerTimeout), or it
// is down and its next probe is not due. The call's error is then
// KindUnavailable.
var ErrUnreachable = errors.New("the member's server does not answer")

var errDown = fmt.Errorf("%w: down, not asked again before its probe is due", ErrUnreachable)

// MemberError is a member's failure, naming it.
type MemberError struct {
	Member string
	Err    error
}

func (e *MemberError) Error() string { return "pool member " + e.Member + ": " + e.Err.Error() }

// Unwrap returns the member's failure.
func (e *MemberError) Unwrap() error { return e.Err }

// Side is one member's side of a pool's refusal.
type Side struct {
	Member string
	Device int // in the pool client's numbering
	Need   uint64
	// Free and Total are the member's device at its reading (Free less the
	// loads placed there and not listed yet); Holders its memory by holder,
	// nil when the reader lists no processes.
	Free, Total uint64
	Holders     []vramguard.MemoryHolder
	// Room is the client's *vramguard.RoomError for this device, when
	// room-making refused it (its Kept names the models it would not
	// unload); nil when the member was not asked.
	Room *vramguard.RoomError
	// Err says why the member was not measured: its server did not
	// answer (a *MemberError wrapping ErrUnreachable), or its device could
	// not be read.
	Err error
}

// NoRoomError is a pool's refusal: no member could take the model. The
// call's error is KindOutOfMemory wrapping it (KindUnavailable when no
// member answered); errors.As finds each side's *vramguard.RoomError and
// errors.Is its causes (vramguard.ErrProtected, ErrUnreachable).
type NoRoomError struct {
	Model   string
	Need    uint64 // the model's estimate plus the headroom
	Members []Side
}

func (e *NoRoomError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s needs %s", e.Model, formatBytes(e.Need))
	for _, s := range e.Members {
		switch {
		case s.Err != nil:
			fmt.Fprintf(&b, "; %s (device %d): not measured: %v", s.Member, s.Device, s.Err)
		case s.Room != nil: // its message names the device
			fmt.Fprintf(&b, "; %s: %s", s.Member, s.Room.Error())
		default:
			fmt.Fprintf(&b, "; %s (device %d): %s free of %s", s.Member, s.Device, formatBytes(s.Free), formatBytes(s.Total))
		}
	}
	return b.String()
}

// Unwrap returns each side's room error and failure.
func (e *NoRoomError) Unwrap() []error {
	var out []error
	for _, s := range e.Members {
		if s.Room != nil {
			out = append(out, s.Room)
		}
		if s.Err != nil {
			out = append(out, s.Err)
		}
	}
	return out
}

func formatBytes(n uint64) string {
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

func invalid(op, msg string) error {
	return &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: errors.New(msg)}
}

// connFailed reports a failure to reach a member's server: nothing
// listens, the connection was cut, or it was refused.
func connFailed(err error) bool {
	var op *net.OpError
	var ue *url.Error
	return errors.As(err, &op) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		(errors.As(err, &ue) && errors.Is(err, io.EOF))
}

type logger interface {
	Info(string, ...any)
	Warn(string, ...any)
}

var slogDiscard = slog.New(slog.DiscardHandler)
