package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ollama/ollama/api"
)

const (
	// BufferSize is the read buffer a client uses. A line that fits,
	// which is every line but a done line with a long context, is decoded
	// in place.
	BufferSize = 64 << 10
	// MaxLine bounds one reply line, not counting its context array. A
	// streamed line carries one piece of text: no request makes a server
	// send a line this long.
	MaxLine = 64 << 20
)

// ErrReplyTooLarge is wrapped by the error returned for a line that, not
// counting its context array, is over the Reader's cap ([MaxLine] for a
// client). Lines carry a piece of text each, so a request cannot cause
// this and the same request would get it again.
var ErrReplyTooLarge = errors.New("reply line over 64 MiB")

// ErrMalformedLine is wrapped by the error returned for a complete line of
// the reply that is not a reply object (wrong JSON, wrong types, data
// after the object): the server or a proxy sent it, and would send it
// again.
var ErrMalformedLine = errors.New("malformed reply line")

// CutError is a reply that broke off: the body failed to read, or ended
// inside a line. It is a cut connection, not a verdict of the server.
type CutError struct {
	Partial string // the start of the line that was cut; "" between lines
	InLine  bool
	Err     error // the read error; io.ErrUnexpectedEOF for a clean end inside a line
}

func (e *CutError) Error() string {
	if e.InLine {
		return fmt.Sprintf("partial line %.40q: %v", e.Partial, e.Err)
	}
	return e.Err.Error()
}

func (e *CutError) Unwrap() error { return e.Err }

// Line is one decoded reply line. A chat's line has its text in Message
// instead of Response. It is flat, Error and Context included: a wrapper
// struct around it cost encoding/json one more allocation per line in
// BenchmarkGenerateStreaming.
type Line struct {
	api.GenerateResponse
	Message Message `json:"message"`
	// Error is an {"error": ...} line's text, which Next returns as an
	// error: it is empty in every line Next returns.
	Error string `json:"error"`
	// Context shadows GenerateResponse.Context (the shallower field wins):
	// the array is checked, as []int would be, and not kept.
	Context contextTokens `json:"context"`
}

// Chat returns the line as api.Client.Chat hands it to its callback.
func (l *Line) Chat() api.ChatResponse {
	return api.ChatResponse{
		Model:      l.Model,
		CreatedAt:  l.CreatedAt,
		Message:    api.Message{Role: l.Message.Role, Content: l.Message.Content, Thinking: l.Message.Thinking, ToolCalls: l.Message.ToolCalls},
		Done:       l.Done,
		DoneReason: l.DoneReason,
		Metrics:    l.Metrics,
	}
}

// Message is the part of a chat line's message the reader decodes. It is
// not api.Message, whose UnmarshalJSON decodes every line twice.
type Message struct {
	Role      string         `json:"role"`
	Content   string         `json:"content"`
	Thinking  string         `json:"thinking"`
	ToolCalls []api.ToolCall `json:"tool_calls"`
}

// contextTokens decodes the deprecated context array without keeping it.
type contextTokens struct{}

func (*contextTokens) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var a intArray
	if n, done, err := a.scan(b); err != nil || !done || n != len(b) {
		return errNotIntArray
	}
	return nil
}

// Reader reads Ollama's NDJSON reply a line at a time. It is not safe for
// concurrent use.
type Reader struct {
	br   *bufio.Reader
	max  int    // the longest line kept, context arrays not counted
	line Line   // the line last decoded, reused
	buf  []byte // a long line without its context arrays, reused
	err  error  // the error that ended the body (io.EOF: a clean end), once read
}

// NewReader reads r through a buffer of size bytes; lines longer than that
// are skimmed (see skimmer), and kept up to max bytes. A client passes
// [BufferSize] and [MaxLine].
func NewReader(r io.Reader, size, max int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, size), max: max}
}

// Next returns the next line. It returns io.EOF at a clean end of the
// body, a [*CutError] when the body fails or ends inside a line, the
// line's text as a plain error for an {"error": ...} line, and an error
// wrapping [ErrMalformedLine] or [ErrReplyTooLarge] for a line it cannot
// use. Blank lines are skipped. The line is valid until the next call.
func (r *Reader) Next() (*Line, error) {
	for {
		if r.err != nil {
			if r.err == io.EOF {
				return nil, io.EOF
			}
			return nil, &CutError{Err: r.err}
		}
		line, err := r.br.ReadSlice('\n')
		switch {
		case err == bufio.ErrBufferFull:
			if line, err = r.skim(line); err != nil {
				return nil, err
			}
		case err != nil:
			r.err = err // the last bytes of the body, with no newline after them
		}
		if blank(line) {
			continue
		}
		derr := r.decode(line)
		switch {
		case derr == nil:
			return r.reply()
		case r.err == nil || !truncated(line):
			return nil, derr // not a reply, cut or not
		}
		// The body ended inside the line.
		err = r.err
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, &CutError{Partial: string(line[:min(len(line), 40)]), InLine: true, Err: err}
	}
}

// decode decodes b, one line, into r.line. It fails for a line that is
// not a reply object; a line with an error text and wrong types elsewhere
// is still that error (as api.Client.Generate has it).
func (r *Reader) decode(b []byte) error {
	r.line = Line{}
	// A context array that is not one makes the line malformed even with
	// an error text, as the skimmer has it, whatever the members' order.
	if err := json.Unmarshal(b, &r.line); err != nil && (r.line.Error == "" || errors.Is(err, errNotIntArray)) {
		return fmt.Errorf("%w %.40q: %v", ErrMalformedLine, b, err)
	}
	return nil
}

// reply returns the decoded line, or its error text as a plain error.
func (r *Reader) reply() (*Line, error) {
	if r.line.Error != "" {
		return nil, errors.New(r.line.Error)
	}
	return &r.line, nil
}

// skim reads the rest of a line longer than the read buffer, whose start
// is first (already consumed), and returns the line without its context
// members.
func (r *Reader) skim(first []byte) ([]byte, error) {
	s := skimmer{br: r.br, seg: first, out: r.buf[:0], max: r.max, head: string(first[:min(len(first), 40)])}
	ok := s.object()
	r.buf = s.out[:0]
	if s.rerr != nil {
		r.err = s.rerr
	}
	if !ok {
		return nil, s.err
	}
	return s.out, nil
}

// isBlank reports whether c is JSON white space within a line.
func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

// blank reports whether a line holds nothing but white space.
func blank(line []byte) bool {
	for _, c := range line {
		if !isBlank(c) && c != '\n' {
			return false
		}
	}
	return true
}

// truncated reports whether b, the last bytes of a body, is the start of a
// JSON value cut short, rather than something that is not JSON at all.
func truncated(b []byte) bool {
	err := json.NewDecoder(bytes.NewReader(b)).Decode(new(json.RawMessage))
	return errors.Is(err, io.ErrUnexpectedEOF)
}
