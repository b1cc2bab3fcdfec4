package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/wire/wiretest"
)

// Tests of the reader alone, where a small buffer or cap makes a case
// cheap. The root package tests it through GenerateStreaming against
// httptest servers, and against api.Client.Generate on the same bytes.

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestReplyReaderCap: the cap bounds every member but the context arrays:
// text, thinking and members the reader does not know.
func TestReplyReaderCap(t *testing.T) {
	const max = 1 << 16
	huge := strings.Repeat("b", max)
	ints := strings.Repeat("12,", max) + "1"
	for _, tt := range []struct {
		name string
		line string
		ok   bool
	}{
		{"response", `{"response":"` + huge + `","done":true}`, false},
		{"thinking", `{"thinking":"` + huge + `","done":true}`, false},
		{"unknown string", `{"_debug_info":"` + huge + `","done":true}`, false},
		{"unknown array", `{"logprobs":[` + ints + `],"done":true}`, false},
		{"unknown number", `{"x":` + strings.Repeat("1", max) + `,"done":true}`, false},
		{"context", `{"context":[` + ints + `],"done":true}`, true},
		{"two contexts", `{"context":[` + ints + `],"done":true,"CONTEXT":[` + ints + `]}`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rr := NewReader(strings.NewReader(tt.line+"\n"), 64, max)
			r, err := rr.Next()
			switch {
			case tt.ok && (err != nil || !r.Done):
				t.Fatalf("got %v, %v; want the done line", r, err)
			case !tt.ok && !errors.Is(err, ErrReplyTooLarge):
				t.Fatalf("got %v, want ErrReplyTooLarge", err)
			}
		})
	}
}

// TestContextTokens: the context check accepts exactly what decoding into
// []int accepts.
func TestContextTokens(t *testing.T) {
	for _, s := range []string{
		`[]`, `[ ]`, `null`, `[0]`, `[-0]`, `[1,2,3]`, ` [ 1 , 2 ] `, "[1,\t2\r]", `[9223372036854775807]`,
		`[-9223372036854775808]`, `[9223372036854775808]`, `[-9223372036854775809]`, `[99999999999999999999]`,
		`[01]`, `[1.0]`, `[1e3]`, `[-]`, `[1,]`, `[,1]`, `[1 2]`, `["1"]`, `[null]`, `[[1]]`, `{}`, `"x"`, `1`,
		`[1]]`, `[1`, `[+1]`, `[--1]`, `[0x1]`, `[null, 1,null ]`, `[nul]`, `[nulll]`, `[nullx]`, `[true]`,
	} {
		var ints []int
		want := json.Unmarshal([]byte(s), &ints) == nil
		var ct contextTokens
		if got := json.Unmarshal([]byte(s), &ct) == nil; got != want {
			t.Errorf("%s: contextTokens accepts it: %v, []int: %v", s, got, want)
		}
		line := `{"done":true,"context":` + s + `,"response":"` + strings.Repeat("p", 100) + `"}` + "\n"
		if got := readAll(NewReader(strings.NewReader(line), 16, 1<<20)).err == nil; got != want {
			t.Errorf("%s in a long line: accepted %v, []int: %v", s, got, want)
		}
	}
}

// replies is what a Reader made of a body.
type replies struct {
	resps []api.GenerateResponse
	err   error // nil at a clean end
}

func readAll(rr *Reader) replies {
	var out replies
	for {
		r, err := rr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			out.err = err
			return out
		}
		out.resps = append(out.resps, r.GenerateResponse)
	}
}

// FuzzReplyReader: the long-line path (a 16-byte buffer makes every line
// long) reads what the in-place path reads: the same responses, the same
// end, the same error lines, and a cut where the in-place path sees one
// (or a context array that went wrong before the cut).
func FuzzReplyReader(f *testing.F) {
	for _, s := range wiretest.StreamSeeds() {
		f.Add([]byte(s.Body), s.Status, s.Tail)
	}
	f.Add([]byte(`{"response":"a","context":[1, 2,3]}`+"\n"+`{"CONTEXT":null,"done":true,"context":[4]}`), uint16(200), uint8(0))
	f.Add([]byte(`{"error":"boom","context":[1],"response":42}`+"\n"), uint16(200), uint8(0))
	f.Add([]byte(`{"con\u0074ext":[1],"done":true}`+"\n"+`   `+"\n"+`null`+"\n"), uint16(200), uint8(0))
	f.Add([]byte(`{"response":"a\"b\\","thinking":"\u00e9","tool_calls":[{"function":{"name":"f","arguments":{"a":[1,{"b":"}"}]}}}],"done":true}`), uint16(200), uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, _ uint16, tail uint8) {
		src := func() io.Reader {
			if tail%2 == 1 {
				return io.MultiReader(bytes.NewReader(body), errReader{syscall.ECONNRESET})
			}
			return bytes.NewReader(body)
		}
		fast := readAll(NewReader(src(), BufferSize, MaxLine))
		slow := readAll(NewReader(src(), 16, MaxLine))
		if len(fast.resps) != len(slow.resps) {
			t.Fatalf("%d responses in place, %d skimmed (errors %v, %v)", len(fast.resps), len(slow.resps), fast.err, slow.err)
		}
		for i := range fast.resps {
			a, _ := json.Marshal(fast.resps[i])
			b, _ := json.Marshal(slow.resps[i])
			if !bytes.Equal(a, b) {
				t.Fatalf("response %d: in place %s, skimmed %s", i, a, b)
			}
		}
		var fc, sc *CutError
		switch {
		case (fast.err == nil) != (slow.err == nil):
			t.Fatalf("in place %v, skimmed %v", fast.err, slow.err)
		case errors.As(fast.err, &fc) && !errors.As(slow.err, &sc) && !strings.Contains(slow.err.Error(), errNotIntArray.Error()):
			// In place, a line cut short is only checked as JSON; the
			// skimmer also sees a context array go wrong before the cut.
			t.Fatalf("in place a cut (%v), skimmed %v", fast.err, slow.err)
		case isLineError(fast.err) != isLineError(slow.err),
			isLineError(fast.err) && fast.err.Error() != slow.err.Error():
			t.Fatalf("in place %v, skimmed %v", fast.err, slow.err)
		}
	})
}

// isLineError reports whether err is an {"error"} line's text.
func isLineError(err error) bool {
	var cut *CutError
	return err != nil && !errors.As(err, &cut) && !errors.Is(err, ErrMalformedLine) && !errors.Is(err, ErrReplyTooLarge)
}
