package vramguard

import (
	"errors"
	"fmt"
	"strings"
)

// Kind classifies a failure so that callers can decide what to do next
// (retry, fall back, give up) without matching error strings.
//
// A Kind is itself an error, so errors.Is(err, KindTimeout) reports whether
// err, or any error it wraps, is an *Error of that kind.
type Kind uint8

// The failure kinds. KindUnknown is never assigned by the library to an
// *Error it returns; it is the zero value.
const (
	KindUnknown      Kind = iota
	KindTimeout           // a first-chunk, idle, total or unload deadline passed
	KindTransient         // connection refused or reset, server busy, stream ended without done
	KindModelCrash        // the runner terminated or stopped during load or generation
	KindOutOfMemory       // the server or the GPU ran out of memory
	KindNotFound          // the model (or device) does not exist
	KindServer            // any other error reported by the server
	KindUnavailable       // no server answers, no CLI binary, the client is closed
	KindCanceled          // the caller's context was canceled or its deadline passed
	KindInvalidInput      // the caller passed something the library refuses
	KindInternal          // a panic or a failure in caller-supplied code (a tenant's Release, hooks)
	// KindUnverified: the work succeeded or failed on its own terms, but
	// the cleanup after it could not verify the model gone (still held by
	// another client's request, past the unload timeout, the server gone).
	// Guard.Run gives every after-use cleanup failure this kind, so that
	// it never reads as a failure of the generation; the cleanup's own
	// cause stays reachable (errors.Is(err, ErrStillResident),
	// ErrHeldByOthers, ...). Not retryable: the generation need not run
	// again.
	KindUnverified
	// KindRefused: the call would undo another holder's claim, and was
	// refused with nothing sent: UnloadModel of a leased model (ErrLeased).
	KindRefused
)

var kindNames = [...]string{
	KindUnknown:      "unknown",
	KindTimeout:      "timeout",
	KindTransient:    "transient",
	KindModelCrash:   "model crash",
	KindOutOfMemory:  "out of memory",
	KindNotFound:     "not found",
	KindServer:       "server error",
	KindUnavailable:  "unavailable",
	KindCanceled:     "canceled",
	KindInvalidInput: "invalid input",
	KindInternal:     "internal",
	KindUnverified:   "cleanup unverified",
	KindRefused:      "refused",
}

// String returns the kind's name, as used in error messages.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Error makes a Kind usable as an errors.Is target.
func (k Kind) Error() string { return k.String() }

// Retryable reports whether a failure of this kind may succeed if the same
// call is made again (through the subprocess fallback or later).
func (k Kind) Retryable() bool { return k == KindTimeout || k == KindTransient }

// Error is the error type returned by every operation in this module.
//
// Op names the operation ("generate", "unload", "await free", ...), Model the
// model it concerned (empty if none), Kind the classification and Err the
// underlying cause, which stays reachable through errors.As and errors.Is
// (for example api.StatusError, context.DeadlineExceeded or, from package
// gpu, nvml.Return).
type Error struct {
	Op    string
	Model string
	Kind  Kind
	Err   error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("vramguard: ")
	b.WriteString(e.Op)
	if e.Model != "" {
		b.WriteString(" ")
		b.WriteString(fmt.Sprintf("%q", e.Model))
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.String())
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is the Kind of e, so that
// errors.Is(err, vramguard.KindTimeout) works through any wrapping.
func (e *Error) Is(target error) bool {
	k, ok := target.(Kind)
	return ok && k == e.Kind
}

// KindOf returns the Kind of the first *Error in err's chain, or KindUnknown
// when there is none (including err == nil).
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindUnknown
}

func newError(op, model string, kind Kind, err error) *Error {
	// A transport's own *Error (a pool's refusal): the call's error is
	// the transport's, without net/http's wrapping.
	if pe := transportRefused(err); pe != nil {
		return &Error{Op: op, Model: model, Kind: pe.Kind, Err: pe.Err}
	}
	return &Error{Op: op, Model: model, Kind: kind, Err: err}
}

// invalid builds a KindInvalidInput error with a formatted message.
func invalid(op, model, format string, args ...any) *Error {
	return newError(op, model, KindInvalidInput, fmt.Errorf(format, args...))
}

// Sentinel causes, wrapped in *Error values. They let callers tell apart the
// different timeouts (errors.Is(err, ErrIdleTimeout)) while Kind stays
// KindTimeout for all of them.
var (
	ErrFirstChunkTimeout = errors.New("no output before the first-chunk timeout")
	ErrIdleTimeout       = errors.New("stream idle longer than the idle timeout")
	ErrTotalTimeout      = errors.New("generation exceeded the total timeout")
	ErrIncompleteStream  = errors.New("stream ended without done")
	ErrClosed            = errors.New("client closed")
	ErrStillResident     = errors.New("model still resident")
	// ErrFallbackUnsupported: the request carries options that `ollama run`
	// cannot apply, so the fallback was not tried (see Options.Fallback).
	ErrFallbackUnsupported = errors.New("options the ollama CLI cannot carry")
	// ErrHeldByOthers: the unload was sent, but a request that is not this
	// client's still runs on the model, so the server keeps it until that
	// request ends. A guard's cleanup reports it at once instead of
	// waiting for another program's generation.
	ErrHeldByOthers = errors.New("model held by another client's request")
	// ErrUnloadedWhileLoading: a generation of this client was cut before
	// its first chunk because the caller unloaded its model (UnloadModel,
	// UnloadAll, Cleanup, CleanupAsync or EnsureFree). The generation
	// fails with KindCanceled: the unload wins over a load it would
	// otherwise race.
	ErrUnloadedWhileLoading = errors.New("unloaded while the request was loading the model")
	// ErrSessionEnded: a Session was used after its Guard.Run returned.
	ErrSessionEnded = errors.New("session used after its Run returned")
	// ErrPhaseEnded: a Phase's guard or session was used after Phase.End.
	ErrPhaseEnded = errors.New("phase has ended")
	// ErrOffloaded: with Options.FailOnOffload, the model runs partly on
	// the CPU (/api/ps size_vram below size on a server with a GPU). The
	// generation fails with KindOutOfMemory, as if the GPU had run out,
	// and the model is unloaded; errors.As finds its *Offload.
	ErrOffloaded = errors.New("model partly on the CPU")
)

// unverified gives a cleanup failure KindUnverified. The failure's own
// causes stay reachable through errors.Is and errors.As, but not its
// kinds: a timeout of the cleanup must not read as KindTimeout, which
// invites a retry of the work.
func unverified(op, model string, err error) error {
	for {
		j, ok := err.(interface{ Unwrap() []error })
		if !ok || len(j.Unwrap()) != 1 {
			break
		}
		err = j.Unwrap()[0] // errors.Join of one error
	}
	switch e, ok := err.(*Error); {
	case err == nil:
		return nil
	case ok && e.Kind == KindUnverified:
		return err // already says so
	}
	return newError(op, model, KindUnverified, kindless{err})
}

// kindless hides the *Error values of a chain from errors.Is and
// errors.As while keeping what they wrap: Unwrap returns the causes of
// each *Error instead of the *Error itself.
type kindless struct{ err error }

func (k kindless) Error() string { return k.err.Error() }

func (k kindless) Unwrap() []error {
	var out []error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *Error:
			walk(e.Err)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		default:
			out = append(out, err)
		}
	}
	walk(k.err)
	return out
}
