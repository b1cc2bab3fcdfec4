package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

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
		s.err = fmt.Errorf("%w %.40q: %s", ErrMalformedLine, s.head, what)
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
		s.err = &CutError{Partial: s.head, InLine: true, Err: err}
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
				s.err = &CutError{Partial: s.head, InLine: true, Err: s.rerr}
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
