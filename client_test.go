package vramguard_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestStreamingSuccess(t *testing.T) {
	for _, ep := range endpoints() {
		t.Run(ep.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 12, LoadLatency: 30 * time.Millisecond})
			c := newTestClient(t, s, Options{})

			var got []Chunk
			gen, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "a red fox"},
				KeepAliveFor(time.Minute), func(ch Chunk) error { got = append(got, ch); return nil })
			if err != nil {
				t.Fatal(err)
			}
			var joined strings.Builder
			for i, ch := range got {
				if ch.Index != i+1 {
					t.Errorf("chunk %d has Index %d", i, ch.Index)
				}
				joined.WriteString(ch.Text)
				if ch.Bytes != joined.Len() {
					t.Errorf("chunk %d: Bytes %d, want %d", i, ch.Bytes, joined.Len())
				}
			}
			if gen.Text != joined.String() || gen.Text == "" {
				t.Errorf("Text %q, chunks joined %q", gen.Text, joined.String())
			}
			if !got[len(got)-1].Done || gen.DoneReason != "stop" || gen.Chunks != len(got) {
				t.Errorf("done %v reason %q chunks %d/%d", got[len(got)-1].Done, gen.DoneReason, gen.Chunks, len(got))
			}
			if !gen.Loaded || gen.Metrics.LoadDuration <= 0 {
				t.Errorf("first call: Loaded %v, load %v; want a load", gen.Loaded, gen.Metrics.LoadDuration)
			}
			if m := gen.Message(); m.Role != "assistant" || m.Content != gen.Text {
				t.Errorf("Message() = %+v, want the assistant's reply", m)
			}
			// The keep-alive kept it: the second call reuses it.
			gen2, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "a red fox"}, KeepAliveFor(time.Minute), nil)
			if err != nil {
				t.Fatal(err)
			}
			if gen2.Loaded || s.Loads("tiny") != 1 {
				t.Errorf("second call: Loaded %v, server loads %d; want reuse", gen2.Loaded, s.Loads("tiny"))
			}
		})
	}
}

func TestKeepAliveOnTheWire(t *testing.T) {
	tests := []struct {
		name     string
		ka       KeepAlive
		resident bool
		expires  time.Duration // roughly, from now; 0: not checked
	}{
		{"unload", KeepAliveUnload, false, 0},
		{"duration", KeepAliveFor(90 * time.Second), true, 90 * time.Second},
		{"server default", KeepAliveServerDefault, true, 5 * time.Minute},
		{"forever", KeepAliveForever, true, 100 * 365 * 24 * time.Hour},
	}
	for _, ep := range endpoints() {
		for _, tt := range tests {
			t.Run(ep.name+"/"+tt.name, func(t *testing.T) {
				s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
				c := newTestClient(t, s, Options{KeepModelsOnClose: true})
				if _, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "x"}, tt.ka, nil); err != nil {
					t.Fatal(err)
				}
				if tt.resident {
					ms, err := c.Running(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					e := FindRunning(ms, "tiny")
					if e == nil {
						t.Fatal("model not resident")
					}
					if left := time.Until(e.ExpiresAt); left < tt.expires-5*time.Second {
						t.Errorf("expires in %v, want about %v", left, tt.expires)
					}
					return
				}
				eventually(t, s, "model gone", func() bool { return !s.Listed("tiny") })
			})
		}
	}
}

