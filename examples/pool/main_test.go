package main

import (
	"os"
	"strings"
	"testing"
)

// TestPoolInREADME: the README's pool snippet is this program's middle
// part, as it is (one tab less).
func TestPoolInREADME(t *testing.T) {
	prog, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(prog), "\t// README: from here\n")
	part, _, ok2 := strings.Cut(rest, "\t// README: to here\n")
	if !ok || !ok2 {
		t.Fatal("no README markers in main.go")
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(part, "\n") {
		b.WriteString(strings.TrimPrefix(l, "\t"))
	}
	if !strings.Contains(string(readme), "```go\n"+b.String()+"```\n") {
		t.Errorf("README.md does not show examples/pool/main.go's middle part as it is:\n%s", b.String())
	}
}
