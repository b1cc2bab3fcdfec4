package integration_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/ollamatest"
	"github.com/vramguard/vramguard/internal/procs"
)

// watchProcs records, until stop is called, the distinct command lines of
// the processes whose executable is one of exes (by base name) and whose
// command line mentions one of marks: the runners and discovery processes
// of a server starting up, seen as they run. It reads /proc every
// millisecond; discovery processes live for tens of milliseconds.
func watchProcs(t *testing.T, exes []string, marks []string) (stop func() [][]string) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen [][]string
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			ents, _ := os.ReadDir("/proc")
			for _, e := range ents {
				p, err := procs.Read("", atoi(e.Name()))
				if err != nil || len(p.Args) == 0 || !slices.Contains(exes, filepath.Base(p.Args[0])) {
					continue
				}
				cmd := strings.Join(p.Args, " ")
				if !slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(cmd, m) }) {
					continue
				}
				mu.Lock()
				if !slices.ContainsFunc(seen, func(a []string) bool { return slices.Equal(a, p.Args) }) {
					seen = append(seen, p.Args)
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
	return func() [][]string {
		close(done)
		wg.Wait()
		return seen
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
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
			stop := watchProcs(t, []string{filepath.Base(bin), "llama-server"},
				[]string{"runner", "--list-devices", "--port", "--model"})
			s := ollamatest.Require(t, v)
			if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
				t.Fatal(err)
			}
			c := newClient(t, s, vramguard.Options{KeepModelsOnClose: true})
			if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
				t.Fatal(err)
			}
			seen := stop()
			blob, err := c.ModelBlob(t.Context(), modelA)
			if err != nil || blob == "" {
				t.Fatalf("ModelBlob(%s) = %q, %v", modelA, blob, err)
			}

			var runners, discovery int
			for _, args := range seen {
				role := vramguard.ClassifyCommand(args)
				info := procs.Classify(args)
				t.Logf("ollama %s: %s -> %v (%v)", v, strings.Join(args, " "), role, info.Generation)
				switch {
				case slices.Contains(args, "serve"):
					t.Errorf("the watcher caught the server itself: %q", args)
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
						if role := vramguard.ClassifyCommand(append([]string{"llama-server"}, e.Args...)); role != vramguard.RoleOllamaDiscovery {
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
