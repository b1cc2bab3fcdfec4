// Package readmecheck holds the tests that the README shows an example
// program as it is: the whole program from its package line, or the part
// between two marker comments.
package readmecheck

import (
	"os"
	"strings"
	"testing"
)

// Program fails t unless readme shows the Go file prog, from its package
// line on, as one ```go block.
func Program(t *testing.T, readme, prog string) {
	t.Helper()
	p, r := read(t, prog), read(t, readme)
	_, body, ok := strings.Cut(p, "package main\n")
	if !ok {
		t.Fatalf("%s: no package line", prog)
	}
	if !strings.Contains(r, "```go\npackage main\n"+body+"```\n") {
		t.Errorf("%s does not show %s as it is (from its package line)", readme, prog)
	}
}

// Part fails t unless readme shows, as one ```go block, the lines of prog
// between the comments "// README: from here" and "// README: to here",
// one tab less.
func Part(t *testing.T, readme, prog string) {
	t.Helper()
	p, r := read(t, prog), read(t, readme)
	_, rest, ok := strings.Cut(p, "\t// README: from here\n")
	part, _, ok2 := strings.Cut(rest, "\t// README: to here\n")
	if !ok || !ok2 {
		t.Fatalf("%s: no README markers", prog)
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(part, "\n") {
		b.WriteString(strings.TrimPrefix(l, "\t"))
	}
	if !strings.Contains(r, "```go\n"+b.String()+"```\n") {
		t.Errorf("%s does not show the marked part of %s as it is:\n%s", readme, prog, b.String())
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
