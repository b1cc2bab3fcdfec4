// Package wiretest holds the replies that seed the fuzz targets of the
// reply stream: those of internal/wire's reader and those of the root
// package, which feed the same bytes through GenerateStreaming.
package wiretest

import (
	"encoding/json"
	"strings"

	"github.com/ollama/ollama/api"
)

// Seed is one reply a server could send.
type Seed struct {
	Body   string
	Status uint16 // the HTTP status
	// Tail says how the body ends: 0 a clean end, 1 a connection reset, 2
	// io.ErrUnexpectedEOF (the targets read it modulo their own set).
	Tail uint8
}

// StreamSeeds returns the seeds, a new slice each call: well-formed
// streams, streams cut inside a line, error lines, status errors and
// lines that are not replies.
func StreamSeeds() []Seed {
	line := func(v any) string { b, _ := json.Marshal(v); return string(b) + "\n" }
	ok := line(api.GenerateResponse{Response: "a castle"}) + line(api.GenerateResponse{Response: " at dawn"}) +
		line(api.GenerateResponse{Done: true, DoneReason: "stop", Metrics: api.Metrics{LoadDuration: 3e7, EvalCount: 2}})
	return []Seed{
		{ok, 200, 0},
		{ok, 200, 1},
		{ok[:len(ok)/2], 200, 1}, // cut mid-line, connection reset
		{ok[:len(ok)/2], 200, 0}, // cut mid-line, clean end
		{strings.ReplaceAll(ok, "\n", "\r\n"), 200, 0},
		{line(api.GenerateResponse{Response: "x"}), 200, 0}, // no done line
		{`{"error":"an error was encountered while running the model: unexpected EOF"}` + "\n", 200, 0},
		{`{"error":"model 'tiny' not found"}`, 404, 0},
		{`{"error":"llama runner process has terminated: exit status 2"}`, 500, 0},
		{`{"error":"llama-server process has terminated: exit status 2"}`, 500, 0},
		{`{"error":"the input length exceeds the context length"}`, 400, 0},
		{line(api.GenerateResponse{Response: "x"}) + `{"error":"prediction aborted, token repeat limit reached"}` + "\n", 200, 0},
		{line(api.GenerateResponse{Response: "x"}), 200, 2}, // v0.30+: a cut stream returns unexpected EOF
		{`{"error":"server busy, please try again.  maximum pending requests exceeded"}`, 503, 0},
		{"<html>502 Bad Gateway</html>", 502, 0},
		{"\x00\xff garbage", 200, 0},
		{`{"response":42,"done":"yes"}`, 200, 0},
		{`{"done":true}` + "\n" + `{"error":"late"}` + "\n", 200, 0},
		{`{"done":true}{"done":true}`, 200, 0},
		{"", 200, 0},
		{"", 200, 2},
		{`{"error":""}` + "\n" + `{"done":true}`, 401, 0},
		{"[1,2,3]\n" + `{"done":true}`, 200, 0},
		{"null\n" + `{"done":true}`, 200, 0},
	}
}
