package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// stream writes events as `go test -json` does.
func stream(t *testing.T, evs ...event) string {
	t.Helper()
	var b strings.Builder
	for _, e := range evs {
		j, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

const pkg = "example.com/p"

func out(test, text string) event {
	return event{Action: "output", Package: pkg, Test: test, Output: text + "\n"}
}
func fail(test string) event { return event{Action: "fail", Package: pkg, Test: test} }
func pass(test string) event { return event{Action: "pass", Package: pkg, Test: test} }

var crash = "    main_test.go:1: " + ollamatest.CrashMarker + " ollama 0.17.4: fatal error: concurrent map iteration and map write"

func TestJudge(t *testing.T) {
	cases := []struct {
		name      string
		evs       []event
		code      int
		rerun     []string
		unexcused []string
	}{
		{"all passed", []event{out("TestA", "=== RUN   TestA"), pass("TestA"), pass("")}, 0, nil, nil},
		{"a crash in a subtest's cleanup excuses its top-level test and the subtests after it",
			[]event{
				out("TestNodes/ollama-0.17.4/negative", "requireEmpty: connection refused"),
				fail("TestNodes/ollama-0.17.4/negative"), fail("TestNodes/ollama-0.17.4/dual-stream"),
				out("TestNodes/ollama-0.17.4", crash),
				fail("TestNodes/ollama-0.17.4"), fail("TestNodes"), pass("TestOther"), fail(""),
			}, 3, []string{"TestNodes"}, nil},
		{"a failure without the marker is not excused, beside one with it",
			[]event{out("TestA/x", crash), fail("TestA/x"), fail("TestA"), fail("TestB"), fail("")},
			1, []string{"TestA"}, []string{pkg + ": TestB"}},
		{"the marker of one test does not excuse another",
			[]event{out("TestA", crash), pass("TestA"), fail("TestB"), fail("")},
			1, nil, []string{pkg + ": TestB"}},
		{"a package that failed with no failed test (a panic in TestMain, a timeout)",
			[]event{out("", "panic: boom"), fail("")}, 1, nil, []string{pkg + ": failed with no failed test"}},
		{"a build failure",
			[]event{{Action: "build-output", Output: "p.go:1: syntax error"}, fail("")}, 1, nil, []string{pkg + ": failed with no failed test"}},
		{"a binary that died in another goroutine leaves its running test unended: not excused by an earlier marked failure",
			[]event{{Action: "run", Package: pkg, Test: "TestA"}, out("TestA", crash), fail("TestA"),
				{Action: "run", Package: pkg, Test: "TestB"}, out("", "panic: send on closed channel"), fail("")},
			1, []string{"TestA"}, []string{pkg + ": TestB ran and never ended", pkg + ": the test binary died: panic: send on closed channel"}},
		{"a timeout of the binary, beside a marked failure",
			[]event{out("TestA", crash), fail("TestA"), out("", "panic: test timed out after 40m0s"), fail("")},
			1, []string{"TestA"}, []string{pkg + ": the test binary died: panic: test timed out after 40m0s"}},
		{"a panic of a test itself, attributed to it, is no known crash either",
			[]event{out("TestA", crash), fail("TestA"), {Action: "run", Package: pkg, Test: "TestB"}, out("TestB", "panic: nil map"), fail("TestB"), fail("")},
			1, []string{"TestA"}, []string{pkg + ": TestB", pkg + ": the test binary died: panic: nil map"}},
		{"a server's log logged by a marked test (indented) is not a death of the binary",
			[]event{out("TestA", crash), out("TestA", "        fatal error: concurrent map iteration and map write"), fail("TestA"), fail("")},
			3, []string{"TestA"}, nil},
		{"the crash text alone, as a server's own log would show it, is no marker",
			[]event{out("TestA", "    fatal error: concurrent map iteration and map write"), fail("TestA"), fail("")},
			1, nil, []string{pkg + ": TestA"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var printed strings.Builder
			v, err := judge(strings.NewReader(stream(t, c.evs...)+"not json\n"), &printed)
			if err != nil {
				t.Fatal(err)
			}
			if got := v.code(); got != c.code {
				t.Errorf("code %d, want %d (verdict %+v)", got, c.code, v)
			}
			if !slices.Equal(v.Rerun[pkg], c.rerun) {
				t.Errorf("rerun %v, want %v", v.Rerun[pkg], c.rerun)
			}
			if !slices.Equal(v.Unexcused, c.unexcused) {
				t.Errorf("unexcused %q, want %q", v.Unexcused, c.unexcused)
			}
			for _, e := range c.evs {
				if e.Output != "" && !strings.Contains(printed.String(), e.Output) {
					t.Errorf("output %q not printed", e.Output)
				}
			}
			if !strings.HasSuffix(printed.String(), "not json\n") {
				t.Errorf("a line that is no event was not copied: %q", printed.String())
			}
		})
	}
}

func TestPlan(t *testing.T) {
	v := verdict{Rerun: map[string][]string{"b/q": {"TestX"}, "a/p": {"TestA", "TestB.c"}}}
	want := "a/p\t^(TestA|TestB\\.c)$\nb/q\t^(TestX)$\n"
	if got := v.plan(); got != want {
		t.Errorf("plan %q, want %q", got, want)
	}
}
