package faultproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Error texts of Ollama v0.17.4 used by the ready-made faults.
const (
	MsgRunnerTerminated = "llama runner process has terminated: exit status 2"
	MsgBusy             = "server busy, please try again.  maximum pending requests exceeded"
)

// Kind says what a [Fault] does.
type Kind int

// The kinds of fault. The zero Kind passes the exchange through.
const (
	// KindPass forwards the request and relays the reply unchanged.
	KindPass Kind = iota

	// KindResetBytes relays N bytes of the response body (the headers
	// first, if N > 0), then resets the client connection (TCP RST). N = 0
	// resets before any response byte.
	KindResetBytes

	// KindResetLines relays N complete NDJSON lines, then resets the
	// client connection. N = 0 resets before any response byte.
	KindResetLines

	// KindStall holds back the whole response for Delay, counted from the
	// request's arrival: the request is forwarded at once, the client sees
	// nothing meanwhile (Ollama sends no header before the first token).
	KindStall

	// KindStallAfter relays N lines, then pauses for Delay before the rest.
	KindStallAfter

	// KindRespond answers with Status and Body without contacting the
	// upstream server.
	KindRespond

	// KindInject relays N lines, writes Body, then relays the rest.
	KindInject

	// KindDropDone relays every line but those with "done":true, then ends
	// the response normally.
	KindDropDone

	// KindDelay waits Delay before forwarding the request.
	KindDelay
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindPass:
		return "pass"
	case KindResetBytes:
		return "reset-bytes"
	case KindResetLines:
		return "reset-lines"
	case KindStall:
		return "stall"
	case KindStallAfter:
		return "stall-after"
	case KindRespond:
		return "respond"
	case KindInject:
		return "inject"
	case KindDropDone:
		return "drop-done"
	case KindDelay:
		return "delay"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// Fault is what the proxy does to one request. The zero value passes it
// through. Build faults with the functions below; the fields say what each
// kind uses.
type Fault struct {
	Kind   Kind
	N      int           // bytes or lines relayed before the fault
	Delay  time.Duration // stall or delay
	Status int           // KindRespond
	Body   []byte        // KindRespond, KindInject
}

// String describes the fault for test names and logs.
func (f Fault) String() string {
	switch f.Kind {
	case KindResetBytes:
		return fmt.Sprintf("reset after %d bytes", f.N)
	case KindResetLines:
		return fmt.Sprintf("reset after %d lines", f.N)
	case KindStall:
		return fmt.Sprintf("stall %v before the first byte", f.Delay)
	case KindStallAfter:
		return fmt.Sprintf("stall %v after %d lines", f.Delay, f.N)
	case KindRespond:
		return fmt.Sprintf("respond %d with %d bytes", f.Status, len(f.Body))
	case KindInject:
		return fmt.Sprintf("inject %d bytes after %d lines", len(f.Body), f.N)
	case KindDropDone:
		return "drop the done line"
	case KindDelay:
		return fmt.Sprintf("delay the request %v", f.Delay)
	}
	return f.Kind.String()
}

// Pass returns the fault that passes the exchange through.
func Pass() Fault { return Fault{} }

// ResetAfterBytes resets the connection after n response body bytes.
func ResetAfterBytes(n int) Fault { return Fault{Kind: KindResetBytes, N: n} }

// ResetAfterLines resets the connection after n NDJSON lines.
func ResetAfterLines(n int) Fault { return Fault{Kind: KindResetLines, N: n} }

// Stall holds back the response for d.
func Stall(d time.Duration) Fault { return Fault{Kind: KindStall, Delay: d} }

// StallAfter pauses for d after n lines.
func StallAfter(n int, d time.Duration) Fault { return Fault{Kind: KindStallAfter, N: n, Delay: d} }

// Respond answers with status and body, without the upstream server.
func Respond(status int, body []byte) Fault {
	return Fault{Kind: KindRespond, Status: status, Body: body}
}

// RespondError answers with status and Ollama's error object {"error": msg}.
func RespondError(status int, msg string) Fault {
	b, _ := json.Marshal(map[string]string{"error": msg})
	return Respond(status, b)
}

// RunnerTerminated answers 500 "llama runner process has terminated", as
// Ollama does when a model fails to load.
func RunnerTerminated() Fault {
	return RespondError(http.StatusInternalServerError, MsgRunnerTerminated)
}

// Busy answers 503 "server busy", as Ollama does when its queue is full.
func Busy() Fault { return RespondError(http.StatusServiceUnavailable, MsgBusy) }

// Garbage answers 200 with body as the NDJSON stream.
func Garbage(body []byte) Fault { return Respond(http.StatusOK, body) }

// InjectAfter writes data into the stream after n lines.
func InjectAfter(n int, data []byte) Fault { return Fault{Kind: KindInject, N: n, Body: data} }

// HugeLine injects, after n lines, one line of size bytes (newline
// included). Over 8 MiB, the Ollama client's scanner gives up on it.
func HugeLine(n, size int) Fault {
	b := bytes.Repeat([]byte{'x'}, max(size, 1))
	b[len(b)-1] = '\n'
	return InjectAfter(n, b)
}

// DropDone removes the done:true line from the stream.
func DropDone() Fault { return Fault{Kind: KindDropDone} }

// Delay waits d before forwarding the request.
func Delay(d time.Duration) Fault { return Fault{Kind: KindDelay, Delay: d} }

// Request is what a rule sees of a request. Body is the whole request body;
// the rule must not change it.
type Request struct {
	Seq    int64 // 1 for the proxy's first request
	Method string
	Path   string
	Body   []byte
}

// generateBody is the part of a generate or chat request that IsUnload reads.
type generateBody struct {
	Prompt    *string           `json:"prompt"`
	Messages  []json.RawMessage `json:"messages"`
	KeepAlive json.RawMessage   `json:"keep_alive"`
}

// IsUnload reports whether r is an unload request: POST /api/generate with
// no prompt (or /api/chat with no messages) and keep_alive 0.
func (r *Request) IsUnload() bool {
	if r.Method != http.MethodPost || (r.Path != "/api/generate" && r.Path != "/api/chat") {
		return false
	}
	var b generateBody
	if err := json.Unmarshal(r.Body, &b); err != nil {
		return false
	}
	if (b.Prompt != nil && *b.Prompt != "") || len(b.Messages) > 0 {
		return false
	}
	switch string(bytes.TrimSpace(b.KeepAlive)) {
	case `0`, `"0"`, `"0s"`, `0.0`:
		return true
	}
	return false
}

// IsGeneration reports whether r is a generate or chat request that is not
// an unload.
func (r *Request) IsGeneration() bool {
	return r.Method == http.MethodPost && (r.Path == "/api/generate" || r.Path == "/api/chat") && !r.IsUnload()
}
