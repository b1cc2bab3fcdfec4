// Command rerun reads the output of `go test -json` on standard input,
// prints the tests' output as `go test -v` would, and decides whether the
// failures may be run again: only when every failed top-level test carries
// ollamatest.CrashMarker in its own output or its subtests', the line the
// harness logs when a server died of a crash known to be Ollama's own (the
// /api/ps data race of v0.6.5 to v0.32.3). Any other failure, a package
// that failed with no failed test (a panic in TestMain, a timeout, a build
// error) or a failed test without the marker, is not excused.
//
// Usage:
//
//	go test -json ... | go run ./internal/tools/rerun -plan FILE
//
// Exit status: 0 when nothing failed; 3 when every failure may be run
// again, FILE then holding one line per package, "PKG<TAB>^(TestA|TestB)$";
// 1 otherwise. scripts/test-integration.sh runs the plan once.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// verdict is what the stream showed.
type verdict struct {
	// Rerun maps a package to its failed top-level tests, all marked.
	Rerun map[string][]string
	// Unexcused names the failures that are not known crashes.
	Unexcused []string
}

func (v verdict) code() int {
	switch {
	case len(v.Unexcused) > 0:
		return 1
	case len(v.Rerun) > 0:
		return 3
	}
	return 0
}

// plan is the verdict's rerun list, one package a line.
func (v verdict) plan() string {
	var b strings.Builder
	pkgs := make([]string, 0, len(v.Rerun))
	for p := range v.Rerun {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, p := range pkgs {
		names := make([]string, len(v.Rerun[p]))
		for i, n := range v.Rerun[p] {
			names[i] = regexp.QuoteMeta(n)
		}
		fmt.Fprintf(&b, "%s\t^(%s)$\n", p, strings.Join(names, "|"))
	}
	return b.String()
}

// top is the top-level test of a test's name.
func top(test string) string {
	name, _, _ := strings.Cut(test, "/")
	return name
}

// judge copies the stream's output to out and returns its verdict. A line
// that is not an event is copied as it is.
func judge(in io.Reader, out io.Writer) (verdict, error) {
	type key struct{ pkg, test string }
	marked := map[key]bool{}
	failed := map[string][]string{} // package → failed top-level tests, in order
	var failedPkgs []string
	// A test that ran and never ended (its binary panicked in another
	// goroutine, timed out, was killed or exited) has no pass, fail or
	// skip: its package's failure is no known crash, whatever else failed.
	open := map[key]bool{}
	died := map[string]string{} // package → a line of its own output that says it died
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		if e.Output != "" {
			io.WriteString(out, e.Output)
			if strings.Contains(e.Output, ollamatest.CrashMarker) {
				marked[key{e.Package, top(e.Test)}] = true
			}
			// The runtime writes these at the start of a line; a test's
			// own log lines (a server log's tail included) are indented.
			if o := e.Output; strings.HasPrefix(o, "panic:") || strings.HasPrefix(o, "fatal error:") {
				if _, ok := died[e.Package]; !ok {
					died[e.Package] = strings.TrimSpace(o)
				}
			}
		}
		switch e.Action {
		case "run":
			open[key{e.Package, e.Test}] = true
		case "pass", "fail", "skip":
			delete(open, key{e.Package, e.Test})
		}
		switch {
		case e.Action != "fail":
		case e.Test == "":
			failedPkgs = append(failedPkgs, e.Package)
		case !strings.Contains(e.Test, "/"):
			failed[e.Package] = append(failed[e.Package], e.Test)
		}
	}
	if err := sc.Err(); err != nil {
		return verdict{}, err
	}
	v := verdict{Rerun: map[string][]string{}}
	for _, p := range failedPkgs {
		switch {
		case len(failed[p]) == 0:
			v.Unexcused = append(v.Unexcused, p+": failed with no failed test")
		case died[p] != "":
			v.Unexcused = append(v.Unexcused, p+": the test binary died: "+died[p])
		}
	}
	for k := range open {
		v.Unexcused = append(v.Unexcused, k.pkg+": "+k.test+" ran and never ended")
	}
	for p, tests := range failed {
		for _, t := range tests {
			if marked[key{p, t}] {
				v.Rerun[p] = append(v.Rerun[p], t)
			} else {
				v.Unexcused = append(v.Unexcused, p+": "+t)
			}
		}
	}
	slices.Sort(v.Unexcused)
	return v, nil
}

func main() {
	planFile := flag.String("plan", "", "where to write the rerun plan (required)")
	flag.Parse()
	if *planFile == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: go test -json ... | rerun -plan FILE")
		os.Exit(2)
	}
	v, err := judge(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rerun: read the test stream:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*planFile, []byte(v.plan()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "rerun:", err)
		os.Exit(1)
	}
	for _, u := range v.Unexcused {
		fmt.Printf("rerun: failed, not a known server crash: %s\n", u)
	}
	if v.code() == 3 {
		fmt.Printf("rerun: every failure follows a known server crash (%s); they run once more:\n%s", ollamatest.CrashMarker, v.plan())
	}
	os.Exit(v.code())
}