func TestStreamingFailures(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name     string
		fault    []vramguardtest.Fault
		model    string
		timeouts Timeouts
		kind     Kind
		cause    error // errors.Is target, optional
		canceled bool  // the server must see the request canceled
	}{
		{name: "not found", model: "nope", kind: KindNotFound},
		{name: "crash mid-stream", fault: []vramguardtest.Fault{vramguardtest.CrashAfter(3)}, kind: KindModelCrash},
		{name: "crash at load", fault: []vramguardtest.Fault{vramguardtest.LoadCrash()}, kind: KindModelCrash},
		{name: "runner stopped at load", fault: []vramguardtest.Fault{vramguardtest.RunnerStopped()}, kind: KindModelCrash},
		{name: "out of memory", fault: []vramguardtest.Fault{vramguardtest.OOM()}, kind: KindOutOfMemory},
		{name: "server busy", fault: []vramguardtest.Fault{vramguardtest.Busy()}, kind: KindTransient},
		{name: "stream cut without done", fault: []vramguardtest.Fault{vramguardtest.CloseAfter(3)}, kind: KindTransient, cause: ErrIncompleteStream},
		{name: "repeat-token abort", fault: []vramguardtest.Fault{vramguardtest.RepeatAfter(4)}, kind: KindTransient, cause: ErrIncompleteStream},
		{name: "stall before first chunk", fault: []vramguardtest.Fault{vramguardtest.Stall(5 * time.Second)},
			timeouts: Timeouts{FirstChunk: 100 * ms}, kind: KindTimeout, cause: ErrFirstChunkTimeout, canceled: true},
		{name: "stall between chunks", fault: []vramguardtest.Fault{vramguardtest.StallAfter(2, 5*time.Second)},
			timeouts: Timeouts{Idle: 100 * ms}, kind: KindTimeout, cause: ErrIdleTimeout, canceled: true},
		{name: "total timeout", fault: []vramguardtest.Fault{vramguardtest.StallAfter(2, 5*time.Second)},
			timeouts: Timeouts{Total: 150 * ms}, kind: KindTimeout, cause: ErrTotalTimeout, canceled: true},
	}
	for _, ep := range endpoints() {
		for _, tt := range tests {
			t.Run(ep.name+"/"+tt.name, func(t *testing.T) {
				s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 8})
				c := newTestClient(t, s, Options{})
				model := "tiny"
				if tt.model != "" {
					model = tt.model
				}
				if len(tt.fault) > 0 {
					if err := s.FailNext("tiny", tt.fault...); err != nil {
						t.Fatal(err)
					}
				}
				start := time.Now()
				gen, err := ep.run(t.Context(), c, &GenerateRequest{Model: model, Prompt: "x", Timeouts: tt.timeouts}, KeepAliveUnload, nil)
				if err == nil {
					t.Fatalf("got success %q, want a %v error", gen.Text, tt.kind)
				}
				if !errors.Is(err, tt.kind) {
					t.Fatalf("error %v: kind %v, want %v", err, KindOf(err), tt.kind)
				}
				if tt.cause != nil && !errors.Is(err, tt.cause) {
					t.Errorf("error %v does not wrap %v", err, tt.cause)
				}
				if elapsed := time.Since(start); elapsed > 3*time.Second {
					t.Errorf("took %v: a timeout did not cut the stall", elapsed)
				}
				if tt.canceled {
					eventually(t, s, "server sees the request canceled", func() bool { return s.Cancelled("tiny") == 1 })
				}
				// Whatever happened, keep-alive 0 leaves nothing resident.
				eventually(t, s, "model gone", func() bool { return !s.Listed("tiny") || s.Running()[0].Dead })
			})
		}
	}
}

func TestStreamingCallerCancel(t *testing.T) {
	for _, ep := range endpoints() {
		t.Run(ep.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 100, TokenLatency: 5 * time.Millisecond})
			c := newTestClient(t, s, Options{})
			ctx, cancel := context.WithCancelCause(t.Context())
			stop := errors.New("user pressed stop")
			_, err := ep.run(ctx, c, &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, func(ch Chunk) error {
				if ch.Index == 3 {
					cancel(stop)
				}
				return nil
			})
			if !errors.Is(err, KindCanceled) || !errors.Is(err, stop) {
				t.Fatalf("got %v, want KindCanceled wrapping the cause", err)
			}
			eventually(t, s, "server sees the cancel", func() bool { return s.Cancelled("tiny") == 1 })
			eventually(t, s, "model gone", func() bool { return !s.Listed("tiny") })
		})
	}
}

func TestStreamingCallbackError(t *testing.T) {
	for _, ep := range endpoints() {
		t.Run(ep.name, func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 50, TokenLatency: time.Millisecond})
			c := newTestClient(t, s, Options{})
			enough := errors.New("enough")
			_, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, func(ch Chunk) error {
				if ch.Index == 2 {
					return enough
				}
				return nil
			})
			if !errors.Is(err, KindCanceled) || !errors.Is(err, enough) {
				t.Fatalf("got %v, want KindCanceled wrapping the callback's error", err)
			}
		})
	}
}

func TestStreamingNoServer(t *testing.T) {
	for _, ep := range endpoints() {
		t.Run(ep.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close() // nothing listens there now
			c, err := NewClient(Options{Host: addr})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveUnload, nil)
			if !errors.Is(err, KindUnavailable) {
				t.Fatalf("got %v (kind %v), want unavailable", err, KindOf(err))
			}
			if _, err := c.UnloadModel(t.Context(), "tiny"); !errors.Is(err, KindUnavailable) {
				t.Fatalf("unload: got %v, want unavailable", err)
			}
		})
	}
}

