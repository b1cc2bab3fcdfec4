package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptrace"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/ollamatest"
	"github.com/vramguard/vramguard/internal/procs"
	"github.com/vramguard/vramguard/internal/standin"
)

// Issue #13: another program starts loading a model just before or while
// UnloadModel runs. Ollama v0.17.4 to v0.34.4 list nothing in /api/ps while
// a model loads and drop an unload that arrives then, so a check of /api/ps
// alone reports the model gone and it appears a moment later. A verified
// unload must leave it absent, from /api/ps and from the process table.
func TestUnloadSeesOthersLoad(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		// Offsets into the other program's load at which UnloadModel is
		// called: the real runners load tiny-a in about 300 ms.
		offsets := []time.Duration{0, 100 * time.Millisecond}
		if s.UsesStandin() {
			setKnobs(t, s, standin.Knobs{LoadMS: 2000})
			offsets = []time.Duration{0, 200 * time.Millisecond, 1000 * time.Millisecond, 1800 * time.Millisecond}
		}
		c := newClient(t, s, vramguard.Options{})
		blob, err := c.ModelBlob(t.Context(), modelA)
		if err != nil || blob == "" {
			t.Fatalf("ModelBlob(%s) = %q, %v", modelA, blob, err)
		}
		for _, off := range offsets {
			t.Run(fmt.Sprintf("api load, unload at %v", off), func(t *testing.T) {
				// The other program: a raw client, the server's default
				// keep-alive (5 m). Offsets count from the moment its
				// request is on the wire.
				wrote := make(chan struct{})
				ctx := httptrace.WithClientTrace(context.WithoutCancel(t.Context()), &httptrace.ClientTrace{
					WroteRequest: func(httptrace.WroteRequestInfo) { close(wrote) },
				})
				done := make(chan error, 1)
				go func() {
					done <- s.Client().Generate(ctx, &api.GenerateRequest{Model: modelA, Prompt: "x", Options: short(4)},
						func(api.GenerateResponse) error { return nil })
				}()
				t.Cleanup(func() { cleanUp(t, s, c, done, blob) })
				<-wrote
				time.Sleep(off)
				unloadAndWatch(t, s, c, modelA, blob)
			})
		}
		t.Run("ollama run", func(t *testing.T) {
			skipIfExternal(t, s, "needs the server's own CLI")
			bin, _, err := ollamatest.Binary(t.Context(), s.Version(), t.Logf)
			if err != nil {
				t.Fatal(err)
			}
			// `ollama run` has no flag for num_predict, and a model of random
			// weights may never stop: bake a limit into a model that shares
			// tiny-a's weights (and so its runner).
			const short = "tiny-a-short"
			if err := s.Client().Create(t.Context(), &api.CreateRequest{Model: short, From: modelA,
				Parameters: map[string]any{"num_predict": 8, "seed": 7}}, func(api.ProgressResponse) error { return nil }); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "run", short, "--nowordwrap")
			cmd.Stdin = strings.NewReader("a castle at dawn\n")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.Env = append(os.Environ(), "OLLAMA_HOST="+s.URL().Host)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var waitErr error
			exited := make(chan struct{})
			go func() { waitErr = cmd.Wait(); close(exited) }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			// Unload as soon as the CLI's load has a runner.
			deadline := time.Now().Add(20 * time.Second)
			for len(serverRunners(t, s, blob)) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("no runner for %s after 20 s; CLI output: %s", modelA, out.String())
				}
				time.Sleep(2 * time.Millisecond)
			}
			unloadAndWatch(t, s, c, short, blob)
			select {
			case <-exited:
				if waitErr != nil {
					t.Logf("ollama run: %v", waitErr)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("ollama run still runs 20 s after the unload")
			}
		})
	})
}

// unloadAndWatch unloads modelA, requires a verified report, and then
// requires the model to stay absent for 3 s: from /api/ps and, for a server
// this test started, from its runner processes.
func unloadAndWatch(t *testing.T, s *ollamatest.Server, c *vramguard.OllamaClient, model, blob string) {
	t.Helper()
	rep, err := c.UnloadModel(t.Context(), model)
	if err != nil {
		t.Fatalf("UnloadModel: %v", err)
	}
	if !rep.Verified {
		t.Fatalf("UnloadModel returned no error and an unverified report: %+v", rep)
	}
	t.Logf("UnloadModel: %d attempts, %d polls in %v; checked %v, runner seen %v", rep.Attempts, rep.Polls, rep.Elapsed, rep.Checked, rep.RunnerSeen)
	if !s.External() && !rep.Checked.Has(vramguard.CheckRunnerProcesses) {
		t.Errorf("verified on a local server without the process check: checked %v (%s)", rep.Checked, rep.NoRunnerCheck)
	}
	verified := time.Now()
	for time.Since(verified) < 3*time.Second {
		if ms := running(t, s); len(ms) != 0 {
			t.Fatalf("%v after a verified unload (%+v), /api/ps lists %v", time.Since(verified).Round(time.Millisecond), rep, ms)
		}
		if rs := serverRunners(t, s, blob); len(rs) != 0 {
			t.Fatalf("%v after a verified unload (%+v), runner %d serves %s", time.Since(verified).Round(time.Millisecond), rep, rs[0].PID, modelA)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cleanUp waits for the other program's request and leaves nothing
// loaded, so that one case's failure does not spill into the next.
func cleanUp(t *testing.T, s *ollamatest.Server, c *vramguard.OllamaClient, done <-chan error, blob string) {
	if err := <-done; err != nil {
		t.Logf("the other program's request: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.UnloadAll(ctx); err != nil {
		t.Errorf("clean up: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(serverRunners(t, s, blob)) > 0; {
		if time.Now().After(deadline) {
			t.Errorf("clean up: a runner for %s is still there after 10 s", modelA)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverRunners returns the runners of s (not of other packages' servers)
// serving blob; none for an external server, whose processes are not ours
// to see.
func serverRunners(t *testing.T, s *ollamatest.Server, blob string) []procs.Runner {
	t.Helper()
	if s.External() {
		return nil
	}
	rs, err := procs.RunnersFor("", blob)
	if err != nil {
		t.Fatalf("list runners: %v", err)
	}
	var out []procs.Runner
	for _, r := range rs {
		if r.PPID == s.PID() {
			out = append(out, r)
		}
	}
	return out
}
