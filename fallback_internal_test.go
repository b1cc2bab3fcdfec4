package vramguard

import (
	"bytes"
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
