package ollamatest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// generate runs one generation of 8 tokens and fails the test unless a
// final chunk arrived (the client returns nil for a stream cut short).
func generate(t *testing.T, c *api.Client, model string, keepAlive *api.Duration) api.GenerateResponse {
	t.Helper()
	var final *api.GenerateResponse
	stream := true
	req := &api.GenerateRequest{
		Model:     model,
		Prompt:    "hello",
		Stream:    &stream,
		KeepAlive: keepAlive,
		Options:   map[string]any{"num_predict": 8, "seed": 1},
	}
	err := c.Generate(t.Context(), req, func(r api.GenerateResponse) error {
		if r.Done {
			final = &r
		}
		return nil
	})
	if err != nil {
		t.Fatalf("generate %s: %v", model, err)
	}
	if final == nil {
		t.Fatalf("generate %s: stream ended without done", model)
	}
	if final.EvalCount != 8 || final.DoneReason != "length" {
		t.Errorf("generate %s: %d tokens, done_reason %q; want 8, length", model, final.EvalCount, final.DoneReason)
	}
	return *final
}

func running(t *testing.T, c *api.Client) []string {
	t.Helper()
	ps, err := c.ListRunning(t.Context())
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	var names []string
	for _, m := range ps.Models {
		names = append(names, m.Model)
	}
	return names
}

