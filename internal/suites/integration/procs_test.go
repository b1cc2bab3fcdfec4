package integration_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/internal/procs"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// seenProc is a process the watcher saw.
type seenProc struct {
	pid, ppid int
	args      []string
}

// watchProcs records, until stop is called, the distinct processes (PID
// and command line) of Ollama's executables (ollama*, llama-server, by
// /proc/<pid>/stat's name) whose command line mentions one of marks: the
// runners and discovery processes of servers, seen as they run. It reads
// /proc every 2 ms: a runner lives at least for its load (250 ms and up),
// a discovery process for tens of milliseconds.
func watchProcs(t *testing.T, marks ...string) (stop func() []seenProc) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen []seenProc
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			ents, _ := os.ReadDir("/proc")
			for _, e := range ents {
				pid, err := strconv.Atoi(e.Name())
				if err != nil {
					continue
				}
				st, err := procs.ReadStat("", pid)
				if err != nil || !procs.MaybeOllama(st.Comm) {
					continue
				}
				p, err := procs.Read("", pid)
				if err != nil || len(p.Args) == 0 {
					continue
				}
				cmd := strings.Join(p.Args, " ")
				if !slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(cmd, m) }) {
					continue
				}
				mu.Lock()
				if !slices.ContainsFunc(seen, func(q seenProc) bool { return q.pid == pid && slices.Equal(q.args, p.Args) }) {
					seen = append(seen, seenProc{pid, st.PPID, p.Args})
				}
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() []seenProc {
		close(done)
		wg.Wait()
		return seen
	}
}

// watchLoads counts the model loads of server s from now until the
// returned function is called: each runner process s starts with --model
// is one load. It is the server's own truth, independent of the library's
// reading of load_duration.
func watchLoads(t *testing.T, s *ollamatest.Server) (stop func() int) {
	stopProcs := watchProcs(t, "--model")
	return func() int {
		n := 0
		for _, p := range stopProcs() {
			if p.ppid == s.PID() && gpu.ClassifyCommand(p.args) == vramguard.RoleOllamaRunner {
				n++
			}
		}
		return n
	}
}

// TestRunnerProcessesClassified takes the command lines of every runner
// and discovery process a real server starts, on each version, and checks
// what the library makes of them: a runner is RoleOllamaRunner and its
// weights blob is the one ModelBlob names; a discovery process is
// RoleOllamaDiscovery; a runner whose server was killed is an orphan.
func TestRunnerProcessesClassified(t *testing.T) {
	for _, v := range ollamatest.Versions() {
		t.Run("ollama-"+v, func(t *testing.T) {
			if os.Getenv(ollamatest.EnvHost) != "" {
				t.Skip("external server: its processes are not visible here")
			}
			// A server of its own, watched from before it starts: discovery
			// runs at start-up.
			bin, _, err := ollamatest.Binary(t.Context(), v, t.Logf)
			if err != nil {
				t.Fatal(err)
			}
			// This version's processes: its ollama binary, or the stand-in
			// in a server folder of the harness.
			stop := watchProcs(t, bin, "/build/lib/ollama/llama-server")
			s := ollamatest.Require(t, v)
			if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
				t.Fatal(err)
			}
			c := newClient(t, s, vramguard.Options{KeepModelsOnClose: true})
			if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
				t.Fatal(err)
			}
			seen := stop()
			blob := blobOf(t, c)

			var runners, discovery int
			for _, p := range seen {
				if p.ppid != s.PID() {
					continue // another server's (tests of other packages may run)
				}
				args := p.args
				role := gpu.ClassifyCommand(args)
				info := procs.Classify(args)
				t.Logf("ollama %s: %s -> %v (%v)", v, strings.Join(args, " "), role, info.Generation)
				switch {
				case role == vramguard.RoleOllamaServer:
					// The server itself (the watcher matches the binary).
				case slices.Contains(args, "--model"):
					runners++
					if role != vramguard.RoleOllamaRunner {
						t.Errorf("%q: role %v, want %v", args, role, vramguard.RoleOllamaRunner)
					}
					if info.Blob != blob {
						t.Errorf("%q: blob %q, want %s's weights %q", args, info.Blob, modelA, blob)
					}
				default:
					discovery++
					if role != vramguard.RoleOllamaDiscovery {
						t.Errorf("%q: role %v, want %v", args, role, vramguard.RoleOllamaDiscovery)
					}
				}
			}
			if runners != 1 {
				t.Errorf("saw %d runner command lines, want one", runners)
			}
			if s.UsesStandin() {
				// The stand-in logs every start: discovery must have run.
				evs, err := s.RunnerEvents()
				if err != nil {
					t.Fatal(err)
				}
				starts := 0
				for _, e := range evs {
					if e.Event == "start" && !slices.Contains(e.Args, "--model") {
						starts++
						if role := gpu.ClassifyCommand(append([]string{"llama-server"}, e.Args...)); role != vramguard.RoleOllamaDiscovery {
							t.Errorf("discovery start %q: role %v", e.Args, role)
						}
					}
				}
				if starts == 0 {
					t.Error("the stand-in logged no discovery start")
				}
			}
			t.Logf("ollama %s: %d runner and %d discovery command lines seen", v, runners, discovery)

			// The runner of a live server is not an orphan.
			rs, err := procs.Runners("")
			if err != nil {
				t.Fatal(err)
			}
			mine := slices.DeleteFunc(rs, func(r procs.Runner) bool { return r.PPID != s.PID() })
			if len(mine) != 1 || mine[0].Orphaned || mine[0].ServerPID != s.PID() {
				t.Fatalf("runners of the live server: %+v", mine)
			}
			runnerPID := mine[0].PID

			// Kill the server alone: where its runner outlives it, the
			// runner is an orphan.
			if err := s.Crash(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			for ctx.Err() == nil {
				rs, err := procs.Runners("")
				if err != nil {
					t.Fatal(err)
				}
				i := slices.IndexFunc(rs, func(r procs.Runner) bool { return r.PID == runnerPID })
				if i < 0 {
					t.Logf("ollama %s: the runner ended with its server", v)
					return
				}
				if rs[i].Orphaned {
					t.Logf("ollama %s: the runner outlived its server and is reported orphaned", v)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Errorf("ollama %s: the runner outlived its server for 5 s and is not reported orphaned", v)
		})
	}
}
