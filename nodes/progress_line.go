package nodes

import (
	"fmt"
	"io"
	"strings"
	"sync"
)

// progressCells is the number of cells of a ProgressLine's bar.
const progressCells = 24

// spinnerFrames are drawn when a reply's length is unknown.
const spinnerFrames = `|/-\`

// ProgressLine draws a node's Progress on one terminal line, redrawn in
// place with a carriage return: the stage's name, the pass when there are
// several, a bar and a percentage when the length is known (MaxTokens set)
// or a spinner when not, and the token count:
//
//	refine 2/3 [############------------]  50% 30 tokens
//
// Pass its Update method as a node's Progress callback, and call Clear
// before printing the result. A ProgressLine with Off set draws nothing,
// so that output redirected to a file or pipe stays clean. It is safe for
// concurrent use.
type ProgressLine struct {
	W     io.Writer // where the line is drawn, usually os.Stderr
	Stage string    // the word before the bar: "generate", "refine", ...
	Off   bool      // draw nothing (the writer is not a terminal)

	mu    sync.Mutex
	frame int
	drawn bool
}

// Update draws p; it is a Progress callback.
func (l *ProgressLine) Update(p Progress) {
	if l.Off || l.W == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprint(l.W, "\r"+l.line(p)+"\x1b[K")
	l.drawn = true
}

// Line returns the text Update draws for p, without the terminal controls.
func (l *ProgressLine) Line(p Progress) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.line(p)
}

func (l *ProgressLine) line(p Progress) string {
	var s strings.Builder
	s.WriteString(l.Stage)
	if p.Passes > 1 {
		fmt.Fprintf(&s, " %d/%d", p.Pass, p.Passes)
	}
	if p.Fraction >= 0 {
		f := min(p.Fraction, 1)
		n := int(f * progressCells)
		fmt.Fprintf(&s, " [%s%s] %3.0f%%", strings.Repeat("#", n), strings.Repeat("-", progressCells-n), f*100)
	} else {
		s.WriteByte(' ')
		s.WriteByte(spinnerFrames[l.frame%len(spinnerFrames)])
		l.frame++
	}
	fmt.Fprintf(&s, " %d tokens", p.Tokens)
	return s.String()
}

// Clear erases the line drawn, if any, so that the terminal shows only
// what is printed next.
func (l *ProgressLine) Clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drawn {
		fmt.Fprint(l.W, "\r\x1b[K")
		l.drawn = false
	}
}
