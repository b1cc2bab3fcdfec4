package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
)

// deadHost is an address where nothing listens.
func deadHost(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func runDouble(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	dead := "http://" + deadHost(t)
	err := run(t.Context(), append([]string{"-host", dead, "-comfyui", dead, "-probe", "200ms"}, args...), &out, &out)
	return out.String(), err
}

// TestRoundsOnTheDouble: on the double, every round loads the LLM once,
// hands over at least what the render needs, renders, and frees ComfyUI
// with a measured receipt; nothing fails for memory.
func TestRoundsOnTheDouble(t *testing.T) {
	out, err := runDouble(t, "-rounds", "3")
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	for _, want := range []string{
		"3 rounds: 3 loads, 0 out-of-memory failures, 0 loads spilled to the CPU, 3 of 3 receipts measured (3 freed)",
		"3      free ", "verified (qwen3:8b unloaded)", "ComfyUI's process 9.8 GiB → 256.0 MiB",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestUsage: bad flags are usage errors, and real servers need a workflow.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"-rounds", "0"}, {"-need", "1152921504606846977"}, {"extra"}, {"-comfyui", "ftp://x"}} {
		if _, err := runDouble(t, args...); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v; want a usage error", args, err)
		}
	}
}

// readmeOutput finds the README's output of this program.
var readmeOutput = regexp.MustCompile("(?s)<!-- output: go run \\./examples/render -->\n```\n(.*?)```\n")

// seconds masks the step times, the one thing that differs by run.
var seconds = regexp.MustCompile(`\d+\.\d\ds`)

// TestREADMEOutput: the README shows what the program prints on the
// double today, times aside.
func TestREADMEOutput(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := readmeOutput.FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md shows no output of go run ./examples/render")
	}
	out, err := runDouble(t)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := seconds.ReplaceAllString(out, "T"), seconds.ReplaceAllString(string(m[1]), "T"); got != want {
		t.Errorf("README.md shows\n%s\nthe program prints\n%s", want, got)
	}
}
