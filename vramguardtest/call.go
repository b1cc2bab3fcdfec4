package vramguardtest

import (
	"cmp"
	"encoding/json"
	"slices"

	"github.com/ollama/ollama/api"
)

// maxCalls bounds the requests recorded per model.
const maxCalls = 64

// Call is a generate or chat request as the server received it. Its
// slices and maps are shared by every reader: do not modify them.
type Call struct {
	Endpoint string // "generate" or "chat"
	Model    string // as sent

	Prompt string          // generate only
	System string          // generate only
	Images []api.ImageData // generate only; chat images are in Messages

	Messages []api.Message // chat only, tool calls, tool names and images included
	Tools    api.Tools     // chat only

	Format    json.RawMessage // as sent: "json", a JSON schema, or anything else
	Think     *api.ThinkValue
	Options   map[string]any
	KeepAlive *api.Duration
	Stream    *bool
}

// ImageCount returns how many images the request carried: generate's
// images, or those of every chat message.
func (c Call) ImageCount() int {
	n := len(c.Images)
	for _, m := range c.Messages {
		n += len(m.Images)
	}
	return n
}

// recorded is a Call numbered in arrival order across models.
type recorded struct {
	seq uint64
	Call
}

// recordLocked keeps c as m's latest call, dropping the oldest beyond
// maxCalls.
func (s *Server) recordLocked(m *model, c Call) {
	s.callSeq++
	if len(m.calls) == maxCalls {
		m.calls = slices.Delete(m.calls, 0, 1)
	}
	m.calls = append(m.calls, recorded{seq: s.callSeq, Call: c})
}

// Calls returns the generate and chat requests the server received for the
// named model, or for all models when name is "", oldest first. Only the
// last 64 of each model are kept. Unload requests (empty prompt or no
// messages, keep_alive 0) are not recorded; every other request to a
// known model is, including load-only requests and those refused with an
// error. An unknown model has none. It is safe for concurrent use.
func (s *Server) Calls(name string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var recs []recorded
	if name != "" {
		if m, err := s.lookupLocked(name); err == nil {
			recs = m.calls
		}
	} else {
		for _, m := range s.order {
			recs = append(recs, m.calls...)
		}
		slices.SortFunc(recs, func(a, b recorded) int { return cmp.Compare(a.seq, b.seq) })
	}
	out := make([]Call, len(recs))
	for i, r := range recs {
		out[i] = r.Call
	}
	return out
}
