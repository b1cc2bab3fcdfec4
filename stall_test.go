package vramguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A call on a model that a budget's room-making is unloading, begun after
// the plan, does not hold that room-making to the unload's timeout: it
// waited for the admission slot the room-making held, while the unload
// waited for it (the same stall the pool's placement turn had, issue #35).
func TestBudgetCallOnAPlannedVictimDoesNotStall(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 12 * gib, StrictVRAM: true, UnloadDelay: 200 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib},
		vramguardtest.ModelConfig{Name: "c", SizeVRAM: 9 * gib})
	const unloadTimeout = 10 * time.Second
	c := newClientAt(t, s.URL().String(), vramguard.Options{UnloadTimeout: unloadTimeout,
		VRAM: &vramguardtest.GPU{Server: s}, Budget: &vramguard.Budget{MakeRoom: true}})
	hour := vramguard.KeepAliveFor(time.Hour)
	generate := func(model string) (*vramguard.Generation, error) {
		return c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: model, Prompt: "x"}, hour, nil)
	}
	if _, err := generate("c"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var bErr, cErr error
	var bTook time.Duration
	wg.Go(func() {
		start := time.Now()
		_, bErr = generate("b")
		bTook = time.Since(start)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, func() bool {
		return slices.ContainsFunc(s.Events("c"), func(e vramguardtest.Event) bool { return e.Kind == vramguardtest.EventUnloadRequest })
	}); err != nil {
		t.Fatalf("no unload of c: %v", err)
	}
	wg.Go(func() { _, cErr = generate("c") })
	wg.Wait()
	t.Logf("b: %v in %v; the call on c: %v", bErr, bTook.Round(time.Millisecond), cErr)
	if bTook >= unloadTimeout/2 {
		t.Errorf("the admission of b took %v: held to the unload timeout (%v) by the call on c", bTook, unloadTimeout)
	}
}

// EnsureFree waits for this client's loads in flight before it plans:
// on a device whose memory shows a load only once the server lists the
// model (PSGPU; a real GPU shows a runner's memory as it allocates), the
// room it reported was taken by its own client's load landing right
// after (the composition oracle's open finding of seed
// 1796171770862276545: EnsureFree did not count the loads in flight
// beside it).
func TestEnsureFreeWaitsForOwnLoadsInFlight(t *testing.T) {
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib, Size: 5 * gib},
		vramguardtest.ModelConfig{Name: "d", SizeVRAM: 4 * gib, Size: 4 * gib, LoadLatency: 300 * time.Millisecond})
	dev := &vramguardtest.PSGPU{Client: s.APIClient(), Total: 12 * gib}
	c := newClientAt(t, s.URL().String(), vramguard.Options{VRAM: dev})
	loaded := warmThenLoad(t, c, "b", "d")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, func() bool { return s.Requests("d") > 0 }); err != nil {
		t.Fatal(err)
	}
	// 7 GiB free as the device reads now; 3 once d lands.
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	snap, err := dev.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if f := snap.Devices[0].Free; f < 6*gib {
		t.Errorf("after EnsureFree (plan %v, free before %d) and d's load: %d bytes free, want 6 GiB: the room was made before this client's own load landed", rep.Plan, rep.FreeBefore, f)
	}
	if len(rep.Plan) == 0 {
		t.Errorf("nothing planned: 3 GiB free once d landed, so a model had to go")
	}
}

