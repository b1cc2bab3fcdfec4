package vramguard_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// The contracts of OllamaClient.Admit: a load that a request this client
// does not send (a proxy's) would cause goes through the door of the
// client's own generations (Options.Budget), and the model counts as in
// use while run runs.

// forward is run's request, sent as a proxy would: straight to the server,
// not through the client.
func forward(s *vramguardtest.Server, model string) func(context.Context, vramguard.AdmissionEvent, func()) error {
	return func(ctx context.Context, _ vramguard.AdmissionEvent, landed func()) error {
		defer landed()
		return s.APIClient().Generate(ctx, &api.GenerateRequest{Model: model, Prompt: "x", KeepAlive: &api.Duration{Duration: -1}},
			func(api.GenerateResponse) error { return nil })
	}
}

// A forwarded load that would leave less than the headroom free first
// unloads, verified, the fewest bytes of Ollama's models (the budget's
// room-making), and run is told what was done.
func TestAdmitMakesRoomForAForwardedLoad(t *testing.T) {
	const headroom = 4 * gib
	s, c, est := budgetSim(t, vramguard.Budget{Headroom: headroom, MakeRoom: true})
	if f := free(t, s); f >= uint64(est.Total)+headroom {
		t.Fatalf("%d bytes free already: the test needs a device short of room", f)
	}
	var got vramguard.AdmissionEvent
	err := c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{}, func(ctx context.Context, ev vramguard.AdmissionEvent, landed func()) error {
		got = ev
		return forward(s, "small")(ctx, ev, landed)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Listed("small") || s.Listed("mid") || !s.Listed("big") {
		t.Errorf("resident %v; want small loaded, mid (the fewest bytes) unloaded, big kept", s.Running())
	}
	if !got.Load || !got.MadeRoom || got.Need != uint64(est.Total) || len(got.Evicted) != 1 || vramguard.NormalizeModelName(got.Evicted[0].Model) != vramguard.NormalizeModelName("mid") || !got.Evicted[0].Verified {
		t.Errorf("run told %+v; want a load, its estimate, and mid's verified unload", got)
	}
}

// A load the budget refuses is an *Error of KindOutOfMemory wrapping the
// *RoomError; run is not called and nothing reaches the server.
func TestAdmitRefusesBeforeRun(t *testing.T) {
	s, c, est := budgetSim(t, vramguard.Budget{MaxBytes: 15 * gib})
	ran := false
	err := c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{}, func(context.Context, vramguard.AdmissionEvent, func()) error {
		ran = true
		return nil
	})
	var re *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrOverBudget) || !errors.As(err, &re) || re.Need != uint64(est.Total) {
		t.Fatalf("Admit = %v; want KindOutOfMemory wrapping the budget's *RoomError for the estimate", err)
	}
	if ran || s.Requests("small") != 0 {
		t.Errorf("run called %v, %d requests for small; want neither", ran, s.Requests("small"))
	}
}

// A model the server lists is no load: run is called with Load false and
// nothing is checked (the budget would refuse a load).
func TestAdmitListedModelIsNoLoad(t *testing.T) {
	s, c, _ := budgetSim(t, vramguard.Budget{MaxBytes: 1})
	var got *vramguard.AdmissionEvent
	err := c.Admit(t.Context(), "big", nil, vramguard.ReserveOptions{}, func(_ context.Context, ev vramguard.AdmissionEvent, landed func()) error {
		got = &ev
		landed()
		return nil
	})
	if err != nil || got == nil || got.Load {
		t.Fatalf("Admit of a listed model = %v, run told %+v; want run called with Load false", err, got)
	}
	if s.Loads("big") != 1 {
		t.Errorf("big loaded %d times", s.Loads("big"))
	}
}

// slotSim has big (8 GiB) and mid (6 GiB) loaded by another program and a
// client with Budget.MaxLoaded 2 and no VRAM reader (the memory checks
// off): a slot needs an unload.
func slotSim(t *testing.T, opts vramguard.Options) (*vramguardtest.Server, *vramguard.OllamaClient) {
	t.Helper()
	s := threeModelSim(t, vramguardtest.Config{})
	loadForever(t, s, "big", "mid")
	if opts.Budget == nil {
		opts.Budget = &vramguard.Budget{MaxLoaded: 2, OffWithoutGPU: true}
	}
	c, _ := countedClient(t, s, opts)
	return s, c
}

// MaxLoaded unloads the model the victim policy takes first (the fewest
// bytes to load again: mid), without a VRAM reader; a test that changes
// nothing but which model is least worth keeping (mid protected) sees big
// go instead.
func TestAdmitMaxLoadedFollowsTheVictimPolicy(t *testing.T) {
	for _, tc := range []struct {
		protected []string
		gone      string
	}{{nil, "mid"}, {[]string{"mid"}, "big"}} {
		s, c := slotSim(t, vramguard.Options{Protected: tc.protected})
		var got vramguard.AdmissionEvent
		err := c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{}, func(ctx context.Context, ev vramguard.AdmissionEvent, landed func()) error {
			got = ev
			return forward(s, "small")(ctx, ev, landed)
		})
		if err != nil {
			t.Fatal(err)
		}
		if s.Listed(tc.gone) || !s.Listed("small") || len(s.Running()) != 2 {
			t.Errorf("protected %v: resident %v; want %s unloaded for small's slot", tc.protected, s.Running(), tc.gone)
		}
		if !got.MadeRoom || len(got.Evicted) != 1 || vramguard.NormalizeModelName(got.Evicted[0].Model) != vramguard.NormalizeModelName(tc.gone) || got.Evicted[0].Cause != vramguard.CauseBudget {
			t.Errorf("protected %v: run told %+v; want %s's verified unload, cause budget", tc.protected, got, tc.gone)
		}
	}
}

