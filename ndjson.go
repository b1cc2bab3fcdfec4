package vramguard

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/envconfig"
)

// This file is vramguard's own reader of Ollama's /api/generate and
// /api/chat replies. The api client's reader (api.Client.Generate, .Chat)
// stops at a line over 8 MiB (v0.17 silently, v0.30 and later with
// bufio.ErrTooLong) and allocates an 8 MiB buffer per call. Ollama's done line carries the deprecated
// `context` array, every token of prompt and reply: 40 to 60 MB for a 10 MB
// prompt, which turned finished generations into cut streams. This reader
// checks that array and drops it as it reads, without keeping it, and caps
// everything else a line holds.
//
// It is used when the client built its own HTTP client (Options.Host and
// Options.HTTPClient). With Options.API, or when the api client would
// sign its requests (host ollama.com, or OLLAMA_AUTH set), generations go
// through api.Client.Generate and keep its 8 MiB line limit.

const (
	// replyBufferSize is the read buffer. A line that fits, which is every
	// line but a done line with a long context, is decoded in place.
	replyBufferSize = 64 << 10
	// maxReplyLine bounds one reply line, not counting its context array.
	// A streamed line carries one piece of text: no request makes a
	// server send a line this long.
	maxReplyLine = 64 << 20
	// maxErrorBody bounds what is read of the body of an error status.
	maxErrorBody = 1 << 20
)

// ErrReplyTooLarge is the cause of the KindServer error returned when one
// line of a generation's reply, not counting its context array, is over
// 64 MiB. Lines carry a piece of text each, so a request cannot cause
// this and the same call would fail again: it is not retryable.
var ErrReplyTooLarge = errors.New("reply line over 64 MiB")

// errMalformedLine is the cause of the KindServer error returned for a
// complete line of the reply that is not a reply object (wrong JSON, wrong
// types, data after the object): the server or a proxy sent it, and would
// send it again.
var errMalformedLine = errors.New("malformed reply line")

// replyCut is a reply that broke off: the body failed to read, or ended
// inside a line. It is a cut connection, not a verdict of the server.
type replyCut struct {
	partial string // the start of the line that was cut; "" between lines
	inLine  bool
	err     error // the read error; io.ErrUnexpectedEOF for a clean end inside a line
}

func (e *replyCut) Error() string {
	if e.inLine {
		return fmt.Sprintf("partial line %.40q: %v", e.partial, e.err)
	}
	return e.err.Error()
}

func (e *replyCut) Unwrap() error { return e.err }

// readsOwnStream reports whether generations go through generateNDJSON:
// the client owns its HTTP client, and the api client would not sign the
// request (it does for ollama.com and with OLLAMA_AUTH).
func (c *OllamaClient) readsOwnStream() bool {
	return c.hc != nil && c.base != nil && c.base.Hostname() != "ollama.com" && !envconfig.UseAuth()
}

// generateNDJSON is api.Client.Generate read by replyReader: the same
// request (req as JSON, POST <base>/api/generate), a status of 400 and up
// answered with the same api.StatusError (or api.AuthorizationError), and
// an {"error": ...} line with the same plain error. It differs in what the
// api client hides or cannot read: a body that ends or fails to read
// inside the stream is a *replyCut, a malformed line wraps errMalformedLine,
// a line too long to keep wraps ErrReplyTooLarge, and lines of any length
// are read when what makes them long is the context array.
func (c *OllamaClient) generateNDJSON(ctx context.Context, req *api.GenerateRequest, fn api.GenerateResponseFunc) error {
	return c.readNDJSON(ctx, "/api/generate", req, func(r *replyLine) error { return fn(r.GenerateResponse) })
}

