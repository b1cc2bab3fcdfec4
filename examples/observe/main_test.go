package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/testkit/readmecheck"
	"github.com/vramguard/vramguard/vramguardtest"
)

// build builds the program once per test.
func build(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the program")
	}
	bin := filepath.Join(t.TempDir(), "observe")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func fake(t *testing.T) *vramguardtest.Server {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30,
		LoadLatency: 20 * time.Millisecond,
		Respond: func(string) []vramguardtest.Chunk {
			return []vramguardtest.Chunk{{Text: "a castle "}, {Text: "at dawn"}}
		}}}})
	t.Cleanup(s.Close)
	return s
}

// TestObserve runs the program against the test double: it prints the
// reply, prints the call's, the load's and the unload's spans as they end,
// and leaves the model unloaded.
func TestObserve(t *testing.T) {
	bin := build(t)
	s := fake(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "OLLAMA_HOST="+s.URL().String())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("observe: %v\n%s", err, stderr.String())
	}
	if got := stdout.String(); got != "a castle at dawn\n" {
		t.Errorf("stdout %q", got)
	}
	for _, span := range []string{`span "load llama3.2"`, `span "text_completion llama3.2"`, `span "unload llama3.2"`} {
		if !strings.Contains(stderr.String(), span) {
			t.Errorf("stderr %q: no %s", stderr.String(), span)
		}
	}
	if s.Listed("llama3.2") {
		t.Error("the model is still listed")
	}
}

// With -listen it serves /metrics with the generation's load and verified
// unload counted, and exits 0 on SIGTERM.
func TestObserveListen(t *testing.T) {
	bin := build(t)
	s := fake(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "-listen", addr)
	cmd.Env = append(os.Environ(), "OLLAMA_HOST="+s.URL().String())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	var body string
	for body == "" {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("observe exited before serving: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(context.Cause(t.Context()))
		}
	}
	for _, series := range []string{`vramguard_model_loads_total{model="llama3.2:latest",reload_cause="none"`, `vramguard_model_unloads_total{cause="guard",model="llama3.2:latest",outcome="verified"`} {
		if !strings.Contains(body, series) {
			t.Errorf("/metrics has no %s", series)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Errorf("after SIGTERM: %v\n%s", err, stderr.String())
	}
	exited <- nil // for the deferred wait
}

// TestObserveInREADME: the README shows this program as it is.
func TestObserveInREADME(t *testing.T) { readmecheck.Program(t, "../../README.md", "main.go") }
