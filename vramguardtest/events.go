package vramguardtest

import (
	"slices"
	"time"
)

// maxEvents bounds the server's event log.
const maxEvents = 4096

// EventKind says what an [Event] records.
type EventKind int

// The kinds of event, in the order a model's life usually shows them.
const (
	// EventRequest: a generate or chat request for a known model arrived
	// (load-only requests and refused ones included, unloads not).
	EventRequest EventKind = iota + 1
	// EventUnloadRequest: an unload request arrived (empty prompt or no
	// messages, keep_alive 0), whatever became of it.
	EventUnloadRequest
	// EventUnloadLost: an unload request arrived while the model was
	// loading and was dropped, as Ollama 0.17 and later do.
	EventUnloadLost
	// EventLoaded: a load finished; the model is listed by /api/ps.
	EventLoaded
	// EventLoadFailed: a load failed (a fault, out of memory).
	EventLoadFailed
	// EventEvicted: the scheduler unloaded the model to make room
	// (Config.StrictVRAM).
	EventEvicted
	// EventUnloaded: the model left /api/ps.
	EventUnloaded
	// EventCrashed: the model's runner died (FaultCrash, KillRunner).
	EventCrashed
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case EventRequest:
		return "request"
	case EventUnloadRequest:
		return "unload-request"
	case EventUnloadLost:
		return "unload-lost"
	case EventLoaded:
		return "loaded"
	case EventLoadFailed:
		return "load-failed"
	case EventEvicted:
		return "evicted"
	case EventUnloaded:
		return "unloaded"
	case EventCrashed:
		return "crashed"
	}
	return "unknown"
}

// Event is one thing that happened to a model on the server.
type Event struct {
	At    time.Time
	Kind  EventKind
	Model string // the model's short name, as /api/ps shows it ("tiny:latest")
	// Endpoint is "generate" or "chat" for requests, "" otherwise.
	Endpoint string
	// KeepAlive is the request's keep_alive (nil when it sent none), for
	// EventRequest and EventUnloadRequest.
	KeepAlive *time.Duration
}

// eventLocked appends an event, dropping the oldest beyond maxEvents.
func (s *Server) eventLocked(m *model, kind EventKind, c *Call) {
	ev := Event{At: time.Now(), Kind: kind, Model: m.short}
	if c != nil {
		ev.Endpoint = c.Endpoint
		if c.KeepAlive != nil {
			d := c.KeepAlive.Duration
			ev.KeepAlive = &d
		}
	}
	if len(s.events) == maxEvents {
		s.events = slices.Delete(s.events, 0, 1)
	}
	s.events = append(s.events, ev)
}

// Events returns what happened on the server, oldest first, for the named
// model or for all models when name is "": requests with their
// keep-alives, unload requests (and those lost during a load), loads,
// evictions, unloads and crashes. Only the last 4096 events are kept. It
// is safe for concurrent use; the slice is the caller's.
func (s *Server) Events(name string) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var short string
	if name != "" {
		m, err := s.lookupLocked(name)
		if err != nil {
			return nil
		}
		short = m.short
	}
	var out []Event
	for _, ev := range s.events {
		if short == "" || ev.Model == short {
			out = append(out, ev)
		}
	}
	return out
}