// chatNDJSON is api.Client.Chat read by replyReader, as generateNDJSON is
// api.Client.Generate.
func (c *OllamaClient) chatNDJSON(ctx context.Context, req *api.ChatRequest, fn api.ChatResponseFunc) error {
	return c.readNDJSON(ctx, "/api/chat", req, func(r *replyLine) error {
		return fn(api.ChatResponse{
			Model:      r.Model,
			CreatedAt:  r.CreatedAt,
			Message:    api.Message{Role: r.Message.Role, Content: r.Message.Content, Thinking: r.Message.Thinking, ToolCalls: r.Message.ToolCalls},
			Done:       r.Done,
			DoneReason: r.DoneReason,
			Metrics:    r.Metrics,
		})
	})
}

// readNDJSON posts req to path and calls fn with each reply line.
func (c *OllamaClient) readNDJSON(ctx context.Context, path string, req any, fn func(*replyLine) error) error {
	resp, err := c.postJSON(ctx, path, req, "application/x-ndjson")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rr := newReplyReader(resp.Body, replyBufferSize, maxReplyLine)
	for {
		_, err := rr.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(&rr.line); err != nil {
			return err
		}
	}
}

// postJSON sends req as JSON to path through the client's own HTTP
// client. A status of 400 and up comes back as the error the api client
// would return (replyStatusError), with the body closed.
func (c *OllamaClient) postJSON(ctx context.Context, path string, req any, accept string) (*http.Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base.JoinPath(path).String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", accept)
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= http.StatusBadRequest {
		defer resp.Body.Close()
		return nil, replyStatusError(resp)
	}
	return resp, nil
}

// replyStatusError is the error api.Client.Generate returns for a status
// of 400 and up (FIELD_NOTES §1, trap 3): built from the first line of the
// body, with Status set.
func replyStatusError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody)) // what arrived is enough
	line := data
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		line = data[:i]
	}
	line = bytes.TrimSuffix(line, []byte("\r"))
	var e struct {
		Error     string `json:"error"`
		SigninURL string `json:"signin_url"`
	}
	if err := json.Unmarshal(line, &e); err != nil {
		return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: string(line)}
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return api.AuthorizationError{StatusCode: resp.StatusCode, Status: resp.Status, SigninURL: e.SigninURL}
	}
	return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: e.Error}
}

// replyLine is one decoded line: a response, or an error. A chat's line
// has its text in Message instead of Response.
type replyLine struct {
	api.GenerateResponse
	Message replyMessage `json:"message"`
	Error   string       `json:"error"`
	// Context shadows GenerateResponse.Context (the shallower field wins):
	// the array is checked, as []int would be, and not kept.
	Context contextTokens `json:"context"`
}

