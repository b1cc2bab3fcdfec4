package integration_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// Issue #13 for the scopes: another program starts loading a model just
// before or while a phase's End or a guard's after-use cleanup unloads it.
// Ollama v0.17.4 to v0.34.4 list nothing in /api/ps while a model loads and
// drop an unload that arrives then; the cleanups go through the same unload
// loop as UnloadModel (TestUnloadSeesOthersLoad) but end it differently:
// End waits for other programs' requests, a guard does not.

// TestPhaseEndSeesOthersLoad: End waits for other programs' requests on
// its models, so an End that races another program's load must still end
// verified, with the model gone for good.
func TestPhaseEndSeesOthersLoad(t *testing.T) {
	eachVersionAlone(t, func(t *testing.T, s *ollamatest.Server) {
		offsets, watch := raceOffsets(t, s)
		// The second client: it unloads the phase's model before the race,
		// and cleans up after each case.
		u := newClient(t, s, vramguard.Options{})
		blob := blobOf(t, u)
		for _, off := range offsets {
			t.Run(fmt.Sprintf("api load, end at %v", off), func(t *testing.T) {
				c := newClient(t, s, vramguard.Options{})
				p, err := c.StartPhase(t.Context(), "prompt", vramguard.PhaseOptions{})
				if err != nil {
					t.Fatal(err)
				}
				g := p.Guard()
				if _, err := g.Generate(t.Context(), req(modelA, 4), nil); err != nil {
					t.Fatalf("the phase's generation: %v", err)
				}
				// The phase keeps modelA warm; take it away behind the
				// phase's back, so the other program's request is a load
				// (forced: the phase's lease keeps it from other clients).
				if rep, err := u.ForceUnloadModel(t.Context(), modelA); err != nil || !rep.Verified {
					t.Fatalf("UnloadModel before the race: %+v, %v", rep, err)
				}
				_, _ = otherLoad(t, s, u, blob)
				time.Sleep(off)

				rep, err := p.End(t.Context())
				if err != nil {
					t.Fatalf("End: %v (report %+v)", err, rep)
				}
				if rep.Cleanup == nil || len(rep.Cleanup.Unloads) != 1 {
					t.Fatalf("End unloaded %+v, want one report, for %s", rep.Cleanup, modelA)
				}
				for _, ur := range rep.Cleanup.Unloads {
					if !ur.Verified {
						t.Fatalf("End returned no error and an unverified report: %+v", ur)
					}
					t.Logf("End: %s verified, %d attempts, %d polls in %v; checked %v, runner seen %v",
						ur.Model, ur.Attempts, ur.Polls, ur.Elapsed, ur.Checked, ur.RunnerSeen)
					if !s.External() && ur.Checked&vramguard.CheckRunnerProcesses == 0 {
						t.Errorf("verified on a local server without the process check: checked %v (%s)", ur.Checked, ur.NoRunnerCheck)
					}
				}
				watchAbsent(t, s, blob, watch)
			})
		}
	})
}

// TestGuardCleanupSeesOthersLoad: a guard's after-use cleanup does not wait
// for another client's request, so racing another program's load it ends
// either verified, with the model gone for good, or with ErrHeldByOthers,
// which promises that the unload reached the server: the model must go
// when the other program's request ends, not at its keep-alive's expiry.
func TestGuardCleanupSeesOthersLoad(t *testing.T) {
	eachVersionAlone(t, func(t *testing.T, s *ollamatest.Server) {
		offsets, watch := raceOffsets(t, s)
		u := newClient(t, s, vramguard.Options{})
		blob := blobOf(t, u)
		for _, off := range offsets {
			t.Run(fmt.Sprintf("api load, cleanup at %v", off), func(t *testing.T) {
				// The unload requests the cleanup sends, and its report
				// when it ends verified.
				var (
					mu       sync.Mutex
					sent     []time.Time
					verified *vramguard.UnloadReport
				)
				tr := http.DefaultTransport.(*http.Transport).Clone()
				t.Cleanup(tr.CloseIdleConnections)
				c := newClient(t, s, vramguard.Options{
					HTTPClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
						if isUnloadRequest(r) {
							mu.Lock()
							sent = append(sent, time.Now())
							mu.Unlock()
						}
						return tr.RoundTrip(r)
					})},
					Hooks: vramguard.Hooks{OnUnloadEnd: func(_ context.Context, e vramguard.UnloadEnd) {
						if e.Err != nil || !e.Report.Verified {
							return
						}
						mu.Lock()
						defer mu.Unlock()
						verified = e.Report
					}},
				})
				g := vramguard.Guard{Client: c}
				var (
					wrote    time.Time
					finished <-chan struct{}
					cleanup  time.Time // when fn returned and the cleanup began
				)
				err := g.Run(t.Context(), modelA, func(ctx context.Context, ss *vramguard.Session) error {
					if _, err := ss.Generate(ctx, req(modelA, 4), nil); err != nil {
						return fmt.Errorf("the session's generation: %w", err)
					}
					// The generation unloads the model (keep-alive 0): wait
					// until it has gone, so the other program's request is a
					// load.
					if _, err := waitGone(t, s, blob, 10*time.Second); err != nil {
						return fmt.Errorf("after the session's generation: %w", err)
					}
					wrote, finished = otherLoad(t, s, u, blob)
					time.Sleep(off)
					cleanup = time.Now()
					return nil
				})
				returned := time.Now()
				mu.Lock()
				var at []string
				for _, st := range sent {
					at = append(at, st.Sub(wrote).Round(time.Millisecond).String())
				}
				rep := verified
				mu.Unlock()
				// What the cleanup did, timed from the other program's
				// request going out.
				sends := fmt.Sprintf("%d unload requests, at %s into the other program's request; cleanup took %v",
					len(at), strings.Join(at, ", "), returned.Sub(cleanup).Round(time.Millisecond))

				switch {
				case err == nil:
					if rep == nil || !rep.Verified {
						t.Fatalf("Run returned no error and no verified unload (%+v); %s", rep, sends)
					}
					t.Logf("outcome: verified; %d attempts, %d polls in %v; checked %v, runner seen %v; %s",
						rep.Attempts, rep.Polls, rep.Elapsed, rep.Checked, rep.RunnerSeen, sends)
					if !s.External() && rep.Checked&vramguard.CheckRunnerProcesses == 0 {
						t.Errorf("verified on a local server without the process check: checked %v (%s)", rep.Checked, rep.NoRunnerCheck)
					}
					watchAbsent(t, s, blob, watch)
				case errors.Is(err, vramguard.ErrHeldByOthers) && errors.Is(err, vramguard.KindUnverified):
					t.Logf("outcome: held by others (%v); %s; /api/ps: %s", err, sends, psExpiry(t, s))
					select {
					case <-finished:
					case <-time.After(2 * time.Minute):
						t.Fatal("the other program's request still runs 2 min after the cleanup")
					}
					// The cleanup said its unload reached the server: the
					// server unloads the model as the request ends, not
					// at its keep-alive's expiry 5 minutes later.
					took, err := waitGone(t, s, blob, 5*time.Second)
					if err != nil {
						t.Fatalf("after ErrHeldByOthers (%s), the other program's request ended: %v; /api/ps: %s", sends, err, psExpiry(t, s))
					}
					t.Logf("gone %v after the other program's request ended", took.Round(time.Millisecond))
					// The rest of the watch window, counted from the
					// cleanup's end; at least a second.
					watchAbsent(t, s, blob, max(watch-time.Since(returned), time.Second))
				default:
					t.Fatalf("Run: %v (kind %v); %s", err, vramguard.KindOf(err), sends)
				}
			})
		}
	})
}