// When every loaded model is kept (another program's leases), MaxLoaded
// refuses the load naming them, with the leases' end to retry after, and
// unloads nothing.
func TestAdmitMaxLoadedRefusesWhenKept(t *testing.T) {
	dir := privateDir(t)
	s, c := slotSim(t, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	other, _ := countedClient(t, s, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	for _, m := range []string{"big", "mid"} {
		l, err := other.HoldModel(t.Context(), m, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release() })
	}
	err := c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{}, forward(s, "small"))
	var re *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrLeased) || !errors.As(err, &re) {
		t.Fatalf("Admit = %v; want KindOutOfMemory, ErrLeased, a *RoomError", err)
	}
	if len(re.Kept) != 2 || re.RetryAfter <= 0 || re.RetryAfter > time.Minute || !strings.Contains(err.Error(), "2 slots") {
		t.Errorf("RoomError %v (kept %+v, retry after %v); want both leased models named, a minute at most to wait, the slots in the text", err, re.Kept, re.RetryAfter)
	}
	if !s.Listed("big") || !s.Listed("mid") || s.Requests("small") != 0 {
		t.Errorf("resident %v, %d requests for small; want nothing changed", s.Running(), s.Requests("small"))
	}
}

// Admissions together (pairs): the model a run is using counts as in
// use, so another admission's slot does not take it; it takes an idle
// model, and with every loaded model in use it is refused naming them.
func TestAdmitInUseKeepsTheModelFromAnotherAdmission(t *testing.T) {
	s, c := slotSim(t, vramguard.Options{})
	release := make(chan struct{})
	var runs []chan error
	hold := func(model string) {
		inRun, errs := make(chan struct{}), make(chan error, 1)
		runs = append(runs, errs)
		go func() {
			errs <- c.Admit(t.Context(), model, nil, vramguard.ReserveOptions{}, func(ctx context.Context, ev vramguard.AdmissionEvent, landed func()) error {
				defer landed()
				if ev.Load {
					if err := forward(s, model)(ctx, ev, func() {}); err != nil {
						return err
					}
				}
				close(inRun)
				<-release
				return nil
			})
		}()
		select {
		case <-inRun:
		case err := <-errs:
			t.Fatalf("Admit of %s = %v", model, err)
		}
	}
	hold("mid") // listed: no load, in use while its run runs
	hold("small")
	// mid (the fewest bytes, the policy's first victim) is in use: big
	// went for small's slot.
	if !s.Listed("mid") || s.Listed("big") || !s.Listed("small") {
		t.Errorf("resident %v; want mid (in use) kept, big unloaded for small", s.Running())
	}
	err := c.Admit(t.Context(), "big", nil, vramguard.ReserveOptions{}, forward(s, "big"))
	var re *vramguard.RoomError
	inUse := func(k vramguard.KeptModel) bool { return k.InUse }
	if !errors.As(err, &re) || !kept(re.Kept, "mid", inUse) || !kept(re.Kept, "small", inUse) {
		t.Errorf("Admit with both models in use = %v; want a refusal keeping mid and small as in use", err)
	}
	close(release)
	for _, errs := range runs {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// privateDir is a lease directory of mode 0700, as leases need.
func privateDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func kept(ks []vramguard.KeptModel, model string, why func(vramguard.KeptModel) bool) bool {
	for _, k := range ks {
		if vramguard.NormalizeModelName(k.Model) == vramguard.NormalizeModelName(model) && why(k) {
			return true
		}
	}
	return false
}

// An unload of the model by this client while run has not landed cuts
// run's ctx with ErrUnloadedWhileLoading (an unload sent during a load is
// lost by the server); after landed it does not.
func TestAdmitUnloadCutsALoadingRun(t *testing.T) {
	_, c := slotSim(t, vramguard.Options{})
	for _, land := range []bool{false, true} {
		inRun := make(chan struct{})
		var cause atomic.Value
		done := make(chan error, 1)
		go func() {
			done <- c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{}, func(ctx context.Context, _ vramguard.AdmissionEvent, landed func()) error {
				if land {
					landed()
				}
				close(inRun)
				select {
				case <-ctx.Done():
					cause.Store(context.Cause(ctx))
				case <-time.After(500 * time.Millisecond):
				}
				return nil
			})
		}()
		<-inRun
		if _, err := c.UnloadModel(t.Context(), "small"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got, _ := cause.Load().(error)
		if want := !land; errors.Is(got, vramguard.ErrUnloadedWhileLoading) != want {
			t.Errorf("landed %v: run's ctx ended with %v; cut by the unload: want %v", land, got, want)
		}
	}
}

// Two admissions together against one device's memory: the first one's
// load, admitted and not listed yet, is counted, so the second one is
// refused rather than admitted against the same free bytes.
func TestAdmitCountsALoadAdmittedBefore(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 5 * gib},
		vramguardtest.ModelConfig{Name: "a", Size: 2 * gib},
		vramguardtest.ModelConfig{Name: "b", Size: 2 * gib})
	c, _ := countedClient(t, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{Headroom: gib}})
	inRun, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- c.Admit(t.Context(), "a", nil, vramguard.ReserveOptions{}, func(context.Context, vramguard.AdmissionEvent, func()) error {
			close(inRun)
			<-release // nothing sent yet: the device shows nothing of a
			return nil
		})
	}()
	<-inRun
	err := c.Admit(t.Context(), "b", nil, vramguard.ReserveOptions{}, forward(s, "b"))
	if !errors.Is(err, vramguard.ErrOverBudget) {
		t.Errorf("second Admit = %v; want refused, a's admitted load counted", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := c.Admit(t.Context(), "b", nil, vramguard.ReserveOptions{}, forward(s, "b")); err != nil {
		t.Errorf("Admit once a's admission ended = %v; want admitted", err)
	}
}

// Where host-wide leases are on, the admitted load is reserved for its
// requester until run calls landed: another program's client on the host
// sees the reservation named after opts.For, and it ends at landed.
func TestAdmitReservesTheLoadForItsRequester(t *testing.T) {
	dir := privateDir(t)
	s := newSim(t, vramguardtest.Config{TotalVRAM: 8 * gib}, vramguardtest.ModelConfig{Name: "a", Size: 2 * gib})
	c, _ := countedClient(t, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{}, Leases: vramguard.LeaseOptions{Dir: dir}})
	other, _ := countedClient(t, s, vramguard.Options{VRAM: s.GPU(), Leases: vramguard.LeaseOptions{Dir: dir}})
	reservedFor := func() []string {
		_, err := other.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 7 * gib, DryRun: true})
		var re *vramguard.RoomError
		if err != nil && !errors.As(err, &re) {
			t.Fatal(err)
		}
		var fors []string
		if re != nil {
			for _, r := range re.Reserved {
				fors = append(fors, r.For+"|"+r.Note)
			}
		}
		return fors
	}
	var during []string
	err := c.Admit(t.Context(), "a", nil, vramguard.ReserveOptions{For: "chat-ui", Note: "client 10.0.0.7"}, func(ctx context.Context, ev vramguard.AdmissionEvent, landed func()) error {
		during = reservedFor()
		err := forward(s, "a")(ctx, ev, func() {})
		landed()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(during) != 1 || during[0] != "load of a:latest for chat-ui|client 10.0.0.7" {
		t.Errorf("reservations seen during run: %q; want the load of a, for chat-ui, noted", during)
	}
	if after := reservedFor(); len(after) != 0 {
		t.Errorf("reservations after landed: %q; want none", after)
	}
}

// Bad input is refused before anything is checked or sent.
func TestAdmitBadInput(t *testing.T) {
	s, c := slotSim(t, vramguard.Options{})
	ok := func(context.Context, vramguard.AdmissionEvent, func()) error { return nil }
	for name, call := range map[string]func() error{
		"nil run":  func() error { return c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{}, nil) },
		"bad name": func() error { return c.Admit(t.Context(), "", nil, vramguard.ReserveOptions{}, ok) },
		"load set": func() error {
			return c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{Load: "small"}, ok)
		},
		"bad TTL": func() error {
			return c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{TTL: -time.Second}, ok)
		},
	} {
		if err := call(); !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("%s: Admit = %v; want KindInvalidInput", name, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Admit(t.Context(), "small", nil, vramguard.ReserveOptions{}, ok); !errors.Is(err, vramguard.ErrClosed) {
		t.Errorf("Admit on a closed client = %v; want ErrClosed", err)
	}
	if !s.Listed("big") || !s.Listed("mid") {
		t.Errorf("resident %v; want nothing unloaded", s.Running())
	}
}

// Admissions in a row read the server each time without waiting for the
// interval that paces unloads' polls (a proxy's requests one after
// another paid up to Options.PollInterval each: 38 ms per 10-chunk
// request through vramgate with -max-loaded, against 2 ms straight).
// The interval here is 2 s: three admissions that each waited for it
// would take 4 s at least.
func TestAdmitInARowDoesNotWaitThePollInterval(t *testing.T) {
	const interval = 2 * time.Second
	s, c := slotSim(t, vramguard.Options{PollInterval: interval, UnloadTimeout: 3 * interval})
	start := time.Now()
	for range 3 {
		if err := c.Admit(t.Context(), "big", nil, vramguard.ReserveOptions{}, forward(s, "big")); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took >= interval {
		t.Errorf("three admissions of a listed model took %v; want less than one poll interval (%v)", took, interval)
	}
}
