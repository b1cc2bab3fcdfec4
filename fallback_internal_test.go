package vramguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTokenCap(t *testing.T) {
	tests := []struct {
		name   string
		max    int
		pieces []string // fed in order
		want   string   // what fits
		full   bool
	}{
		{name: "no cap", max: 0, pieces: []string{"a b c d e f g"}, want: "a b c d e f g"},
		{name: "words count", max: 3, pieces: []string{"a b c d"}, want: "a b c ", full: true},
		{name: "bytes/4 count", max: 2, pieces: []string{"abcdefghij"}, want: "abcdefgh", full: true},
		{name: "across pieces", max: 2, pieces: []string{"a", " b", " c"}, want: "a b ", full: true},
		{name: "a word split over pieces is one word", max: 2, pieces: []string{"ab", "c d"}, want: "abc d"},
		{name: "unicode spaces separate words", max: 2, pieces: []string{"a\u00a0b\u3000c"}, want: "a\u00a0b\u3000", full: true},
		{name: "runes are not cut", max: 1, pieces: []string{"é€x"}, want: "é", full: true},
		{name: "invalid bytes count one each", max: 1, pieces: []string{"\xff\xfe\xfd\xfc\xfb"}, want: "\xff\xfe\xfd\xfc", full: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := tokenCap{max: tt.max}
			var got strings.Builder
			var full bool
			for _, p := range tt.pieces {
				var n int
				n, full = tc.fit(p)
				got.WriteString(p[:n])
				if full {
					break
				}
			}
			if got.String() != tt.want || full != tt.full {
				t.Errorf("fit %q, full %v; want %q, %v", got.String(), full, tt.want, tt.full)
			}
		})
	}
}