func TestInvalidInput(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{})
	ctx := t.Context()
	tests := []struct {
		name string
		call func() error
	}{
		{"nil request", func() error { _, err := c.GenerateStreaming(ctx, nil, KeepAliveUnload, nil); return err }},
		{"empty model", func() error {
			_, err := c.GenerateStreaming(ctx, &GenerateRequest{Prompt: "x"}, KeepAliveUnload, nil)
			return err
		}},
		{"blank model", func() error {
			_, err := c.GenerateStreaming(ctx, &GenerateRequest{Model: " \t", Prompt: "x"}, KeepAliveUnload, nil)
			return err
		}},
		{"negative timeout", func() error {
			_, err := c.GenerateStreaming(ctx, &GenerateRequest{Model: "tiny", Timeouts: Timeouts{Idle: -1}}, KeepAliveUnload, nil)
			return err
		}},
		{"17 MB prompt", func() error {
			_, err := c.GenerateStreaming(ctx, &GenerateRequest{Model: "tiny", Prompt: strings.Repeat("a", 17<<20)}, KeepAliveUnload, nil)
			return err
		}},
		{"invalid UTF-8 prompt", func() error {
			_, err := c.GenerateStreaming(ctx, &GenerateRequest{Model: "tiny", Prompt: "\xff\xfe"}, KeepAliveUnload, nil)
			return err
		}},
		{"malformed keep-alive", func() error {
			_, err := c.GenerateStreaming(ctx, &GenerateRequest{Model: "tiny"}, InvalidKeepAlive(), nil)
			return err
		}},
		{"unload empty name", func() error { _, err := c.UnloadModel(ctx, ""); return err }},
		{"unload invalid UTF-8", func() error { _, err := c.UnloadModel(ctx, "\xff"); return err }},
		{"cleanup blank model", func() error { _, err := c.Cleanup(ctx, CleanupOptions{Models: []string{" "}}); return err }},
		{"cleanup negative timeout", func() error { _, err := c.Cleanup(ctx, CleanupOptions{Timeout: -time.Second}); return err }},
		{"bad host", func() error { _, err := NewClient(Options{Host: "http://[::1"}); return err }},
		{"bad OLLAMA_HOST", func() error {
			_, err := NewClient(Options{Getenv: func(string) string { return "ftp://x" }})
			return err
		}},
		{"negative client timeout", func() error { _, err := NewClient(Options{Timeouts: Timeouts{Total: -1}}); return err }},
		{"verify VRAM without reader", func() error { _, err := NewClient(Options{VerifyVRAM: true}); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, KindInvalidInput) {
				t.Fatalf("got %v (kind %v), want invalid input", err, KindOf(err))
			}
		})
	}
	if n := s.Requests(""); n != 0 {
		t.Errorf("invalid input reached the server %d times", n)
	}
}

func TestUnloadModelVerified(t *testing.T) {
	s := newSim(t, vramguardtest.Config{UnloadDelay: 50 * time.Millisecond}, vramguardtest.ModelConfig{Name: "tiny", Size: 3 << 30})
	var verified []UnloadReport
	c := newTestClient(t, s, Options{Hooks: Hooks{OnUnloadEnd: func(_ context.Context, e UnloadEnd) {
		if e.Err == nil && e.Report.Verified {
			verified = append(verified, *e.Report)
		}
	}}})
	if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveServerDefault, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := c.UnloadModel(t.Context(), "TINY:latest")
	if err != nil {
		t.Fatal(err)
	}
	// The reply came before removal; UnloadModel returned only after it.
	if s.Listed("tiny") {
		t.Fatal("UnloadModel returned while the server still lists the model")
	}
	if !rep.Verified || !rep.WasLoaded || rep.Size != 3<<30 || rep.Attempts < 1 || rep.Polls < 2 {
		t.Errorf("report %+v", rep)
	}
	if rep.Elapsed < 50*time.Millisecond {
		t.Errorf("elapsed %v is shorter than the server's unload delay", rep.Elapsed)
	}
	if len(verified) != 1 {
		t.Errorf("OnUnloadEnd told %d verified unloads; want 1", len(verified))
	}

	// Not loaded: verified at once, nothing was loaded.
	rep, err = c.UnloadModel(t.Context(), "tiny")
	if err != nil || rep.WasLoaded || !rep.Verified {
		t.Errorf("second unload: %+v, %v", rep, err)
	}
	// Unknown model.
	if _, err := c.UnloadModel(t.Context(), "nope"); !errors.Is(err, KindNotFound) {
		t.Errorf("unknown model: %v", err)
	}
}

