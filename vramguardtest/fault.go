package vramguardtest

import (
	"fmt"
	"net/http"
	"time"
)

// Error texts of Ollama v0.17.4 that the faults reproduce.
const (
	msgRunnerTerminated = "llama runner process has terminated: exit status 2"
	msgRunnerStopped    = "model runner has unexpectedly stopped, this may be due to resource limitations or an internal error, check ollama server logs for details"
	msgBusy             = "server busy, please try again.  maximum pending requests exceeded"
	msgCrash            = "an error was encountered while running the model: unexpected EOF"
	msgCanceled         = "request canceled"
)

// FaultKind says what a [Fault] does.
type FaultKind int

// The kinds of fault. "After k chunks" means once k response chunks have
// been sent; k at or beyond the reply's length means just before the final
// done line.
const (
	// FaultStall delays the first chunk by Delay. Ollama sends no header
	// before the first chunk, so the client sees nothing at all meanwhile.
	FaultStall FaultKind = iota + 1

	// FaultStallAfter pauses for Delay after After chunks.
	FaultStallAfter

	// FaultCrash kills the runner after After chunks: the stream ends with
	// the line {"error":"an error was encountered while running the model:
	// unexpected EOF"} (a 500 reply if nothing was sent yet). The dead
	// runner stays listed by /api/ps, its GPU memory is freed, and the next
	// request reloads the model.
	FaultCrash

	// FaultLoadCrash makes a load fail after LoadLatency with 500
	// "llama runner process has terminated: exit status 2".
	FaultLoadCrash

	// FaultRunnerStopped makes a load fail after LoadLatency with 500
	// "model runner has unexpectedly stopped, this may be due to resource
	// limitations or an internal error, check ollama server logs for details".
	FaultRunnerStopped

	// FaultOOM makes a load fail at once with 500 "model requires more
	// system memory (X GiB) than is available (Y GiB)".
	FaultOOM

	// FaultBusy rejects the request with 503 "server busy, please try again.
	// maximum pending requests exceeded".
	FaultBusy

	// FaultClose ends the stream after After chunks without a done line
	// and without an error line, like a dropped connection.
	FaultClose

	// FaultRepeat ends the stream after After chunks without a done line,
	// like the runner's abort after too many identical tokens; the chunks
	// sent all carry the same text.
	FaultRepeat
)

// String returns the kind's name.
func (k FaultKind) String() string {
	switch k {
	case FaultStall:
		return "stall"
	case FaultStallAfter:
		return "stall-after"
	case FaultCrash:
		return "crash"
	case FaultLoadCrash:
		return "load-crash"
	case FaultRunnerStopped:
		return "runner-stopped"
	case FaultOOM:
		return "oom"
	case FaultBusy:
		return "busy"
	case FaultClose:
		return "close"
	case FaultRepeat:
		return "repeat"
	default:
		return fmt.Sprintf("FaultKind(%d)", int(k))
	}
}

// Fault is a failure injected into a request. Load faults (FaultLoadCrash,
// FaultRunnerStopped, FaultOOM) act only on a request that loads the model.
// Faults never act on unload requests.
type Fault struct {
	Kind  FaultKind
	After int           // chunks sent before the fault (stall-after, crash, close, repeat)
	Delay time.Duration // length of a stall
}

// Stall returns a fault that delays the first chunk by d.
func Stall(d time.Duration) Fault { return Fault{Kind: FaultStall, Delay: d} }

// StallAfter returns a fault that pauses for d after k chunks.
func StallAfter(k int, d time.Duration) Fault {
	return Fault{Kind: FaultStallAfter, After: k, Delay: d}
}

// CrashAfter returns a fault that kills the runner after k chunks.
func CrashAfter(k int) Fault { return Fault{Kind: FaultCrash, After: k} }

// LoadCrash returns a fault that makes the load fail with "llama runner
// process has terminated".
func LoadCrash() Fault { return Fault{Kind: FaultLoadCrash} }

// RunnerStopped returns a fault that makes the load fail with "model runner
// has unexpectedly stopped".
func RunnerStopped() Fault { return Fault{Kind: FaultRunnerStopped} }

// OOM returns a fault that makes the load fail for lack of memory.
func OOM() Fault { return Fault{Kind: FaultOOM} }

// Busy returns a fault that rejects the request with 503.
func Busy() Fault { return Fault{Kind: FaultBusy} }

// CloseAfter returns a fault that ends the stream after k chunks without a
// done line.
func CloseAfter(k int) Fault { return Fault{Kind: FaultClose, After: k} }

// RepeatAfter returns a fault that ends the stream after k identical chunks
// without a done line.
func RepeatAfter(k int) Fault { return Fault{Kind: FaultRepeat, After: k} }

// faults is the set of faults that apply to one request.
type faults []Fault

func (fs faults) has(k FaultKind) bool {
	for _, f := range fs {
		if f.Kind == k {
			return true
		}
	}
	return false
}

// loadFault returns the error a load fails with, or nil.
func (fs faults) loadFault() *statusError {
	for _, f := range fs {
		switch f.Kind {
		case FaultLoadCrash:
			return &statusError{code: http.StatusInternalServerError, msg: msgRunnerTerminated}
		case FaultRunnerStopped:
			return &statusError{code: http.StatusInternalServerError, msg: msgRunnerStopped}
		}
	}
	return nil
}

// stallBefore returns the total stall before the first chunk.
func (fs faults) stallBefore() time.Duration {
	var d time.Duration
	for _, f := range fs {
		if f.Kind == FaultStall {
			d += f.Delay
		}
	}
	return d
}

// repeat reports whether the reply should consist of one repeated chunk.
func (fs faults) repeat() bool { return fs.has(FaultRepeat) }

// statusError is an error reply with an HTTP status, worded like Ollama.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

// oomError is the error of a load that does not fit in memory.
func oomError(need, free uint64) *statusError {
	if free >= need {
		free = 0
	}
	return &statusError{
		code: http.StatusInternalServerError,
		msg: fmt.Sprintf("model requires more system memory (%s) than is available (%s)",
			humanBytes(need), humanBytes(free)),
	}
}

// humanBytes formats b like Ollama's format.HumanBytes2.
func humanBytes(b uint64) string {
	const (
		kib = 1 << 10
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case b >= gib:
		return fmt.Sprintf("%.1f GiB", float64(b)/gib)
	case b >= mib:
		return fmt.Sprintf("%.1f MiB", float64(b)/mib)
	case b >= kib:
		return fmt.Sprintf("%.1f KiB", float64(b)/kib)
	default:
		return fmt.Sprintf("%d B", b)
	}
}
