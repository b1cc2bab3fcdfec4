package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Issue #26: two programs share one Ollama server. Program A (the test
// binary started again) runs a phase on a model; program B (the test) runs
// its own client on the same server and lease directory. A's phase lease
// keeps B's cleanups and unloads off the model until A ends the phase, and
// dies with A when A is killed; B's room-making refuses, or waits, while
// the lease lasts.
func TestLeasesAcrossProcesses(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		// t.TempDir is 0755, which the library refuses: the lease
		// directory must not exist yet, so that it is made 0700.
		dir := filepath.Join(t.TempDir(), "leases")
		b := newClient(t, s, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})

		t.Run("held, then ended", func(t *testing.T) {
			requireEmpty(t, s, "before the holder")
			a := startLeaseHolder(t, s, dir)

			// B's guarded call: its cleanup leaves the leased model, no failure.
			g := vramguard.Guard{Client: b}
			if _, err := g.Generate(t.Context(), req(modelA, 4), nil); err != nil {
				t.Fatalf("B's guarded generation while A holds %s: %v", modelA, err)
			}
			if !leaseListed(t, b, modelA) {
				t.Fatalf("B's guard unloaded %s, which A's phase leases", modelA)
			}
			// B's explicit unload is refused, naming A.
			rep, err := b.UnloadModel(t.Context(), modelA)
			mustKind(t, err, vramguard.KindRefused)
			var le *vramguard.LeasedError
			if !errors.As(err, &le) || len(le.Leases) == 0 {
				t.Fatalf("UnloadModel while A holds it: %v, want a *LeasedError", err)
			}
			a.isHolder(t, le.Leases[0])
			if rep == nil || rep.Attempts != 0 || !leaseListed(t, b, modelA) {
				t.Fatalf("refused UnloadModel: report %+v, listed %v; want nothing sent, model listed", rep, running(t, s))
			}

			// A's next step reuses the model B left.
			a.send(t, "step")
			if l := a.expect(t, "step"); l != "step loaded=false" {
				t.Fatalf("A's second step: %q, want a reuse (loaded=false)", l)
			}
			a.send(t, "end")
			if l := a.expect(t, "ended"); l != "ended verified=true" {
				t.Fatalf("A's phase end: %q, want verified=true", l)
			}
			if err := a.wait(); err != nil {
				t.Fatalf("A after its phase ended: %v", err)
			}
			if leaseListed(t, b, modelA) {
				t.Fatalf("after A's verified end /api/ps lists %v", running(t, s))
			}
		})

		t.Run("holder killed", func(t *testing.T) {
			requireEmpty(t, s, "before the holder")
			a := startLeaseHolder(t, s, dir)
			if _, err := b.UnloadModel(t.Context(), modelA); !errors.Is(err, vramguard.ErrLeased) {
				t.Fatalf("UnloadModel while A holds it: %v, want ErrLeased", err)
			}
			// SIGKILL mid-phase: A cleans nothing up, its runner stays in
			// Ollama with the phase's keep-alive, and its lease ends with it.
			if err := a.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = a.wait() // "signal: killed"
			if !leaseListed(t, b, modelA) {
				t.Fatalf("%s went with A; want it left in Ollama", modelA)
			}
			// B's first unload after the kill goes through: no lease left.
			rep, err := b.UnloadModel(t.Context(), modelA)
			if err != nil || rep == nil || !rep.Verified || !rep.WasLoaded || len(rep.Leased) != 0 {
				t.Fatalf("UnloadModel after A was killed: %+v, %v; want verified, no lease", rep, err)
			}
			if leaseListed(t, b, modelA) {
				t.Fatalf("after the verified unload /api/ps lists %v", running(t, s))
			}
		})

		t.Run("room-making", func(t *testing.T) {
			requireEmpty(t, s, "before the holder")
			const poll = 20 * time.Millisecond
			a := startLeaseHolder(t, s, dir)
			// A fake device that follows /api/ps (a CPU server lists
			// size_vram 0: the fake counts the model's size), with 1 MiB
			// free beside A's model: the room for the model's size can be
			// made only by unloading it.
			ps, err := s.Client().ListRunning(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var size uint64
			for _, m := range ps.Models {
				if vramguard.NormalizeModelName(m.Model) == vramguard.NormalizeModelName(modelA) {
					size = uint64(m.Size)
				}
			}
			if size <= 8<<10 {
				t.Fatalf("%s lists %d bytes; the test needs more than 8 KiB", modelA, size)
			}
			vr := &signalledReader{r: &vramguardtest.PSGPU{Client: s.Client(), Total: size + 4<<10}, snaps: make(chan struct{}, 64)}
			e := newClient(t, s, vramguard.Options{VRAM: vr, Leases: vramguard.LeaseOptions{Dir: dir}})

			rep, err := e.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: size, PollInterval: poll, Timeout: 5 * poll})
			mustKind(t, err, vramguard.KindOutOfMemory)
			var re *vramguard.RoomError
			if !errors.Is(err, vramguard.ErrLeased) || !errors.As(err, &re) {
				t.Fatalf("EnsureFree while A holds %s: %v, want ErrLeased and a *RoomError", modelA, err)
			}
			if len(re.Kept) != 1 || vramguard.NormalizeModelName(re.Kept[0].Model) != vramguard.NormalizeModelName(modelA) ||
				len(re.Kept[0].Leases) == 0 || re.RetryAfter != 0 {
				t.Fatalf("RoomError %+v: want %s kept by A's lease, no retry time (a phase's lease has no end)", re, modelA)
			}
			a.isHolder(t, re.Kept[0].Leases[0])
			if rep == nil || len(rep.Evicted) != 0 || !leaseListed(t, b, modelA) {
				t.Fatalf("refused EnsureFree: report %+v, listed %v; want nothing unloaded", rep, running(t, s))
			}

			// The same with WaitForLeases: it waits, polling, until A's
			// phase ends (its End unloads the model, verified), then finds
			// the room and returns.
			for len(vr.snaps) > 0 {
				<-vr.snaps
			}
			type result struct {
				rep *vramguard.EnsureReport
				err error
				at  time.Time
			}
			// The call must return once the lease ended, not at ctx's end
			// nor at its Timeout's (both long).
			ctx, cancel := context.WithTimeout(t.Context(), leaseHangGuard)
			defer cancel()
			done := make(chan result, 1)
			go func() {
				rep, err := e.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: size, PollInterval: poll,
					Timeout: leaseHangGuard, WaitForLeases: true})
				done <- result{rep, err, time.Now()}
			}()
			var res result
			joined := false
			join := func() result {
				if !joined {
					res, joined = <-done, true
				}
				return res
			}
			t.Cleanup(func() { cancel(); join() })
			// Two snapshots: EnsureFree's first reading, and one taken
			// after a round of waiting for the lease.
			for range 2 {
				select {
				case <-vr.snaps:
				case r := <-done:
					res, joined = r, true
					t.Fatalf("EnsureFree with WaitForLeases returned while A holds %s: %+v, %v", modelA, r.rep, r.err)
				case <-time.After(leaseHangGuard):
					t.Fatal("EnsureFree with WaitForLeases takes no snapshot")
				}
			}
			a.send(t, "end")
			if l := a.expect(t, "ended"); l != "ended verified=true" {
				t.Fatalf("A's phase end: %q, want verified=true", l)
			}
			ended := time.Now()
			r := join()
			if r.err != nil {
				t.Fatalf("EnsureFree after the lease ended: %v; want the room, made by A's own unload", r.err)
			}
			// From A's "ended" (lease released, then model unloaded) to the
			// return: a few polls and a margin.
			if bound := 10*poll + time.Second; r.at.Sub(ended) > bound {
				t.Errorf("EnsureFree returned %v after A's phase ended, want under %v", r.at.Sub(ended), bound)
			}
			if len(r.rep.Kept) != 0 || r.rep.FreeAfter < size {
				t.Fatalf("EnsureFree after the lease ended: report %+v, want nothing kept and the room free", r.rep)
			}
			t.Logf("EnsureFree returned %v after A's \"ended\" (%d unloads of its own)", r.at.Sub(ended).Round(time.Millisecond), len(r.rep.Evicted))
			for _, u := range r.rep.Evicted {
				if !u.Verified || len(u.Leased) != 0 {
					t.Errorf("EnsureFree's unload of %s: %+v, want verified, no lease", u.Model, u)
				}
			}
			if err := a.wait(); err != nil {
				t.Fatalf("A after its phase ended: %v", err)
			}
			if leaseListed(t, b, modelA) {
				t.Fatalf("after A's end /api/ps lists %v", running(t, s))
			}
		})
	})
}

