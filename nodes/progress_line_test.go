package nodes_test

import (
	"strings"
	"testing"

	"github.com/vramguard/vramguard/nodes"
)

func TestProgressLine(t *testing.T) {
	tests := []struct {
		name string
		p    nodes.Progress
		want string
	}{
		{name: "start", p: nodes.Progress{Pass: 1, Passes: 1, Fraction: 0}, want: "refine [------------------------]   0% 0 tokens"},
		{name: "half of two passes", p: nodes.Progress{Pass: 2, Passes: 2, Tokens: 30, Fraction: 0.5}, want: "refine 2/2 [############------------]  50% 30 tokens"},
		{name: "over one", p: nodes.Progress{Pass: 1, Passes: 1, Tokens: 9, Fraction: 1.5}, want: "refine [########################] 100% 9 tokens"},
		{name: "unknown length", p: nodes.Progress{Pass: 1, Passes: 3, Tokens: 7, Fraction: -1}, want: "refine 1/3 | 7 tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &nodes.ProgressLine{Stage: "refine"}
			if got := l.Line(tt.p); got != tt.want {
				t.Errorf("Line = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestProgressLineDrawsAndClears(t *testing.T) {
	var out strings.Builder
	l := &nodes.ProgressLine{W: &out, Stage: "caption"}
	l.Clear() // nothing drawn: nothing to erase
	if out.Len() != 0 {
		t.Fatalf("Clear before any Update wrote %q", out.String())
	}
	l.Update(nodes.Progress{Pass: 1, Passes: 1, Tokens: 1, Fraction: -1})
	l.Update(nodes.Progress{Pass: 1, Passes: 1, Tokens: 2, Fraction: -1})
	l.Clear()
	want := "\rcaption | 1 tokens\x1b[K\rcaption / 2 tokens\x1b[K\r\x1b[K"
	if out.String() != want {
		t.Errorf("drawn %q, want %q", out.String(), want)
	}
	var off strings.Builder
	o := &nodes.ProgressLine{W: &off, Stage: "x", Off: true}
	o.Update(nodes.Progress{Fraction: 0.5})
	o.Clear()
	if off.Len() != 0 {
		t.Errorf("an Off line drew %q", off.String())
	}
}
