package standin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// Event kinds.
const (
	EventStart   = "start"   // a process started; Args holds its argv
	EventRequest = "request" // an HTTP request arrived; Method, Path, Body
	EventExit    = "exit"    // the stand-in exits by itself; Code, Reason
)

// MaxLoggedBody is the largest request body an Event holds; longer bodies
// are cut and BodyTruncated is set.
const MaxLoggedBody = 64 << 10

// Event is one line of the log named by EnvLog.
type Event struct {
	Time  time.Time `json:"time"`
	PID   int       `json:"pid"`
	Event string    `json:"event"` // EventStart, EventRequest or EventExit

	// Args is the command line without the program name (start events).
	Args []string `json:"args,omitempty"`

	// Method, Path and Body describe a request. Body is the raw JSON body;
	// a body that is not valid JSON, or was cut at MaxLoggedBody bytes, is
	// stored as a JSON string instead.
	Method        string          `json:"method,omitempty"`
	Path          string          `json:"path,omitempty"`
	Body          json.RawMessage `json:"body,omitempty"`
	BodyTruncated bool            `json:"body_truncated,omitempty"`

	// Code and Reason describe an exit the stand-in chose (a knob).
	Code   int    `json:"code,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Model returns the value of --model (or -m) in a start event's Args, or ""
// when there is none, as in Ollama's device discovery.
func (e Event) Model() string {
	return parseArgs(e.Args).model
}

// ReadEvents reads the event log at path. A file that does not exist holds
// no events. A last line without its newline (being written right now) is
// ignored; any other line that does not parse is an error.
func ReadEvents(path string) ([]Event, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("standin: read events: %w", err)
	}
	// Everything after the last newline is a line still being written.
	lines := bytes.Split(b, []byte("\n"))
	lines = lines[:len(lines)-1]
	var events []Event
	for i, line := range lines {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(line, &e); err != nil {
			return events, fmt.Errorf("standin: read events: line %d: %w", i+1, err)
		}
		events = append(events, e)
	}
	return events, nil
}

// eventLog appends events to a file opened with O_APPEND. Each event is
// written with one write call, which the kernel appends atomically, so the
// processes of one Ollama server can share the file. A nil *eventLog
// records nothing. It is safe for concurrent use.
type eventLog struct {
	f   *os.File
	pid int
}

func openEventLog(path string, pid int) (*eventLog, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &eventLog{f: f, pid: pid}, nil
}

func (l *eventLog) record(e Event) {
	if l == nil {
		return
	}
	e.Time = time.Now()
	e.PID = l.pid
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	_, _ = l.f.Write(append(b, '\n'))
}

func (l *eventLog) start(args []string) {
	l.record(Event{Event: EventStart, Args: append([]string{}, args...)})
}

func (l *eventLog) request(method, path string, body []byte) {
	if l == nil {
		return
	}
	e := Event{Event: EventRequest, Method: method, Path: path}
	if len(body) > MaxLoggedBody {
		body, e.BodyTruncated = body[:MaxLoggedBody], true
	}
	switch {
	case len(bytes.TrimSpace(body)) == 0:
	case !e.BodyTruncated && json.Valid(body):
		var buf bytes.Buffer
		if json.Compact(&buf, body) == nil {
			e.Body = buf.Bytes()
		}
	default:
		e.Body, _ = json.Marshal(string(body))
	}
	l.record(e)
}

func (l *eventLog) exit(code int, reason string) {
	l.record(Event{Event: EventExit, Code: code, Reason: reason})
}

func (l *eventLog) close() {
	if l != nil {
		l.f.Close()
	}
}