// Ollama 0.17 loses an unload that arrives while the model loads; the
// simulator reproduces that by default. Close does not cut the client's
// generations: its unload lands during the load, is lost, and is sent
// again once the model is listed.
func TestUnloadLostDuringLoadIsResent(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 300 * time.Millisecond})
	var sent atomic.Int32
	c, err := NewClient(Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond,
		HTTPClient: unloadSpy(func(string) { sent.Add(1) })})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveServerDefault, nil)
		done <- err
	}()
	eventually(t, s, "load started", func() bool { r := s.Running(); return len(r) == 1 && r[0].Loading })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the generation failed: %v", err)
	}
	if s.Listed("tiny") {
		t.Fatal("the model is still resident after Close returned")
	}
	if sent.Load() < 2 {
		t.Errorf("%d unload requests: the lost unload was not sent again", sent.Load())
	}
}

func TestUnloadWaitsForInFlightRequest(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 20, TokenLatency: 10 * time.Millisecond})
	c := newTestClient(t, s, Options{})
	// Another program's request, made with the raw API client.
	raw := s.APIClient()
	var text strings.Builder
	var done atomic.Bool
	errc := make(chan error, 1)
	go func() {
		errc <- raw.Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "x"}, func(r api.GenerateResponse) error {
			text.WriteString(r.Response)
			if r.Done {
				done.Store(true)
			}
			return nil
		})
	}()
	if err := s.WaitInFlight(t.Context(), "tiny", 1); err != nil {
		t.Fatal(err)
	}
	rep, err := c.UnloadModel(t.Context(), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil || !done.Load() {
		t.Fatalf("the in-flight request did not complete normally: err %v, done %v", err, done.Load())
	}
	if s.Listed("tiny") || !rep.WasLoaded {
		t.Fatalf("listed %v, report %+v", s.Listed("tiny"), rep)
	}
}

func TestUnloadTimeout(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 1000, TokenLatency: 10 * time.Millisecond})
	c := newTestClient(t, s, Options{UnloadTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go s.APIClient().Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: "x"}, func(api.GenerateResponse) error { return nil })
	if err := s.WaitInFlight(t.Context(), "tiny", 1); err != nil {
		t.Fatal(err)
	}
	_, err := c.UnloadModel(t.Context(), "tiny")
	if !errors.Is(err, KindTimeout) || !errors.Is(err, ErrStillResident) {
		t.Fatalf("got %v, want a timeout wrapping ErrStillResident", err)
	}
	cancel()
	eventually(t, s, "request ended", func() bool { return s.InFlight("tiny") == 0 })
}

func TestUnloadAll(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"}, vramguardtest.ModelConfig{Name: "b"}, vramguardtest.ModelConfig{Name: "user/c:q4"})
	c := newTestClient(t, s, Options{})
	for _, m := range []string{"a", "b", "user/c:q4"} {
		if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: m, Prompt: "x"}, KeepAliveForever, nil); err != nil {
			t.Fatal(err)
		}
	}
	reps, err := c.UnloadAll(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 3 {
		t.Fatalf("%d reports", len(reps))
	}
	for _, r := range reps {
		if !r.Verified || !r.WasLoaded {
			t.Errorf("%+v", r)
		}
	}
	if ms, _ := c.Running(t.Context()); len(ms) != 0 {
		t.Errorf("still running: %v", ms)
	}
}

func TestCleanupOutlivesCanceledContext(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	c := newTestClient(t, s, Options{})
	if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveForever, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rep, err := c.Cleanup(ctx, CleanupOptions{Models: []string{"tiny"}, Release: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.Listed("tiny") || len(rep.Unloads) != 1 || !rep.Unloads[0].Verified || rep.Release == nil {
		t.Fatalf("listed %v, report %+v", s.Listed("tiny"), rep)
	}
}

func TestCleanupAsyncJoinedByClose(t *testing.T) {
	s := newSim(t, vramguardtest.Config{UnloadDelay: 100 * time.Millisecond}, vramguardtest.ModelConfig{Name: "a"}, vramguardtest.ModelConfig{Name: "b"})
	c, err := NewClient(Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a", "b"} {
		if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: m, Prompt: "x"}, KeepAliveServerDefault, nil); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	task := c.CleanupAsync(t.Context(), CleanupOptions{AllModels: true, Release: true})
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("CleanupAsync blocked for %v", d)
	}
	select {
	case <-task.Done():
		t.Fatal("cleanup finished before the server's unload delay: it did not verify")
	default:
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close joined the cleanup: it is over and nothing is resident.
	select {
	case <-task.Done():
	default:
		t.Fatal("Close returned before the cleanup ended")
	}
	rep, err := task.Wait()
	if err != nil || len(rep.Unloads) != 2 {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	if s.Listed("a") || s.Listed("b") {
		t.Fatal("models still resident after Close")
	}
	// A closed client refuses new work.
	if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "a", Prompt: "x"}, KeepAliveUnload, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("generate after Close: %v", err)
	}
	if _, err := c.CleanupAsync(t.Context(), CleanupOptions{}).Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("cleanup after Close: %v", err)
	}
}

