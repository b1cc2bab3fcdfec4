package wire

import (
	"errors"
	"math"
)

// errNotIntArray is the decoding error of a context member that is not an
// array of integers; the line is then malformed, error text or not.
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
