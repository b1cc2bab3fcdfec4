package vramguard_test

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/vramguard/vramguard/vramguardtest"
)

// A count of the runners sees the process table as it was when it began
// (the PIDs are listed first), however long it takes: on a loaded machine a
// scan took up to 134 ms (338 processes, load average 19). The unload was
// judged at the count's end, so a count that began inside the settle window
// and ended after it verified the model while the runner of a load sent
// just before the unload, started during the count, ran (race oracle seed
// 60653702908002: verified at 139 ms, a runner seen from 59 ms on).
//
// The slow scan is real: a fake process whose stat file is a FIFO holds
// the scan until the test writes it, after the runner was added and the
// settle window passed.
func TestUnloadJudgesACountAtItsStart(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Size: 1 << 30})
	var procs *fakeProcs
	var mu sync.Mutex
	var sentAt time.Time // when the unload request's reply came back
	stall, stalled := make(chan string, 1), false
	c := newTestClient(t, s, Options{HTTPClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		unload := isUnload(r)
		resp, err := http.DefaultTransport.RoundTrip(r)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case unload && sentAt.IsZero():
			sentAt = time.Now()
		case r.URL.Path == "/api/ps" && !sentAt.IsZero() && !stalled:
			// The first listing after the request; the count that
			// follows it stalls on this process's stat.
			dir := filepath.Join(procs.root, "50")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Error(err)
			} else if err := syscall.Mkfifo(filepath.Join(dir, "stat"), 0o644); err != nil {
				t.Error(err)
			}
			stall <- filepath.Join(dir, "stat")
			stalled = true
		}
		return resp, err
	})}})
	procs = newFakeProcs(t)
	SetProcRoot(c, procs.root)
	procs.add(100, 1, "ollama", "/usr/bin/ollama", "serve")
	procs.listen(c, 100)
	weights := blobFile(t, c, "tiny")

	done := unloadAsync(t, c, "tiny")
	var fifo string
	select {
	case fifo = <-stall:
	case r := <-done:
		t.Fatalf("the unload ended before its first listing: %+v, %v", r.rep, r.err)
	}
	// A writer's open succeeds once the scan opened the FIFO: its PIDs are
	// listed. Opened without blocking, so that an unload that makes no
	// count fails the test instead of hanging it.
	var w *os.File
	for w == nil {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		switch {
		case err == nil:
			w = f
			continue
		case !errors.Is(err, syscall.ENXIO): // ENXIO: no reader yet
			t.Fatal(err)
		}
		select {
		case r := <-done:
			t.Fatalf("the unload ended without counting the runners: %+v, %v", r.rep, r.err)
		case <-time.After(time.Millisecond):
		}
	}
	defer w.Close() // a failure below still lets the scan go
	opened := time.Now()
	procs.add(101, 100, "ollama", "/usr/bin/ollama", "runner", "--model", weights, "--port", "40000")
	mu.Lock()
	since := opened.Sub(sentAt)
	mu.Unlock()
	time.Sleep(2 * UnloadSettle) // the rest of a slow scan
	// Gone before the write, so that no later scan meets it.
	if err := os.RemoveAll(filepath.Dir(fifo)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("50 (bash) S 1 50 50 0 -1 4194560\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if since >= UnloadSettle {
		<-done
		t.Skipf("the count began %v after the unload request, past the %v settle window: this machine is too busy for the test to make its point", since, UnloadSettle)
	}
	select {
	case r := <-done:
		t.Fatalf("verified by a count that began %v after the unload request (inside the %v settle window) and ended after it, while the runner it could not see runs: %+v, %v", since, UnloadSettle, r.rep, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	r, _ := removeThenVerified(t, procs, 101, done)
	if !r.rep.Verified || !r.rep.RunnerSeen {
		t.Errorf("report %+v; want verified, with the runner seen", r.rep)
	}
}
