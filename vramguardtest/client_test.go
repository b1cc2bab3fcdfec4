package vramguardtest_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// TestDoubleAgreesWithClient (issue #35, item 5): out of the box the fake
// and a client built by NewClient agree: a load with LoadLatency 0 is
// counted as a load (it reported 27 µs, under the 10 ms threshold), the
// client knows its server (it takes leases), and it is closed at cleanup.
func TestDoubleAgreesWithClient(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny"}}})
	t.Cleanup(s.Close)
	var loads int
	c := vramguardtest.NewClient(t, s, vramguard.Options{
		Leases: vramguard.LeaseOptions{Dir: privateDir(t)},
		Hooks: vramguard.Hooks{OnCallEnd: func(_ context.Context, e vramguard.CallEnd) {
			if e.Generation != nil && e.Generation.Loaded {
				loads++
			}
		}},
	})
	for i, wantLoaded := range []bool{true, false} {
		gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
		if err != nil {
			t.Fatal(err)
		}
		if gen.Loaded != wantLoaded || (wantLoaded && gen.Metrics.LoadDuration < vramguardtest.MinLoadDuration) {
			t.Errorf("call %d: Loaded %v (load_duration %v); want %v", i, gen.Loaded, gen.Metrics.LoadDuration, wantLoaded)
		}
	}
	if loads != 1 {
		t.Errorf("%d load hooks; want 1", loads)
	}
	l, err := c.HoldModel(t.Context(), "tiny", time.Minute)
	if err != nil {
		t.Fatalf("HoldModel on NewClient's client: %v; want a lease (the client knows its server)", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

// recTB records what NewClient does with its test.
type recTB struct {
	mu       sync.Mutex
	fatal    string
	cleanups []func()
}

func (r *recTB) Helper()          {}
func (r *recTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recTB) Errorf(format string, a ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprintf(format, a...)
	r.mu.Unlock()
}
func (r *recTB) Fatalf(format string, a ...any) { r.Errorf(format, a...) }
func (r *recTB) failed() string                 { r.mu.Lock(); defer r.mu.Unlock(); return r.fatal }

// TestNewClientRefusal: options vramguard refuses fail the test at once,
// naming why, and register no cleanup.
func TestNewClientRefusal(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{})
	t.Cleanup(s.Close)
	tb := &recTB{}
	if c := vramguardtest.NewClient(tb, s, vramguard.Options{Timeouts: vramguard.Timeouts{Idle: -1}}); c != nil || tb.failed() == "" || len(tb.cleanups) != 0 {
		t.Errorf("NewClient with a negative timeout: client %v, failure %q, %d cleanups; want none, a failure, none", c, tb.failed(), len(tb.cleanups))
	}
}

// TestWaitInFlightSeesShortWindows: a request served in microseconds is
// seen by WaitInFlight, every time (it missed such a window in 6 of 10
// runs when the count was checked only when the waiter woke up).
func TestWaitInFlightSeesShortWindows(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "quick", Chunks: 1}}})
	t.Cleanup(s.Close)
	c := vramguardtest.NewClient(t, s, vramguard.Options{})
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "quick", Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		seen := make(chan error, 1)
		go func() { seen <- s.WaitInFlight(ctx, "quick", 1) }()
		// Let the waiter register and block first.
		time.Sleep(10 * time.Millisecond)
		if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "quick", Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
			t.Fatal(err)
		}
		if err := <-seen; err != nil {
			t.Errorf("run %d: WaitInFlight missed a served request: %v", i, err)
		}
		cancel()
	}
}

// privateDir is a lease directory only this user may enter (vramguard
// refuses one others may read or write).
func privateDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}
