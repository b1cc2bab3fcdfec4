package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/readmecheck"
	"github.com/vramguard/vramguard/vramguardtest"
)

// TestQuickstart builds the program and runs it against the test double:
// it prints the reply, exits 0 and leaves the model unloaded; the unload
// request is in the server's log.
func TestQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program")
	}
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30,
		Respond: func(string) []vramguardtest.Chunk {
			return []vramguardtest.Chunk{{Text: "a lighthouse "}, {Text: "at dusk"}}
		}}}})
	defer s.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "OLLAMA_HOST="+s.URL().String())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("quickstart: %v\n%s", err, stderr.String())
	}
	if got := stdout.String(); got != "a lighthouse at dusk\n" {
		t.Errorf("stdout %q", got)
	}
	if s.Listed("llama3.2") || s.Loads("llama3.2") != 1 {
		t.Errorf("listed %v after %d loads; want unloaded after one", s.Listed("llama3.2"), s.Loads("llama3.2"))
	}
	var unloads int
	for _, ev := range s.Events("llama3.2") {
		if ev.Kind == vramguardtest.EventUnloadRequest {
			unloads++
		}
	}
	if unloads == 0 {
		t.Error("no unload request reached the server")
	}
}

// TestQuickstartInREADME: the README shows this program as it is.
func TestQuickstartInREADME(t *testing.T) { readmecheck.Program(t, "../../README.md", "main.go") }
