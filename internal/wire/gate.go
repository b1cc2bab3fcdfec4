package wire

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// GateHeader is the header (a trailer, on a streamed reply) in which
// vramgate (cmd/vramgate) says, in one line, what it verified of an
// unload it answered: "verified; checked=ps+runner-processes; ...".
const GateHeader = "X-Vramgate-Unload"

// maxGateLine bounds what GateUnload keeps of a text the gate sent.
const maxGateLine = 1024

// GateUnload is what a vramgate said of one unload request it answered:
// the "vramgate" object of its reply body, and GateHeader. The zero value
// is the answer of a server that is no vramgate (Ollama itself).
type GateUnload struct {
	// Said: the answer came from a vramgate: it carries the object or
	// the header.
	Said bool
	// Object: the body carried a well-formed "vramgate" object; the
	// fields below come from it.
	Object        bool
	Model         string
	Verified      bool
	Checked       string // the gate's checks, "ps+runner-processes"
	NoRunnerCheck string // why the gate made no runner check
	RunnerCheckBy string // who made the gate's runner check, when not the gate
	RunnerSeen    bool
	// Header is GateHeader's value (the trailer's when the header has
	// none), on one line.
	Header string
}

// ReadGateUnload reads what a vramgate said of an unload in the headers,
// trailers and body of its 200 reply: a JSON object, or NDJSON lines of
// which the last one with a "vramgate" object counts. Anything it cannot
// read (no object, malformed JSON, a field of the wrong type) leaves
// Object false; it never fails. Texts are kept to one line of at most
// 1024 bytes.
func ReadGateUnload(header, trailer http.Header, body []byte) GateUnload {
	var g GateUnload
	g.Header = oneLine(header.Get(GateHeader))
	if g.Header == "" {
		g.Header = oneLine(trailer.Get(GateHeader))
	}
	for line := range bytes.Lines(body) {
		line = bytes.TrimSpace(line)
		if !bytes.Contains(line, []byte(`"vramgate"`)) {
			continue
		}
		var v struct {
			Vramgate *struct {
				Model         string `json:"model"`
				Verified      bool   `json:"verified"`
				Checked       string `json:"checked"`
				NoRunnerCheck string `json:"no_runner_check"`
				RunnerCheckBy string `json:"runner_check_by"`
				RunnerSeen    bool   `json:"runner_seen"`
			} `json:"vramgate"`
		}
		if json.Unmarshal(line, &v) != nil || v.Vramgate == nil {
			continue
		}
		o := v.Vramgate
		g.Object, g.Verified, g.RunnerSeen = true, o.Verified, o.RunnerSeen
		g.Model, g.Checked = oneLine(o.Model), oneLine(o.Checked)
		g.NoRunnerCheck, g.RunnerCheckBy = oneLine(o.NoRunnerCheck), oneLine(o.RunnerCheckBy)
	}
	g.Said = g.Object || g.Header != ""
	return g
}

// oneLine folds s to one line of single spaces, at most maxGateLine bytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxGateLine {
		s = strings.ToValidUTF8(s[:maxGateLine], "") + "…"
	}
	return s
}
