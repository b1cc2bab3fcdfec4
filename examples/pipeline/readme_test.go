package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeOutput finds the README's program outputs: a fenced block after a
// line "<!-- output: go run ./examples/pipeline ARGS -->".
var readmeOutput = regexp.MustCompile("(?s)<!-- output: go run \\./examples/pipeline([^>]*?) -->\n```\n(.*?)```\n")

// times masks the timeline's seconds, the one thing that differs by run.
var times = regexp.MustCompile(`(?m)^ *\d+\.\d\ds`)

func masked(s string) string { return times.ReplaceAllString(s, "T") }

// table is the timeline of a pipeline run: from its header to the blank
// line after it.
func table(out string) string {
	i := strings.Index(out, "TIME ")
	if i < 0 {
		return ""
	}
	out = out[i:]
	if j := strings.Index(out, "\n\n"); j >= 0 {
		out = out[:j+1]
	}
	return out
}

// TestREADMEOutput: every pipeline output the README shows is what the
// program prints today, on the simulator, timings aside. It fails when the
// program's output changes and the README does not.
func TestREADMEOutput(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeOutput.FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 2 {
		t.Fatalf("%d pipeline outputs in README.md, want the naive and the phase run", len(blocks))
	}
	for _, b := range blocks {
		args := strings.Fields(b[1])
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var stdout bytes.Buffer
			_ = run(t.Context(), append([]string{"-host", deadHost(t), "-probe", "200ms", "-out", filepath.Join(t.TempDir(), "p.svg")}, args...), &stdout, &stdout)
			got, want := masked(table(stdout.String())), masked(b[2])
			if got != want {
				t.Errorf("README.md shows\n%s\nthe program prints\n%s", want, got)
			}
		})
	}
}