// raceOffsets returns the offsets into the other program's load at which
// the cleanup starts, and how long the model must then stay absent. The
// real runners load tiny-a in about 300 ms, and a model an unload missed
// shows within 3 s; the stand-in is set to take 2 s, and watched for 10 s.
func raceOffsets(t *testing.T, s *ollamatest.Server) (offsets []time.Duration, watch time.Duration) {
	t.Helper()
	if s.UsesStandin() {
		setKnobs(t, s, standin.Knobs{LoadMS: 2000})
		return []time.Duration{0, 200 * time.Millisecond, 1000 * time.Millisecond, 1800 * time.Millisecond}, 10 * time.Second
	}
	return []time.Duration{0, 100 * time.Millisecond}, 3 * time.Second
}

// otherLoad starts the other program's request on modelA, as in
// TestUnloadSeesOthersLoad (a raw client, the server's default keep-alive
// of 5 m), and returns once the request is on the wire: offsets count from
// then. finished is closed when the request returns; the case's clean-up
// waits for it and leaves nothing loaded.
func otherLoad(t *testing.T, s *ollamatest.Server, u *vramguard.OllamaClient, blob string) (wrote time.Time, finished <-chan struct{}) {
	t.Helper()
	onWire := make(chan struct{})
	ctx := httptrace.WithClientTrace(context.WithoutCancel(t.Context()), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { close(onWire) },
	})
	done := make(chan error, 1) // for cleanUp
	fin := make(chan struct{})
	go func() {
		done <- s.Client().Generate(ctx, &api.GenerateRequest{Model: modelA, Prompt: "x", Options: short(4)},
			func(api.GenerateResponse) error { return nil })
		close(fin)
	}()
	t.Cleanup(func() { cleanUp(t, s, u, done, blob) })
	<-onWire
	return time.Now(), fin
}

// gone reports whether modelA is absent from /api/ps and no runner of s
// serves blob.
func gone(t *testing.T, s *ollamatest.Server, blob string) bool {
	t.Helper()
	return len(running(t, s)) == 0 && len(serverRunners(t, s, blob)) == 0
}

// waitGone polls until the model is gone, returning how long that took, or
// an error after limit.
func waitGone(t *testing.T, s *ollamatest.Server, blob string, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	for !gone(t, s, blob) {
		if time.Since(start) > limit {
			return 0, fmt.Errorf("/api/ps lists %v and %d runners serve %s after %v",
				running(t, s), len(serverRunners(t, s, blob)), modelA, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), nil
}

// watchAbsent requires the model to stay absent for d: from /api/ps and,
// for a server this test started, from its runner processes.
func watchAbsent(t *testing.T, s *ollamatest.Server, blob string, d time.Duration) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if ms := running(t, s); len(ms) != 0 {
			t.Fatalf("%v into the watch, /api/ps lists %v: %s", time.Since(start).Round(time.Millisecond), ms, psExpiry(t, s))
		}
		if rs := serverRunners(t, s, blob); len(rs) != 0 {
			t.Fatalf("%v into the watch, runner %d serves %s", time.Since(start).Round(time.Millisecond), rs[0].PID, modelA)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// psExpiry describes what /api/ps lists and when each model expires: an
// expiry minutes away means the server has no unload pending for it.
func psExpiry(t *testing.T, s *ollamatest.Server) string {
	t.Helper()
	resp, err := s.Client().ListRunning(t.Context())
	if err != nil {
		return err.Error()
	}
	if len(resp.Models) == 0 {
		return "nothing"
	}
	var out []string
	for _, m := range resp.Models {
		out = append(out, fmt.Sprintf("%s expires in %v", m.Model, time.Until(m.ExpiresAt).Round(time.Millisecond)))
	}
	return strings.Join(out, ", ")
}