// Two phases of one client: A's hand-over waits for B's load in flight
// and counts it. On a device that shows a load once it is listed, A's End
// saw the room before d landed and handed over memory that d then took;
// now it sees d, which B's phase keeps, and refuses with the *RoomError.
func TestHandOverCountsAnotherPhasesLoadInFlight(t *testing.T) {
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib, Size: 5 * gib},
		vramguardtest.ModelConfig{Name: "d", SizeVRAM: 4 * gib, Size: 4 * gib, LoadLatency: 300 * time.Millisecond})
	dev := &vramguardtest.PSGPU{Client: s.APIClient(), Total: 12 * gib}
	c := newClientAt(t, s.URL().String(), vramguard.Options{VRAM: dev})
	a, err := c.StartPhase(t.Context(), "a", vramguard.PhaseOptions{NeedBytes: 9 * gib, NoLease: true})
	if err != nil {
		t.Fatal(err)
	}
	ga := a.Guard()
	if _, err := ga.Generate(t.Context(), &vramguard.GenerateRequest{Model: "b", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	b, err := c.StartPhase(t.Context(), "b", vramguard.PhaseOptions{NoLease: true})
	if err != nil {
		t.Fatal(err)
	}
	loaded := make(chan error, 1)
	go func() {
		gb := b.Guard()
		_, err := gb.Generate(t.Context(), &vramguard.GenerateRequest{Model: "d", Prompt: "x"}, nil)
		loaded <- err
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, func() bool { return s.Requests("d") > 0 }); err != nil {
		t.Fatal(err)
	}
	// 12 GiB free once b goes, as the device reads now; 8 once d lands.
	rep, endErr := a.End(t.Context())
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	snap, err := dev.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	free := snap.Devices[0].Free
	var re *vramguard.RoomError
	if endErr == nil && free < 9*gib {
		t.Errorf("A's hand-over reported the room (free after %d) and %d bytes are free with B's d loaded: it did not count B's load in flight", rep.Handover.FreeAfter, free)
	} else if endErr != nil && !errors.As(endErr, &re) {
		t.Errorf("A's End: %v; want the *RoomError of a hand-over that cannot be made beside B's d", endErr)
	}
	if !s.Listed("d") {
		t.Error("B's d was unloaded by A's hand-over: another phase's model")
	}
	if _, err := b.End(t.Context()); err != nil {
		t.Error(err)
	}
}

// EnsureFree waits for a call of this client that was still being admitted
// by the budget when it began (composition oracle seed
// 1796287416702493421): before, it planned without that load, found the
// room there, and the load then took it.
func TestEnsureFreeWaitsForCallsBeingAdmitted(t *testing.T) {
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib, Size: 5 * gib},
		vramguardtest.ModelConfig{Name: "d", SizeVRAM: 4 * gib, Size: 4 * gib})
	dev := &vramguardtest.PSGPU{Client: s.APIClient(), Total: 12 * gib}
	hc, admitting, release := holdAdmission("d")
	c := newClientAt(t, s.URL().String(), vramguard.Options{VRAM: dev, HTTPClient: hc, Budget: &vramguard.Budget{}})
	loaded := warmThenLoad(t, c, "b", "d")
	select {
	case <-admitting:
	case <-time.After(10 * time.Second):
		t.Fatal("the budget never asked about d")
	}
	type result struct {
		rep *vramguard.EnsureReport
		err error
	}
	ensured := make(chan result, 1)
	go func() {
		// 7 GiB free as the device reads now; 3 once d lands.
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib, Timeout: 10 * time.Second})
		ensured <- result{rep, err}
	}()
	select {
	case r := <-ensured:
		t.Errorf("EnsureFree returned (plan %v, %v) while a call of its client was still being admitted", r.rep.Plan, r.err)
		close(release)
		<-loaded
		return
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	r := <-ensured
	if r.err != nil {
		t.Fatal(r.err)
	}
	snap, err := dev.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if f := snap.Devices[0].Free; f < 6*gib {
		t.Errorf("after EnsureFree (plan %v) and d's load: %d bytes free, want 6 GiB: the room was planned without the call being admitted", r.rep.Plan, f)
	}
	if len(r.rep.Plan) == 0 {
		t.Errorf("nothing planned: 3 GiB free once d landed, so a model had to go")
	}
}

// warmThenLoad loads warm with an hour's keep-alive, then starts a
// generation on next with the same, whose end the channel gives.
func warmThenLoad(t *testing.T, c *vramguard.OllamaClient, warm, next string) <-chan error {
	t.Helper()
	hour := vramguard.KeepAliveFor(time.Hour)
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: warm, Prompt: "x"}, hour, nil); err != nil {
		t.Fatal(err)
	}
	loaded := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: next, Prompt: "x"}, hour, nil)
		loaded <- err
	}()
	return loaded
}

// holdAdmission returns an HTTP client whose requests about model's
// details (a budget's estimate of it: the admission is in progress) wait
// until release is closed; admitting is closed at the first of them.
func holdAdmission(model string) (hc *http.Client, admitting <-chan struct{}, release chan struct{}) {
	asked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hc = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path == "/api/show" && bodyNames(r, model) {
			once.Do(func() { close(asked) })
			<-release
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	return hc, asked, release
}

// bodyNames reports whether r's JSON body names model (its "model" or
// "name"), leaving the body readable.
func bodyNames(r *http.Request, model string) bool {
	if r.Body == nil {
		return false
	}
	b, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return false
	}
	var q struct{ Model, Name string }
	return json.Unmarshal(b, &q) == nil && (q.Model == model || q.Name == model)
}

// Close does not wait for a call still being admitted: it will fail with
// ErrClosed, so the hand-over of a phase Close ends has no load of it to
// count.
func TestCloseDoesNotWaitForCallsBeingAdmitted(t *testing.T) {
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "d", SizeVRAM: 4 * gib, Size: 4 * gib})
	dev := &vramguardtest.PSGPU{Client: s.APIClient(), Total: 12 * gib}
	hc, admitting, release := holdAdmission("d")
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: dev, HTTPClient: hc, Budget: &vramguard.Budget{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{NeedBytes: gib, NoLease: true, Timeout: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	called := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "d", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		called <- err
	}()
	select {
	case <-admitting:
	case err := <-called:
		t.Fatalf("the call ended before its admission asked about d: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	var closeErr error
	select {
	case closeErr = <-closed:
	case <-time.After(5 * time.Second):
		t.Error("Close still waiting after 5 s for a call being admitted (the phase's timeout is 20 s)")
		close(release)
		closeErr = <-closed
		release = nil
	}
	if release != nil {
		close(release)
	}
	if closeErr != nil {
		t.Errorf("Close: %v", closeErr)
	}
	if err := <-called; !errors.Is(err, vramguard.ErrClosed) {
		t.Errorf("the call admitted after Close: %v; want ErrClosed", err)
	}
}