type panicReader struct{}

func (panicReader) Snapshot(context.Context) (*VRAMSnapshot, error) { panic("driver exploded") }

func TestCleanupAsyncRecoversPanic(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	var failed atomic.Int32
	c, err := NewClient(Options{Host: s.URL().String(), VRAM: panicReader{}, Hooks: Hooks{OnCleanupFailed: func(context.Context, CleanupEvent) { failed.Add(1) }}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CleanupAsync(t.Context(), CleanupOptions{Release: true}).Wait()
	if !errors.Is(err, KindInternal) || !strings.Contains(err.Error(), "driver exploded") {
		t.Fatalf("got %v, want a KindInternal error naming the panic", err)
	}
	if failed.Load() != 1 {
		t.Errorf("OnCleanupFailed called %d times", failed.Load())
	}
	if err := c.Wait(); err == nil {
		t.Error("client Wait did not report the failed cleanup")
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close returned a failure that Wait already reported: %v", err)
	}
}

func TestCloseUnloadsWarmModels(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"}, vramguardtest.ModelConfig{Name: "b"})
	c, err := NewClient(Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "a", Prompt: "x"}, KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	// b was loaded by someone else: Close leaves it alone.
	if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "b", Prompt: "x"}, func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if s.Listed("a") || !s.Listed("b") {
		t.Fatalf("after Close: a listed %v (want false), b listed %v (want true)", s.Listed("a"), s.Listed("b"))
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

type fakeReader struct {
	mu    sync.Mutex
	free  []uint64 // successive Free values; the last repeats
	calls int
}

func (f *fakeReader) Snapshot(context.Context) (*VRAMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	free := f.free[min(f.calls, len(f.free)-1)]
	f.calls++
	return &VRAMSnapshot{Source: "simulated", Taken: time.Now(), Devices: []DeviceMemory{
		{Index: 0, Name: "fake", Total: 24 << 30, Free: free, Used: 24<<30 - free},
	}}, nil
}

func TestReleaseVRAM(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	r := &fakeReader{free: []uint64{1 << 30, 5 << 30}}
	c := newTestClient(t, s, Options{VRAM: r})
	var order []string
	register := func(name string, fn func(context.Context) error) (unregister func()) {
		un, err := c.RegisterTenant(Tenant{Name: name, Device: -1, Release: fn})
		if err != nil {
			t.Fatal(err)
		}
		return un
	}
	register("first", func(context.Context) error { order = append(order, "first"); return nil })
	unreg := register("second", func(context.Context) error { order = append(order, "second"); return errors.New("pool busy") })
	register("third", func(context.Context) error { order = append(order, "third"); panic("boom") })

	rep, err := c.ReleaseVRAM(t.Context())
	if !errors.Is(err, KindInternal) || !strings.Contains(err.Error(), "pool busy") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("got %v, want both failures as KindInternal", err)
	}
	if strings.Join(order, ",") != "first,second,third" || strings.Join(rep.Ran, ",") != "first,second,third" {
		t.Errorf("ran %v / %v", order, rep.Ran)
	}
	if freed := int64(rep.After.Device(0).Free) - int64(rep.Before.Device(0).Free); freed != 4<<30 {
		t.Errorf("freed %d, want %d", freed, 4<<30)
	}
	unreg()
	unreg()
	order = nil
	if _, err := c.ReleaseVRAM(t.Context()); err == nil || strings.Contains(err.Error(), "pool busy") {
		t.Errorf("after unregister: %v", err)
	}
	if strings.Join(order, ",") != "first,third" {
		t.Errorf("after unregister ran %v", order)
	}

	// Without a reader or tenants it succeeds and reports nothing.
	c2 := newTestClient(t, s, Options{})
	rep, err = c2.ReleaseVRAM(t.Context())
	if err != nil || rep.Before != nil || rep.After != nil {
		t.Errorf("no reader: %+v, %v", rep, err)
	}
}

func TestNewClientHost(t *testing.T) {
	tests := []struct {
		host, env, want string
	}{
		{"", "", "http://127.0.0.1:11434"},
		{"", "gpu-box", "http://gpu-box:11434"},
		{"", "gpu-box:8080", "http://gpu-box:8080"},
		{"", "https://gpu.example/ollama", "https://gpu.example:443/ollama"},
		{"http://[::1]:9999", "ignored:1", "http://[::1]:9999"},
		{"10.0.0.2", "", "http://10.0.0.2:11434"},
	}
	for _, tt := range tests {
		c, err := NewClient(Options{Host: tt.host, Getenv: func(k string) string {
			if k == "OLLAMA_HOST" {
				return tt.env
			}
			return ""
		}})
		if err != nil {
			t.Errorf("%q/%q: %v", tt.host, tt.env, err)
			continue
		}
		if Host(c) != tt.want {
			t.Errorf("%q/%q: host %q, want %q", tt.host, tt.env, Host(c), tt.want)
		}
		c.Close()
	}
}

func TestNormalizeModelName(t *testing.T) {
	tests := map[string]string{
		"tiny":                            "tiny:latest",
		"TINY":                            "tiny:latest",
		"tiny:latest":                     "tiny:latest",
		"library/tiny":                    "tiny:latest",
		"registry.ollama.ai/library/tiny": "tiny:latest",
		"user/tiny:q4":                    "user/tiny:q4",
		"hf.co/Org/Repo:Q4_K_M":           "hf.co/org/repo:q4_k_m",
		"localhost:5000/m":                "localhost:5000/m:latest",
		"tiny@sha256:abc":                 "tiny:latest",
		" llama3.2:3b ":                   "llama3.2:3b",
	}
	for in, want := range tests {
		if got := NormalizeModelName(in); got != want {
			t.Errorf("NormalizeModelName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseKeepAlive(t *testing.T) {
	tests := []struct {
		in   string
		want string
		err  bool
	}{
		{"", "default", false},
		{"default", "default", false},
		{"0", "0s", false},
		{"0s", "0s", false},
		{"unload", "0s", false},
		{"300", "5m0s", false},
		{"1.5", "1.5s", false},
		{"2m", "2m0s", false},
		{"-1", "-1", false},
		{"-5m", "-1", false},
		{"forever", "-1", false},
		{"soon", "", true},
		{"NaN", "", true},
		{"1e300", "", true},
		{"5 minutes", "", true},
	}
	for _, tt := range tests {
		ka, err := ParseKeepAlive(tt.in)
		if tt.err {
			if !errors.Is(err, KindInvalidInput) {
				t.Errorf("%q: got %v, want invalid input", tt.in, err)
			}
			continue
		}
		if err != nil || ka.String() != tt.want {
			t.Errorf("%q: got %v, %v; want %s", tt.in, ka, err, tt.want)
		}
	}
}

// Shutdown is bounded by its context, as net/http's is: when ctx ends
// first it returns KindCanceled while the work goes on; a later Close
// waits for that work and returns its result, and the client refuses
// calls from the start.
func TestShutdownBoundedByContext(t *testing.T) {
	const unloadDelay = time.Second
	s := newSim(t, vramguardtest.Config{UnloadDelay: unloadDelay}, vramguardtest.ModelConfig{Name: "tiny"})
	c, err := NewClient(Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GenerateStreaming(t.Context(), &GenerateRequest{Model: "tiny", Prompt: "x"}, KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = c.Shutdown(ctx)
	if took := time.Since(start); !errors.Is(err, KindCanceled) || !errors.Is(err, context.DeadlineExceeded) || took > unloadDelay/2 {
		t.Fatalf("Shutdown with a 20 ms context: %v after %v; want KindCanceled well before the %v unload", err, took, unloadDelay)
	}
	if _, err := c.Running(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Running during the shutdown: %v, want ErrClosed", err)
	}
	if !s.Listed("tiny") {
		t.Fatal("the model is gone already: the test's unload delay is too short to see the bound")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close after the canceled Shutdown: %v", err)
	}
	if s.Listed("tiny") {
		t.Error("Close returned before the shutdown's unload was verified")
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
