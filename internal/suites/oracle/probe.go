package oracle

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/ollama/ollama/api"
)

// Behaviour is what a server does on its own in the races the library
// works around, measured with a raw client (no vramguard), one row of the
// README's compatibility table each.
type Behaviour struct {
	// UnloadDuringLoad: a bare unload sent while the model loads is
	// "kept" (the model leaves once loaded) or "lost" (it stays for the
	// loading request's keep-alive).
	UnloadDuringLoad string
	// PSWhileLoading: /api/ps during a load, once its runner runs:
	// "listed" or "not listed".
	PSWhileLoading string
	// CanceledLoad: a load whose request is canceled once its runner
	// runs is "aborted" (nothing listed, the runner gone) or "finished"
	// (the model is listed afterwards).
	CanceledLoad string
}

// Probe measures b on t, leaving nothing resident.
func Probe(ctx context.Context, t Target) (Behaviour, error) {
	var b Behaviour
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	c := api.NewClient(t.URL(), &http.Client{Transport: tr})
	stream := false
	unload := func() {
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = c.Generate(uctx, &api.GenerateRequest{Model: ModelA, KeepAlive: &api.Duration{Duration: 0}, Stream: &stream},
			func(api.GenerateResponse) error { return nil })
	}
	clean := func() error {
		deadline := time.Now().Add(20 * time.Second)
		for {
			o := t.Observe(ctx)
			if o.Err == "" && !o.present(ModelA) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("probe: %s still resident", ModelA)
			}
			if o.Listed[ModelA] {
				unload()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// waitRunner waits until the load has its runner, then looks.
	waitRunner := func(done chan error) (Obs, error) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			o := t.Observe(ctx)
			if o.Runners[ModelA] > 0 {
				return o, nil
			}
			select {
			case err := <-done:
				done <- err // for the caller, which waits for the load's end
				return o, fmt.Errorf("probe: the load ended (%v) before its runner was seen", err)
			default:
			}
			if time.Now().After(deadline) {
				return o, fmt.Errorf("probe: no runner within 10 s")
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if err := clean(); err != nil {
		return b, err
	}

	// A load, looked at until it ends (its request's send time plus the
	// load_duration the server reports, less 30 ms of slack), a bare
	// unload during it, and a look once it ended.
	done := make(chan error, 1)
	var load time.Duration
	sent := time.Now()
	go func() {
		done <- c.Generate(ctx, &api.GenerateRequest{Model: ModelA, Prompt: "x", Options: map[string]any{"num_predict": 2}},
			func(r api.GenerateResponse) error { load = max(load, r.LoadDuration); return nil })
	}()
	if _, err := waitRunner(done); err != nil {
		return b, err
	}
	unload()
	var looks []Obs
	var genErr error
	for ended := false; !ended; {
		select {
		case genErr = <-done:
			ended = true
		default:
			looks = append(looks, t.Observe(ctx))
			time.Sleep(2 * time.Millisecond)
		}
	}
	if genErr != nil {
		return b, fmt.Errorf("probe: the load failed: %w", genErr)
	}
	listed := false
	for _, o := range looks {
		listed = listed || o.Listed[ModelA] && o.T1.Before(sent.Add(load-30*time.Millisecond))
	}
	b.PSWhileLoading = map[bool]string{true: "listed", false: "not listed"}[listed]
	time.Sleep(300 * time.Millisecond) // a kept unload is applied within milliseconds
	b.UnloadDuringLoad = map[bool]string{true: "lost", false: "kept"}[t.Observe(ctx).Listed[ModelA]]
	if err := clean(); err != nil {
		return b, err
	}

	// A load whose request is canceled once its runner runs.
	lctx, cancel := context.WithCancel(ctx)
	go func() {
		done <- c.Generate(lctx, &api.GenerateRequest{Model: ModelA, Prompt: "x", Options: map[string]any{"num_predict": 1}},
			func(api.GenerateResponse) error { return nil })
	}()
	_, err := waitRunner(done)
	cancel()
	<-done
	if err != nil {
		return b, err
	}
	// Finished: listed at some point after the cancel.
	finished := false
	for end := time.Now().Add(3*t.LoadTime() + time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		finished = finished || t.Observe(ctx).Listed[ModelA]
	}
	b.CanceledLoad = map[bool]string{true: "finished", false: "aborted"}[finished]
	return b, clean()
}