// leaseHolderEnv starts the test binary as program A of
// TestLeasesAcrossProcesses: "<server URL> <lease dir> <model>".
const leaseHolderEnv = "VRAMGUARD_IT_LEASE_HOLDER"

// leaseHolderPhase is the name of A's phase, which its lease's note carries.
const leaseHolderPhase = "holder"

// leaseHangGuard bounds each wait for program A, only so that a hang fails
// the test instead of running into go test's timeout: it is no measure of
// speed (a load of the tiny models takes well under a second).
const leaseHangGuard = 2 * time.Minute

// leaseHolder is program A, seen from the test.
type leaseHolder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // A's stdout, line by line; closed at its end
	stderr bytes.Buffer

	once    sync.Once
	waitErr error
}

// startLeaseHolder starts program A on s with lease directory dir, and
// waits for its phase to have loaded modelA. A is killed, if still
// running, at the end of the test.
func startLeaseHolder(t *testing.T, s *ollamatest.Server, dir string) *leaseHolder {
	t.Helper()
	h := &leaseHolder{lines: make(chan string, 16)}
	h.cmd = exec.Command(os.Args[0], "-test.run", "^$")
	h.cmd.Env = append(os.Environ(), leaseHolderEnv+"="+s.URL().String()+" "+dir+" "+modelA)
	h.cmd.Stderr = &h.stderr
	var err error
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // joined by wait, which drains lines
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = h.cmd.Process.Kill() // fails harmlessly once A has exited
		err := h.wait()
		if t.Failed() {
			t.Logf("program A (pid %d): %v; stderr:\n%s", h.cmd.Process.Pid, err, h.stderr.String())
		}
	})
	if l := h.expect(t, "ready"); l != "ready loaded=true" {
		t.Fatalf("A's first step: %q, want a load (loaded=true)", l)
	}
	return h
}

