package main

// The progress line, as in examples/refine, for a node's single pass.

import (
	"fmt"
	"io"
	"strings"

	"github.com/vramguard/vramguard/nodes"
)

// barWidth is the number of cells of the percentage bar.
const barWidth = 24

// spinner are the frames drawn when the reply's length is unknown.
const spinner = `|/-\`

// progressBar draws nodes.Progress on one terminal line, redrawn in place
// with a carriage return. When on is false it draws nothing, so that
// stderr redirected to a file or pipe stays clean. It is used from the
// goroutine that runs the node only.
type progressBar struct {
	w     io.Writer
	on    bool
	stage string // the word before the bar

	frame int
	drawn bool
}

// update is a nodes Progress callback.
func (b *progressBar) update(p nodes.Progress) {
	if !b.on {
		return
	}
	fmt.Fprint(b.w, "\r"+b.line(p)+"\x1b[K")
	b.drawn = true
}

// line renders p: a bar and a percentage when p.Fraction is known, a
// spinner otherwise; then the token count.
func (b *progressBar) line(p nodes.Progress) string {
	var s strings.Builder
	s.WriteString(b.stage)
	if p.Fraction >= 0 {
		f := min(p.Fraction, 1)
		n := int(f * barWidth)
		fmt.Fprintf(&s, " [%s%s] %3.0f%%", strings.Repeat("#", n), strings.Repeat("-", barWidth-n), f*100)
	} else {
		s.WriteByte(' ')
		s.WriteByte(spinner[b.frame%len(spinner)])
		b.frame++
	}
	fmt.Fprintf(&s, " %d tokens", p.Tokens)
	return s.String()
}

// clear erases the line drawn, if any, so that the terminal shows only
// the result (and any error) once the program ends.
func (b *progressBar) clear() {
	if b.drawn {
		fmt.Fprint(b.w, "\r\x1b[K")
		b.drawn = false
	}
}