// waitRunning polls /api/ps until want returns true or two seconds pass.
func waitRunning(t *testing.T, c *api.Client, want func([]string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		names := running(t, c)
		if want(names) || time.Now().After(deadline) {
			return names
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServer(t *testing.T) {
	for _, version := range ollamatest.Versions() {
		t.Run(version, func(t *testing.T) {
			s := ollamatest.Require(t, version)
			tm := s.Timings()
			t.Logf("ollama %s at %s: build %s, start %s", s.Version(), s.URL(), tm.Build.Round(time.Millisecond), tm.Start.Round(time.Millisecond))
			c := s.Client()

			t0 := time.Now()
			if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
				t.Fatal(err)
			}
			t.Logf("registered %s and %s in %s", ollamatest.ModelA, ollamatest.ModelB, time.Since(t0).Round(time.Millisecond))

			// keep_alive 0s: the model is gone from /api/ps once the request ends.
			zero := &api.Duration{Duration: 0}
			for _, m := range []string{ollamatest.ModelA, ollamatest.ModelB} {
				t0 := time.Now()
				r := generate(t, c, m, zero)
				t.Logf("%s: cold generate %s (load %s, eval %s for %d tokens)", m, time.Since(t0).Round(time.Millisecond),
					r.LoadDuration.Round(time.Millisecond), r.EvalDuration.Round(time.Millisecond), r.EvalCount)
				if r.LoadDuration == 0 {
					t.Errorf("%s: load_duration 0 on a cold generate", m)
				}
				if names := waitRunning(t, c, func(n []string) bool { return len(n) == 0 }); len(names) != 0 {
					t.Errorf("after keep_alive 0s: /api/ps lists %v", names)
				}
			}

			// Default keep-alive (5m): the model stays resident.
			generate(t, c, ollamatest.ModelA, nil)
			if names := running(t, c); !slices.Contains(names, ollamatest.ModelA+":latest") {
				t.Fatalf("after default keep-alive: /api/ps lists %v, want %s", names, ollamatest.ModelA)
			}
			t0 = time.Now()
			r := generate(t, c, ollamatest.ModelA, nil)
			t.Logf("%s: warm generate %s (load %s)", ollamatest.ModelA, time.Since(t0).Round(time.Millisecond), r.LoadDuration.Round(time.Millisecond))

			if s.External() {
				t.Log("external server: skipping process checks")
				return
			}
			pids, err := s.RunnerPIDs()
			if err != nil {
				t.Fatal(err)
			}
			if len(pids) != 1 {
				t.Fatalf("runner pids %v, want one", pids)
			}
			t.Logf("runner pid %d (server pid %d)", pids[0], s.PID())

			// A killed runner: /api/ps may still list it; the next request
			// reloads it.
			if err := s.KillRunner(pids[0]); err != nil {
				t.Fatal(err)
			}
			t.Logf("after killing the runner /api/ps lists %v", running(t, c))
			if err := s.KillRunner(s.PID()); err == nil {
				t.Error("KillRunner accepted the server's own pid")
			}
			r = generate(t, c, ollamatest.ModelA, nil)
			t.Logf("after the kill: generate reloaded the model (load %s)", r.LoadDuration.Round(time.Millisecond))
			generate(t, c, ollamatest.ModelB, nil)
			pids, err = s.RunnerPIDs()
			if err != nil {
				t.Fatal(err)
			}
			if len(pids) != 2 {
				t.Errorf("runner pids %v with two models resident, want two", pids)
			}

			t0 = time.Now()
			if err := s.Stop(); err != nil {
				t.Fatal(err)
			}
			t.Logf("stopped in %s", time.Since(t0).Round(time.Millisecond))
			left, err := s.RunnerPIDs()
			if err != nil || len(left) != 0 {
				t.Fatalf("after Stop: runners %v, err %v", left, err)
			}
			for _, pid := range pids {
				if err := s.KillRunner(pid); err == nil {
					t.Errorf("runner %d still killable after Stop", pid)
				}
			}
			if err := c.Heartbeat(t.Context()); err == nil {
				t.Error("server still answers after Stop")
			}
			if err := s.Stop(); err != nil {
				t.Errorf("second Stop: %v", err)
			}
		})
	}
}

func TestPool(t *testing.T) {
	version := ollamatest.Versions()[0]
	p := ollamatest.NewPool(ollamatest.Options{})
	defer p.Close()
	s := p.Require(t, version)
	s2, err := p.Get(t.Context(), version)
	if err != nil || s2 != s {
		t.Fatalf("second Get: %p, %v; want the same server %p", s2, err, s)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !s.External() {
		if err := s.Client().Heartbeat(t.Context()); err == nil {
			t.Error("pool server still answers after Close")
		}
	}
	if _, err := p.Get(t.Context(), version); err == nil {
		t.Error("Get after Close succeeded")
	}
}

func TestStartErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	t.Setenv(ollamatest.EnvHost, "")
	t.Run("missing binary", func(t *testing.T) {
		_, err := ollamatest.Start(t.Context(), ollamatest.Options{Binary: "/nonexistent/ollama"})
		if err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("exits at once", func(t *testing.T) {
		_, err := ollamatest.Start(t.Context(), ollamatest.Options{Binary: "/bin/false"})
		if err == nil || !strings.Contains(err.Error(), "did not start") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("bad version", func(t *testing.T) {
		t.Setenv(ollamatest.EnvBin, "")
		_, err := ollamatest.Start(t.Context(), ollamatest.Options{Version: "../../etc"})
		if err == nil || !strings.Contains(err.Error(), "bad version") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		cause := errors.New("test cancelled")
		cancel(cause)
		// This server never answers HEAD /, so only ctx ends the wait.
		bin := filepath.Join(t.TempDir(), "ollama")
		if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := ollamatest.Start(ctx, ollamatest.Options{Binary: bin})
		if !errors.Is(err, cause) {
			t.Fatalf("err = %v, want %v", err, cause)
		}
	})
}

func TestVersions(t *testing.T) {
	for _, tc := range []struct {
		name, versions, bin string
		want                []string
	}{
		{"default", "", "", []string{"0.6.5", "0.17.4", "0.24.0", "0.34.4"}},
		{"list", " v0.6.5, 0.9.0,", "", []string{"0.6.5", "0.9.0"}},
		{"binary", "", "/x/ollama", []string{ollamatest.CustomVersion}},
		{"binary with list", "0.17.4", "/x/ollama", []string{"0.17.4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(ollamatest.EnvVersions, tc.versions)
			t.Setenv(ollamatest.EnvBin, tc.bin)
			t.Setenv(ollamatest.EnvHost, "")
			if got := ollamatest.Versions(); !slices.Equal(got, tc.want) {
				t.Fatalf("Versions() = %v, want %v", got, tc.want)
			}
		})
	}
}

// Restart stops the server and its runners and starts it again on the same
// address, with its models kept and nothing loaded.
func TestRestart(t *testing.T) {
	s := ollamatest.Require(t, ollamatest.Versions()[0])
	if s.External() {
		t.Skip("an external server is not ours to restart")
	}
	if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	c := s.Client()
	generate(t, c, ollamatest.ModelA, &api.Duration{Duration: time.Hour})
	before, pid := s.URL().String(), s.PID()
	runners, err := s.RunnerPIDs()
	if err != nil || len(runners) != 1 {
		t.Fatalf("runners before the restart: %v, %v; want one", runners, err)
	}
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s.URL().String() != before || s.PID() == pid || s.PID() == 0 {
		t.Fatalf("after the restart: %s pid %d, before: %s pid %d; want the same address, another process", s.URL(), s.PID(), before, pid)
	}
	if ms := running(t, c); len(ms) != 0 {
		t.Errorf("/api/ps after the restart: %v, want nothing", ms)
	}
	for _, r := range runners {
		if _, err := os.Stat(filepath.Join("/proc", fmt.Sprint(r))); err == nil {
			t.Errorf("runner %d of the old process still alive", r)
		}
	}
	generate(t, c, ollamatest.ModelA, &api.Duration{Duration: 0})
}