// send writes one command to A.
func (h *leaseHolder) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.stdin, cmd); err != nil {
		t.Fatalf("to A: %v", err)
	}
}

// expect reads A's next line, which must begin with prefix.
func (h *leaseHolder) expect(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			t.Fatalf("A ended before %q: %v\n%s", prefix, h.wait(), h.stderr.String())
		}
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("A says %q, want %q", l, prefix)
		}
		return l
	case <-time.After(leaseHangGuard):
		t.Fatalf("A says nothing in %v, want %q", leaseHangGuard, prefix)
	}
	return ""
}

// wait closes A's stdin, reads the rest of its stdout and waits for it to
// exit. It is idempotent.
func (h *leaseHolder) wait() error {
	h.once.Do(func() {
		_ = h.stdin.Close()
		for range h.lines {
		}
		h.waitErr = h.cmd.Wait()
	})
	return h.waitErr
}

// isHolder checks that l is A's phase lease.
func (h *leaseHolder) isHolder(t *testing.T, l vramguard.LeaseInfo) {
	t.Helper()
	if l.PID != h.cmd.Process.Pid || l.Program != filepath.Base(os.Args[0]) ||
		!strings.Contains(l.Note, leaseHolderPhase) || !l.Until.IsZero() ||
		vramguard.NormalizeModelName(l.Model) != vramguard.NormalizeModelName(modelA) {
		t.Fatalf("lease %+v: want A's (pid %d, program %s), its phase %q's on %s, with no end",
			l, h.cmd.Process.Pid, filepath.Base(os.Args[0]), leaseHolderPhase, modelA)
	}
}

// leaseHolderMain is program A: a client on the server with the lease
// directory, a phase that loads the model, then a step per "step" line on
// stdin, and phase.End at "end". It exits 0 after "end", 1 on an error or
// when stdin closes first (the test is gone).
func leaseHolderMain(spec string) {
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	f := strings.Fields(spec)
	if len(f) != 3 {
		fail(fmt.Errorf("%s=%q: want \"<server URL> <lease dir> <model>\"", leaseHolderEnv, spec))
	}
	ctx := context.Background()
	c, err := vramguard.NewClient(vramguard.Options{Host: f[0], Leases: vramguard.LeaseOptions{Dir: f[1]}})
	if err != nil {
		fail(err)
	}
	p, err := c.StartPhase(ctx, leaseHolderPhase, vramguard.PhaseOptions{})
	if err != nil {
		fail(err)
	}
	g := p.Guard()
	step := func() bool {
		gen, err := g.Generate(ctx, req(f[2], 4), nil)
		if err != nil {
			fail(err)
		}
		return gen.Loaded
	}
	fmt.Printf("ready loaded=%t\n", step())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "step":
			fmt.Printf("step loaded=%t\n", step())
		case "end":
			rep, err := p.End(ctx)
			verified := err == nil && rep != nil && rep.Cleanup != nil && len(rep.Cleanup.Unloads) > 0 &&
				!slices.ContainsFunc(rep.Cleanup.Unloads, func(u vramguard.UnloadReport) bool { return !u.Verified })
			if err != nil {
				fmt.Fprintln(os.Stderr, "phase end:", err)
			}
			fmt.Printf("ended verified=%t\n", verified)
			if err := c.Close(); err != nil {
				fail(err)
			}
			os.Exit(0)
		default:
			fail(fmt.Errorf("unknown command %q", sc.Text()))
		}
	}
	_, _ = p.End(ctx)
	_ = c.Close()
	fail(errors.New("stdin closed before \"end\""))
}

// leaseListed reports whether /api/ps, read through c, lists model.
func leaseListed(t *testing.T, c *vramguard.OllamaClient, model string) bool {
	t.Helper()
	ms, err := c.Running(t.Context())
	if err != nil {
		t.Fatalf("/api/ps: %v", err)
	}
	return slices.ContainsFunc(ms, func(m api.ProcessModelResponse) bool {
		return vramguard.NormalizeModelName(m.Model) == vramguard.NormalizeModelName(model)
	})
}

// signalledReader is r, signalling each snapshot on snaps (dropped when
// full).
type signalledReader struct {
	r     vramguard.VRAMReader
	snaps chan struct{}
}

var _ vramguard.VRAMReader = (*signalledReader)(nil)

func (r *signalledReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	select {
	case r.snaps <- struct{}{}:
	default:
	}
	return r.r.Snapshot(ctx)
}