// replyMessage is the part of a chat line's message the stream reads. It
// is not api.Message, whose UnmarshalJSON decodes every line twice.
type replyMessage struct {
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

// replyReader reads Ollama's NDJSON reply a line at a time. It is not safe
// for concurrent use.
type replyReader struct {
	br   *bufio.Reader
	max  int       // the longest line kept, context arrays not counted
	line replyLine // the line last decoded, reused
	buf  []byte    // a long line without its context arrays, reused
	err  error     // the error that ended the body (io.EOF: a clean end), once read
}

// newReplyReader reads r through a buffer of size bytes; lines longer
// than that are skimmed (see skimmer), and kept up to max bytes.
func newReplyReader(r io.Reader, size, max int) *replyReader {
	return &replyReader{br: bufio.NewReaderSize(r, size), max: max}
}

// next returns the next line's response. It returns io.EOF at a clean end
// of the body, a *replyCut when the body fails or ends inside a line, the
// line's text as a plain error for an {"error": ...} line, and an error
// wrapping errMalformedLine or ErrReplyTooLarge for a line it cannot use.
// Blank lines are skipped. The response is valid until the next call.
func (r *replyReader) next() (*api.GenerateResponse, error) {
	for {
		if r.err != nil {
			if r.err == io.EOF {
				return nil, io.EOF
			}
			return nil, &replyCut{err: r.err}
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
		return nil, &replyCut{partial: string(line[:min(len(line), 40)]), inLine: true, err: err}
	}
}

// decode decodes b, one line, into r.line. It fails for a line that is
// not a reply object; a line with an error text and wrong types elsewhere
// is still that error (as api.Client.Generate has it).
func (r *replyReader) decode(b []byte) error {
	r.line = replyLine{}
	// A context array that is not one makes the line malformed even with
	// an error text, as the skimmer has it, whatever the members' order.
	if err := json.Unmarshal(b, &r.line); err != nil && (r.line.Error == "" || errors.Is(err, errNotIntArray)) {
		return fmt.Errorf("%w %.40q: %v", errMalformedLine, b, err)
	}
	return nil
}

// reply returns the decoded line's response, or its error text as a plain
// error.
func (r *replyReader) reply() (*api.GenerateResponse, error) {
	if r.line.Error != "" {
		return nil, errors.New(r.line.Error)
	}
	return &r.line.GenerateResponse, nil
}

// skim reads the rest of a line longer than the read buffer, whose start
// is first (already consumed), and returns the line without its context
// members.
func (r *replyReader) skim(first []byte) ([]byte, error) {
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

// skimmer copies one long line, read in pieces, without its context
// members. It checks the object's top level itself and copies the members'
// names and values as they are (json.Unmarshal checks them later), except
// for a context member whose value is an array: that is checked as an
// array of integers and not copied. Failures are sticky in err.
type skimmer struct {
	br   *bufio.Reader
	seg  []byte // the line's bytes read and not yet used
	eol  bool   // seg ends with the line's newline
	rerr error  // the read error that ended the body
	out  []byte
	max  int
	head string // the line's start, for messages
	err  error
}

func (s *skimmer) malformed(what string) bool {
	if s.err == nil {
		s.err = fmt.Errorf("%w %.40q: %s", errMalformedLine, s.head, what)
	}
	return false
}

// more reads the line's next piece into seg, which is empty; false when
// the line or the body has ended.
func (s *skimmer) more() bool {
	if s.eol || s.rerr != nil {
		return false
	}
	var err error
	s.seg, err = s.br.ReadSlice('\n')
	switch err {
	case nil:
		s.eol = true
	case bufio.ErrBufferFull:
	default:
		s.rerr = err
	}
	return true
}

// fill makes seg non-empty, reading on; false, with err set, when the line
// or the body ends first.
func (s *skimmer) fill() bool {
	for s.err == nil && len(s.seg) == 0 {
		if s.more() {
			continue
		}
		if s.eol {
			return s.malformed("line ends inside the object")
		}
		err := s.rerr
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		s.err = &replyCut{partial: s.head, inLine: true, err: err}
	}
	return s.err == nil
}

func (s *skimmer) write(p []byte) bool {
	if s.err != nil {
		return false
	}
	if len(s.out)+len(p) > s.max {
		s.err = fmt.Errorf("%w (context array not counted): line %.40q", ErrReplyTooLarge, s.head)
		return false
	}
	s.out = append(s.out, p...)
	return true
}

// peek skips blanks and returns the next byte, not consumed.
func (s *skimmer) peek() (byte, bool) {
	for s.fill() {
		for len(s.seg) > 0 && isBlank(s.seg[0]) {
			s.seg = s.seg[1:]
		}
		if len(s.seg) > 0 {
			return s.seg[0], true
		}
	}
	return 0, false
}

// punct consumes the next byte, c, and copies it.
func (s *skimmer) punct(c byte) bool {
	s.seg = s.seg[1:]
	return s.write([]byte{c})
}

// object reads the line: one object, then blanks up to the newline or the
// end of the body; a line that does not start as an object is copied.
func (s *skimmer) object() bool {
	for {
		for len(s.seg) > 0 && isBlank(s.seg[0]) {
			s.seg = s.seg[1:]
		}
		if len(s.seg) > 0 || !s.more() {
			break
		}
	}
	if len(s.seg) == 0 || s.seg[0] != '{' {
		return s.copyLine()
	}
	s.punct('{')
	c, ok := s.peek()
	if !ok {
		return false
	}
	kept := false // a member was copied, so the next one needs a comma
	for c != '}' {
		if c != '"' {
			return s.malformed("want a member name")
		}
		mark := len(s.out)
		if kept && !s.write([]byte{','}) {
			return false
		}
		at := len(s.out)
		if !s.copyString() {
			return false
		}
		isContext := contextKey(s.out[at:])
		if c, ok = s.peek(); !ok {
			return false
		}
		if c != ':' {
			return s.malformed("want a colon after a member name")
		}
		s.punct(':')
		if c, ok = s.peek(); !ok {
			return false
		}
		if isContext && c == '[' {
			s.out = s.out[:mark]
			if !s.skipInts() {
				return false
			}
		} else {
			if !s.copyValue() {
				return false
			}
			kept = true
		}
		if c, ok = s.peek(); !ok {
			return false
		}
		switch c {
		case ',':
			s.seg = s.seg[1:]
			if c, ok = s.peek(); !ok {
				return false
			}
			if c == '}' {
				return s.malformed("comma before the end of the object")
			}
		case '}':
		default:
			return s.malformed("want a comma or the end of the object")
		}
	}
	s.punct('}')
	return s.end()
}

// end consumes the blanks after the object and the newline. The end of the
// body also ends the line; its error is for the next line.
func (s *skimmer) end() bool {
	for s.err == nil {
		for len(s.seg) > 0 {
			c := s.seg[0]
			s.seg = s.seg[1:]
			if c == '\n' {
				return true
			}
			if !isBlank(c) {
				return s.malformed("data after the object")
			}
		}
		if !s.more() {
			return true
		}
	}
	return false
}

// copyLine copies the rest of a line that is not an object, for
// json.Unmarshal to judge (a null is a line as api.Client.Generate reads
// it). A read error inside it is a cut.
func (s *skimmer) copyLine() bool {
	for s.err == nil {
		if i := bytes.IndexByte(s.seg, '\n'); i >= 0 {
			s.write(s.seg[:i])
			s.seg = s.seg[i+1:]
			break
		}
		s.write(s.seg)
		s.seg = nil
		if !s.more() {
			if s.rerr != nil && s.rerr != io.EOF {
				s.err = &replyCut{partial: s.head, inLine: true, err: s.rerr}
			}
			break
		}
	}
	return s.err == nil
}

// copyString copies a string, quotes included; seg starts at its quote.
func (s *skimmer) copyString() bool {
	s.punct('"')
	for s.fill() {
		i := bytes.IndexAny(s.seg, "\"\\")
		if i < 0 {
			if !s.write(s.seg) {
				return false
			}
			s.seg = nil
			continue
		}
		if !s.write(s.seg[:i+1]) {
			return false
		}
		c := s.seg[i]
		s.seg = s.seg[i+1:]
		if c == '"' {
			return true
		}
		// An escape: copy the byte it escapes too.
		if !s.fill() || !s.write(s.seg[:1]) {
			return false
		}
		s.seg = s.seg[1:]
	}
	return false
}

// copyValue copies a member's value; seg starts at it. Objects and arrays
// are copied up to their matching bracket, strings whole, anything else up
// to the next comma, brace or blank.
func (s *skimmer) copyValue() bool {
	switch s.seg[0] {
	case '"':
		return s.copyString()
	case '{', '[':
		return s.copyNested()
	}
	for s.fill() {
		i := 0
		for i < len(s.seg) && !isBlank(s.seg[i]) && s.seg[i] != ',' && s.seg[i] != '}' && s.seg[i] != '\n' {
			i++
		}
		if !s.write(s.seg[:i]) {
			return false
		}
		s.seg = s.seg[i:]
		if len(s.seg) > 0 {
			return true
		}
	}
	return false
}

// copyNested copies an object or array up to its matching bracket; seg
// starts at its opening bracket.
func (s *skimmer) copyNested() bool {
	depth := 0
	for s.fill() {
		i := 0
	scan:
		for ; i < len(s.seg); i++ {
			switch s.seg[i] {
			case '"':
				break scan
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					if !s.write(s.seg[:i+1]) {
						return false
					}
					s.seg = s.seg[i+1:]
					return true
				}
			}
		}
		if !s.write(s.seg[:i]) {
			return false
		}
		s.seg = s.seg[i:]
		if len(s.seg) > 0 && !s.copyString() {
			return false
		}
	}
	return false
}

// skipInts consumes an array of integers without copying it; seg starts
// at its bracket.
func (s *skimmer) skipInts() bool {
	var a intArray
	for s.fill() {
		n, done, err := a.scan(s.seg)
		s.seg = s.seg[n:]
		if err != nil {
			return s.malformed(err.Error())
		}
		if done {
			return true
		}
	}
	return false
}

// contextKey reports whether name, a JSON string with its quotes, is
// "context" as encoding/json matches field names (ignoring case).
func contextKey(name []byte) bool {
	const key = "context"
	if len(name) < len(key)+2 {
		return false
	}
	if bytes.IndexByte(name, '\\') < 0 {
		return bytes.EqualFold(name[1:len(name)-1], []byte(key))
	}
	var s string
	return json.Unmarshal(name, &s) == nil && strings.EqualFold(s, key)
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

var errNotIntArray = errors.New("context is not an array of integers")

// intArray checks, fed in pieces, that a JSON value is an array of
// integers that fit an int, or nulls: what decoding into []int accepts.
type intArray struct {
	state uint8
	neg   bool
	n     uint64 // the magnitude of the number being read
}

const (
	iaOpen   = iota // before '['
	iaFirst         // after '[': a number or ']'
	iaNext          // after ',': a number
	iaSign          // after '-': a digit
	iaZero          // after a leading 0: the number has ended
	iaDigits        // in a number's digits
	iaAfter         // after a number: ',' or ']'
	iaNull          // in a null element ([]int decodes it as 0); n counts its letters
)

// scan consumes b up to the end of the array and returns how many bytes it
// used and whether the array ended.
func (a *intArray) scan(b []byte) (int, bool, error) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch a.state {
		case iaDigits:
			if '0' <= c && c <= '9' {
				limit := uint64(math.MaxInt)
				if a.neg {
					limit++
				}
				if a.n > limit/10 {
					return i, false, errNotIntArray
				}
				if a.n = a.n*10 + uint64(c-'0'); a.n > limit {
					return i, false, errNotIntArray
				}
				continue
			}
			a.state = iaAfter
		case iaZero:
			a.state = iaAfter
		}
		switch a.state {
		case iaOpen:
			if c == '[' {
				a.state = iaFirst
			} else if !isSpace(c) {
				return i, false, errNotIntArray
			}
		case iaFirst, iaNext:
			switch {
			case isSpace(c):
			case c == ']' && a.state == iaFirst:
				return i + 1, true, nil
			case c == '-':
				a.neg, a.state = true, iaSign
			case c == '0':
				a.neg, a.state = false, iaZero
			case '1' <= c && c <= '9':
				a.neg, a.n, a.state = false, uint64(c-'0'), iaDigits
			case c == 'n':
				a.n, a.state = 1, iaNull
			default:
				return i, false, errNotIntArray
			}
		case iaNull:
			if c != "null"[a.n] {
				return i, false, errNotIntArray
			}
			if a.n++; a.n == 4 {
				a.state = iaAfter
			}
		case iaSign:
			switch {
			case c == '0':
				a.state = iaZero
			case '1' <= c && c <= '9':
				a.n, a.state = uint64(c-'0'), iaDigits
			default:
				return i, false, errNotIntArray
			}
		case iaAfter:
			switch {
			case isSpace(c):
			case c == ',':
				a.state = iaNext
			case c == ']':
				return i + 1, true, nil
			default:
				return i, false, errNotIntArray
			}
		}
	}
	return len(b), false, nil
}

// isSpace reports whether c is JSON white space.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