func TestCompleteRunes(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{
		{"", 0}, {"abc", 3}, {"a\xe2\x82", 1}, {"a\xe2\x82\xac", 4}, {"\xf0\x9f\x98", 0},
		{"a\xff", 2}, {"\x82\x82\x82\x82", 4},
	} {
		if got := completeRunes([]byte(tt.in)); got != tt.want {
			t.Errorf("completeRunes(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

// FuzzTokenCap: whatever the CLI writes and however the pipe splits it,
// the text kept is a prefix of the output, cut between runes, with at most
// max words and 4*max bytes, and only a rune that would pass the cap
// stops it.
func FuzzTokenCap(f *testing.F) {
	f.Add("one two three four five", uint8(3), uint8(4))
	f.Add("é€\xff  x\u00a0y", uint8(2), uint8(1))
	f.Fuzz(func(t *testing.T, out string, max, split uint8) {
		if max == 0 {
			return
		}
		tc := tokenCap{max: int(max)}
		var kept strings.Builder
		full := false
		rest := []byte(out)
		var pending []byte
		for len(rest) > 0 && !full {
			k := min(int(split)+1, len(rest))
			data := append(pending, rest[:k]...)
			rest = rest[k:]
			end := len(data)
			if len(rest) > 0 {
				end = completeRunes(data)
			}
			piece := string(data[:end])
			pending = bytes.Clone(data[end:])
			var n int
			n, full = tc.fit(piece)
			kept.WriteString(piece[:n])
		}
		got := kept.String()
		if !strings.HasPrefix(out, got) {
			t.Fatalf("kept %q is not a prefix of %q", got, out)
		}
		if w := len(strings.Fields(got)); w > int(max) || len(got) > 4*int(max) {
			t.Fatalf("kept %q: %d words, %d bytes over a cap of %d", got, w, len(got), max)
		}
		if !full && got != out {
			t.Fatalf("kept %q of %q without reaching the cap", got, out)
		}
		if full {
			_, size := utf8.DecodeRuneInString(out[len(got):])
			next := out[:len(got)+size]
			if len(strings.Fields(next)) <= int(max) && (len(next)+3)/4 <= int(max) {
				t.Fatalf("stopped at %q although %q fits", got, next)
			}
		}
	})
}

func TestCheckFormat(t *testing.T) {
	tests := []struct {
		name   string
		format string // as normFormat leaves it; "" for none
		text   string
		want   Kind // 0: accepted
	}{
		{name: "no format, any text", text: "{ not json", want: 0},
		{name: "json: object", format: `"json"`, text: `{"a":1}`},
		{name: "json: any value", format: `"json"`, text: ` 12 `},
		{name: "json: cut", format: `"json"`, text: `{"a":`, want: KindTransient},
		{name: "json: empty", format: `"json"`, text: ``, want: KindTransient},
		{name: "json: trailing text", format: `"json"`, text: `{} x`, want: KindTransient},
		{name: "schema: not JSON", format: `{"type":"object"}`, text: `{`, want: KindTransient},
		{name: "schema without type", format: `{}`, text: `"anything"`},
		{name: "object", format: `{"type":"object"}`, text: `{}`},
		{name: "object wanted, array", format: `{"type":"object"}`, text: `[]`, want: KindServer},
		{name: "required present", format: `{"type":"object","required":["a","b"]}`, text: `{"a":null,"b":0}`},
		{name: "required missing", format: `{"type":"object","required":["a","b"]}`, text: `{"a":1}`, want: KindServer},
		{name: "required on a non-object value is not checked", format: `{"required":["a"]}`, text: `3`},
		{name: "integer", format: `{"type":"integer"}`, text: `3`},
		{name: "integer with a zero fraction", format: `{"type":"integer"}`, text: `3.0`},
		{name: "integer wanted, fraction", format: `{"type":"integer"}`, text: `3.5`, want: KindServer},
		{name: "number takes integers", format: `{"type":"number"}`, text: `-2e3`},
		{name: "string wanted, number", format: `{"type":"string"}`, text: `1`, want: KindServer},
		{name: "boolean", format: `{"type":"boolean"}`, text: `false`},
		{name: "null", format: `{"type":"null"}`, text: `null`},
		{name: "null wanted, object", format: `{"type":"null"}`, text: `{}`, want: KindServer},
		{name: "type list", format: `{"type":["string","null"]}`, text: `null`},
		{name: "type list mismatch", format: `{"type":["string","null"]}`, text: `true`, want: KindServer},
		{name: "unknown type name passes", format: `{"type":"date"}`, text: `1`},
		{name: "nested property", format: `{"properties":{"a":{"type":"object","required":["b"]}}}`, text: `{"a":{}}`, want: KindServer},
		{name: "absent property is not checked", format: `{"properties":{"a":{"type":"string"}}}`, text: `{}`},
		{name: "items", format: `{"type":"array","items":{"type":"integer"}}`, text: `[1,2,3]`},
		{name: "items mismatch", format: `{"type":"array","items":{"type":"integer"}}`, text: `[1,"2"]`, want: KindServer},
		{name: "tuple items are not checked", format: `{"type":"array","items":[{"type":"string"}]}`, text: `[1]`},
		{name: "unknown keywords pass", format: `{"type":"string","minLength":5,"enum":["x"]}`, text: `"y"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, err := checkFormat(json.RawMessage(tt.format), tt.text)
			if kind != tt.want || (err == nil) != (tt.want == 0) {
				t.Fatalf("checkFormat(%s, %q) = %v, %v; want kind %v", tt.format, tt.text, kind, err, tt.want)
			}
			if err != nil && !errors.Is(err, ErrFormatMismatch) {
				t.Errorf("error %v does not wrap ErrFormatMismatch", err)
			}
		})
	}
}

// FuzzCheckFormat: whatever the CLI prints and whatever schema the caller
// sent, the check does not panic, accepts only JSON, calls a text that
// does not parse transient and a parsed one of the wrong shape a server
// error.
func FuzzCheckFormat(f *testing.F) {
	f.Add(`"json"`, "{"+strings.Repeat(" ", 31))
	f.Add(`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, `{"a":1}`)
	f.Add(`{"type":["integer","null"],"items":{"type":"string"}}`, `[1e400, -0, 3.0]`)
	f.Add(`{"type":"array","items":{"type":"array","items":{"type":"number"}}}`, `[[[]],[1]]`)
	f.Fuzz(func(t *testing.T, format, text string) {
		if validFormat("fuzz", "m", json.RawMessage(format)) != nil {
			return
		}
		kind, err := checkFormat(normFormat(json.RawMessage(format)), text)
		valid := json.Valid([]byte(text))
		switch {
		case err == nil && kind != 0:
			t.Fatalf("kind %v without an error", kind)
		case err == nil && normFormat(json.RawMessage(format)) != nil && !valid:
			t.Fatalf("accepted %q, not JSON, for format %s", text, format)
		case err != nil && !errors.Is(err, ErrFormatMismatch):
			t.Fatalf("error %v does not wrap ErrFormatMismatch", err)
		case err != nil && (kind == KindTransient) == valid:
			t.Fatalf("kind %v for %q (valid JSON: %v)", kind, text, valid)
		case err != nil && kind != KindTransient && kind != KindServer:
			t.Fatalf("kind %v", kind)
		}
	})
}
