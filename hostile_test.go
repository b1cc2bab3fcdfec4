package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/hostile"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Hostile input for every public entry point: each call must return at
// once (or within its own timeouts), never panic, and fail only with an
// *Error of an expected kind. Cases whose kinds list vramguard.KindUnknown
// may also succeed.

type hostileCase struct {
	name  string
	call  func(ctx context.Context) error
	kinds []vramguard.Kind // accepted kinds; KindUnknown: success accepted
}

var (
	invalidOnly  = hostile.InvalidOnly
	canceledOnly = hostile.CanceledOnly
	successOnly  = hostile.SuccessOnly
	notFoundOnly = hostile.NotFoundOnly
	unavailable  = hostile.UnavailableOnly
)

// runHostile runs a case and checks the contract (internal/testkit/hostile).
func runHostile(t *testing.T, ctx context.Context, tc hostileCase) {
	t.Helper()
	hostile.Run(t, ctx, hostile.Case{Name: tc.name, Call: tc.call, Kinds: tc.kinds})
}

func hostileSim(t *testing.T) (*vramguardtest.Server, *vramguard.OllamaClient) {
	t.Helper()
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", Chunks: 4}}})
	t.Cleanup(s.Close)
	tr := &http.Transport{}
	c, err := vramguard.NewClient(vramguard.Options{
		Host:          s.URL().String(),
		HTTPClient:    &http.Client{Transport: tr},
		PollInterval:  5 * time.Millisecond,
		UnloadTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		tr.CloseIdleConnections()
	})
	return s, c
}

func gen(c *vramguard.OllamaClient, req *vramguard.GenerateRequest, ka vramguard.KeepAlive) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.GenerateStreaming(ctx, req, ka, nil)
		return err
	}
}

func withOpts(opts map[string]any) *vramguard.GenerateRequest {
	return &vramguard.GenerateRequest{Model: "tiny", Prompt: "x", Options: opts}
}

// TestHostileClientInputs covers NewClient and the client's methods.
func TestHostileClientInputs(t *testing.T) {
	_, c := hostileSim(t)
	long := strings.Repeat("m", 513)
	tenMB := strings.Repeat("a castle at dawn ", 10<<20/17)
	tests := []hostileCase{
		// NewClient
		{"host blank", newClientErr(vramguard.Options{Host: " \t "}), invalidOnly},
		{"host NUL", newClientErr(vramguard.Options{Host: "http://a\x00b"}), invalidOnly},
		{"host no name", newClientErr(vramguard.Options{Host: "http://:80"}), invalidOnly},
		{"host scheme", newClientErr(vramguard.Options{Host: "unix:///var/run/ollama.sock"}), invalidOnly},
		{"host 1 MB", newClientErr(vramguard.Options{Host: strings.Repeat("h", 1<<20)}), append([]vramguard.Kind{vramguard.KindUnknown}, invalidOnly...)},
		{"OLLAMA_HOST garbage", newClientErr(vramguard.Options{Getenv: func(string) string { return "\xff\xfe" }}), append([]vramguard.Kind{vramguard.KindUnknown}, invalidOnly...)},
		{"negative timeouts", newClientErr(vramguard.Options{Timeouts: vramguard.Timeouts{FirstChunk: -1}}), invalidOnly},
		{"negative unload timeout", newClientErr(vramguard.Options{UnloadTimeout: -time.Hour}), invalidOnly},
		{"min int64 poll", newClientErr(vramguard.Options{PollInterval: math.MinInt64}), invalidOnly},
		{"port out of range", func(ctx context.Context) error {
			c, err := vramguard.NewClient(vramguard.Options{Host: "127.0.0.1:99999"})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
			return err
		}, append([]vramguard.Kind{vramguard.KindInvalidInput}, unavailable...)},

		// GenerateStreaming: names
		{"nil request", gen(c, nil, vramguard.KeepAliveUnload), invalidOnly},
		{"empty model", gen(c, &vramguard.GenerateRequest{Prompt: "x"}, vramguard.KeepAliveUnload), invalidOnly},
		{"whitespace model", gen(c, &vramguard.GenerateRequest{Model: " \t\n", Prompt: "x"}, vramguard.KeepAliveUnload), invalidOnly},
		{"padded model", gen(c, &vramguard.GenerateRequest{Model: " tiny ", Prompt: "x"}, vramguard.KeepAliveUnload), invalidOnly},
		{"NUL in model", gen(c, &vramguard.GenerateRequest{Model: "ti\x00ny", Prompt: "x"}, vramguard.KeepAliveUnload), invalidOnly},
		{"invalid UTF-8 model", gen(c, &vramguard.GenerateRequest{Model: "\xff\xfe", Prompt: "x"}, vramguard.KeepAliveUnload), invalidOnly},
		{"513-byte model", gen(c, &vramguard.GenerateRequest{Model: long, Prompt: "x"}, vramguard.KeepAliveUnload), invalidOnly},
		{"emoji model", gen(c, &vramguard.GenerateRequest{Model: "🙂", Prompt: "x"}, vramguard.KeepAliveUnload), append(notFoundOnly, vramguard.KindInvalidInput)},
		{"unknown model", gen(c, &vramguard.GenerateRequest{Model: "nope:7b", Prompt: "x"}, vramguard.KeepAliveUnload), notFoundOnly},

		// GenerateStreaming: prompts
		{"empty prompt", gen(c, &vramguard.GenerateRequest{Model: "tiny"}, vramguard.KeepAliveUnload), successOnly},
		{"invalid UTF-8 prompt", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "a\xc3\x28"}, vramguard.KeepAliveUnload), invalidOnly},
		{"invalid UTF-8 system", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x", System: "\xed\xa0\x80"}, vramguard.KeepAliveUnload), invalidOnly},
		{"NUL and controls in prompt", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "a\x00b\x1b[2J\u202e"}, vramguard.KeepAliveUnload), successOnly},
		{"10 MB prompt", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: tenMB}, vramguard.KeepAliveUnload), successOnly},
		{"prompt over MaxPromptBytes", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: strings.Repeat("a", vramguard.MaxPromptBytes), System: "s"}, vramguard.KeepAliveUnload), invalidOnly},

		// GenerateStreaming: sampling options. Values JSON cannot carry
		// (NaN, ±Inf, functions) must be refused before any request, as
		// the caller's input; finite values out of Ollama's range pass
		// through (Ollama accepts a temperature of -5 or a top_p of 7).
		{"NaN temperature", gen(c, withOpts(map[string]any{"temperature": math.NaN()}), vramguard.KeepAliveUnload), invalidOnly},
		{"+Inf top_p", gen(c, withOpts(map[string]any{"top_p": math.Inf(1)}), vramguard.KeepAliveUnload), invalidOnly},
		{"-Inf seed", gen(c, withOpts(map[string]any{"seed": math.Inf(-1)}), vramguard.KeepAliveUnload), invalidOnly},
		{"NaN float32", gen(c, withOpts(map[string]any{"temperature": float32(math.NaN())}), vramguard.KeepAliveUnload), invalidOnly},
		{"func option", gen(c, withOpts(map[string]any{"stop": func() {}}), vramguard.KeepAliveUnload), invalidOnly},
		{"channel option", gen(c, withOpts(map[string]any{"stop": make(chan int)}), vramguard.KeepAliveUnload), invalidOnly},
		{"NaN nested", gen(c, withOpts(map[string]any{"x": []any{1, math.NaN()}}), vramguard.KeepAliveUnload), invalidOnly},
		{"temperature 1e308", gen(c, withOpts(map[string]any{"temperature": 1e308}), vramguard.KeepAliveUnload), successOnly},
		{"negative num_predict", gen(c, withOpts(map[string]any{"num_predict": -7}), vramguard.KeepAliveUnload), successOnly},
		{"temperature as text", gen(c, withOpts(map[string]any{"temperature": "hot"}), vramguard.KeepAliveUnload), successOnly},
		{"unknown option", gen(c, withOpts(map[string]any{"\xff": nil}), vramguard.KeepAliveUnload), successOnly},

		// GenerateStreaming: timeouts and keep-alives
		{"negative per-call timeout", gen(c, &vramguard.GenerateRequest{Model: "tiny", Timeouts: vramguard.Timeouts{Total: math.MinInt64}}, vramguard.KeepAliveUnload), invalidOnly},
		{"max timeouts", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x", Timeouts: vramguard.Timeouts{FirstChunk: math.MaxInt64, Idle: math.MaxInt64, Total: math.MaxInt64}}, vramguard.KeepAliveUnload), successOnly},
		{"1ns timeouts", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x", Timeouts: vramguard.Timeouts{FirstChunk: 1, Idle: 1, Total: 1}}, vramguard.KeepAliveUnload), []vramguard.Kind{vramguard.KindTimeout}},
		{"zero KeepAlive value", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAlive{}), successOnly},
		{"negative KeepAliveFor", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(math.MinInt64)), successOnly},
		{"max KeepAliveFor", gen(c, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(math.MaxInt64)), successOnly},
		{"chunk callback error", func(ctx context.Context) error {
			_, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload,
				func(vramguard.Chunk) error { return errors.New("stop") })
			return err
		}, canceledOnly},

		// Other client methods
		{"unload empty", func(ctx context.Context) error { _, err := c.UnloadModel(ctx, ""); return err }, invalidOnly},
		{"unload whitespace", func(ctx context.Context) error { _, err := c.UnloadModel(ctx, "\u00a0"); return err }, append(invalidOnly, vramguard.KindNotFound)},
		{"unload invalid UTF-8", func(ctx context.Context) error { _, err := c.UnloadModel(ctx, "\xc0"); return err }, invalidOnly},
		{"unload unknown", func(ctx context.Context) error { _, err := c.UnloadModel(ctx, "nope"); return err }, notFoundOnly},
		{"unload 1 MB name", func(ctx context.Context) error { _, err := c.UnloadModel(ctx, strings.Repeat("a", 1<<20)); return err }, invalidOnly},
		{"is resident blank", func(ctx context.Context) error { _, err := c.IsResident(ctx, " "); return err }, invalidOnly},
		{"users of garbage", func(context.Context) error { _ = vramguard.Users(c, "\xff\x00"); return nil }, successOnly},
		{"cleanup blank model", func(ctx context.Context) error {
			_, err := c.Cleanup(ctx, vramguard.CleanupOptions{Models: []string{"tiny", ""}})
			return err
		}, invalidOnly},
		{"cleanup negative timeout", func(ctx context.Context) error {
			_, err := c.Cleanup(ctx, vramguard.CleanupOptions{Timeout: math.MinInt64})
			return err
		}, invalidOnly},
		{"cleanup 200 duplicate models", func(ctx context.Context) error {
			rep, err := c.Cleanup(ctx, vramguard.CleanupOptions{Models: append(repeat("TINY:latest", 200), "tiny")})
			if err == nil && len(rep.Unloads) != 1 {
				return fmt.Errorf("%d unload reports for one model named 201 times; want one", len(rep.Unloads))
			}
			return err
		}, successOnly},
		{"cleanup unknown models", func(ctx context.Context) error {
			_, err := c.Cleanup(ctx, vramguard.CleanupOptions{Models: []string{"nope", "nada"}})
			return err
		}, successOnly}, // a model the server does not know is not resident
		{"cleanup async blank", func(ctx context.Context) error {
			_, err := c.CleanupAsync(ctx, vramguard.CleanupOptions{Models: []string{"\t"}}).Wait()
			return err
		}, invalidOnly},
		{"register a tenant without name or release", func(ctx context.Context) error {
			_, err := c.RegisterTenant(vramguard.Tenant{})
			return err
		}, invalidOnly},
		{"register a tenant on device MinInt", func(ctx context.Context) error {
			_, err := c.RegisterTenant(vramguard.Tenant{Name: "x", Device: math.MinInt, Release: func(context.Context) error { return nil }})
			return err
		}, invalidOnly},
		{"release that panics", func(ctx context.Context) error {
			un, err := c.RegisterTenant(vramguard.Tenant{Name: "\xff", Device: -1, Release: func(context.Context) error { panic(nil) }})
			if err != nil {
				return err
			}
			defer un()
			_, err = c.ReleaseVRAM(ctx)
			return err
		}, []vramguard.Kind{vramguard.KindInternal}},
		{"ensure free over MaxBytes", func(ctx context.Context) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: math.MaxUint64})
			return err
		}, invalidOnly},
		{"ensure free reserve over MaxBytes", func(ctx context.Context) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 1, Reserve: vramguard.MaxBytes + 1})
			return err
		}, invalidOnly},
		{"ensure free negative device", func(ctx context.Context) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Device: math.MinInt})
			return err
		}, invalidOnly},
		{"model blob empty", func(ctx context.Context) error { _, err := c.ModelBlob(ctx, ""); return err }, invalidOnly},
		{"model blob NUL", func(ctx context.Context) error { _, err := c.ModelBlob(ctx, "ti\x00ny"); return err }, invalidOnly},
		{"model blob 1 MB name", func(ctx context.Context) error { _, err := c.ModelBlob(ctx, strings.Repeat("a", 1<<20)); return err }, invalidOnly},
		{"model blob unknown", func(ctx context.Context) error { _, err := c.ModelBlob(ctx, "nope:7b"); return err }, notFoundOnly},
		{"ensure free without reader", func(ctx context.Context) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Device: math.MaxInt, Bytes: vramguard.MaxBytes})
			return err
		}, invalidOnly}, // no reader: ErrNoVRAMReader unless AllModels
		{"ensure free without reader, all models", func(ctx context.Context) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Device: math.MaxInt, Bytes: vramguard.MaxBytes, AllModels: true})
			return err
		}, successOnly}, // no reader: it can only unload everything
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runHostile(t, t.Context(), tc) })
	}
}

func newClientErr(opts vramguard.Options) func(context.Context) error {
	return func(context.Context) error {
		c, err := vramguard.NewClient(opts)
		if err == nil {
			return c.Close()
		}
		return err
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestHostileCanceledContext: every call that takes a context returns
// KindCanceled, fast, when the context is already done, except the
// cleanups, which deliberately outlive the caller's cancellation.
func TestHostileCanceledContext(t *testing.T) {
	s, c := hostileSim(t)
	reader := &fixedReader{free: 1 << 30, total: 8 << 30}
	cause := errors.New("caller gave up")
	canceled, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel2()
	g := vramguard.Guard{Client: c}
	req := &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}
	tests := []hostileCase{
		{"generate", gen(c, req, vramguard.KeepAliveUnload), canceledOnly},
		{"unload", func(ctx context.Context) error { _, err := c.UnloadModel(ctx, "tiny"); return err }, canceledOnly},
		{"unload all", func(ctx context.Context) error { _, err := c.UnloadAll(ctx); return err }, canceledOnly},
		{"running", func(ctx context.Context) error { _, err := c.Running(ctx); return err }, canceledOnly},
		{"list models", func(ctx context.Context) error { _, err := c.ListModels(ctx); return err }, canceledOnly},
		{"is resident", func(ctx context.Context) error { _, err := c.IsResident(ctx, "tiny"); return err }, canceledOnly},
		{"model blob", func(ctx context.Context) error { _, err := c.ModelBlob(ctx, "tiny"); return err }, canceledOnly},
		{"ensure free", func(ctx context.Context) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 1, AllModels: true})
			return err
		}, canceledOnly},
		{"await free", func(ctx context.Context) error {
			_, err := vramguard.AwaitFree(ctx, reader, vramguard.AwaitRequest{Bytes: 4 << 30})
			return err
		}, canceledOnly},
		{"guard run", func(ctx context.Context) error {
			return g.Run(ctx, "tiny", func(ctx context.Context, s *vramguard.Session) error {
				_, err := s.Generate(ctx, &vramguard.GenerateRequest{Prompt: "x"}, nil)
				return err
			})
		}, canceledOnly},
		{"guard generate", func(ctx context.Context) error { _, err := g.Generate(ctx, req, nil); return err }, canceledOnly},
		{"cleanup runs anyway", func(ctx context.Context) error {
			_, err := c.Cleanup(ctx, vramguard.CleanupOptions{Models: []string{"tiny"}, Release: true})
			return err
		}, successOnly},
		{"cleanup async runs anyway", func(ctx context.Context) error {
			_, err := c.CleanupAsync(ctx, vramguard.CleanupOptions{AllModels: true}).Wait()
			return err
		}, successOnly},
		{"start phase", func(ctx context.Context) error {
			ph, err := c.StartPhase(ctx, "p", vramguard.PhaseOptions{})
			if err != nil {
				return err
			}
			pg := ph.Guard()
			_, err = pg.Generate(ctx, req, nil)
			if _, eerr := ph.End(ctx); eerr != nil {
				return eerr
			}
			return err
		}, append(canceledOnly, vramguard.KindInvalidInput)}, // the phase may have ended first
	}
	for _, ctx := range []struct {
		name string
		ctx  context.Context
	}{{"canceled", canceled}, {"deadline passed", expired}} {
		for _, tc := range tests {
			t.Run(ctx.name+"/"+tc.name, func(t *testing.T) {
				runHostile(t, ctx.ctx, tc)
			})
		}
	}
	if err := c.Wait(); err != nil {
		t.Errorf("Wait: %v", err)
	}
	if n := s.Stats("tiny").Loads; n != 0 {
		t.Errorf("a canceled call loaded the model %d times", n)
	}
}

type fixedReader struct{ free, total uint64 }

func (r *fixedReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &vramguard.VRAMSnapshot{Source: "simulated", Taken: time.Now(), Devices: []vramguard.DeviceMemory{
		{Index: 0, Total: r.total, Free: r.free, Used: r.total - r.free},
	}}, nil
}

type funcReader func(context.Context) (*vramguard.VRAMSnapshot, error)

func (f funcReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) { return f(ctx) }

// TestHostileLifecycle covers Guard, Session and Phase with bad inputs.
func TestHostileLifecycle(t *testing.T) {
	_, c := hostileSim(t)
	var nilGuard *vramguard.Guard
	noop := func(context.Context, *vramguard.Session) error { return nil }
	ended, err := c.StartPhase(t.Context(), "ended", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ended.End(t.Context()); err != nil {
		t.Fatal(err)
	}
	tests := []hostileCase{
		{"nil guard", func(ctx context.Context) error { return nilGuard.Run(ctx, "tiny", noop) }, invalidOnly},
		{"nil guard generate", func(ctx context.Context) error {
			_, err := nilGuard.Generate(ctx, &vramguard.GenerateRequest{Model: "tiny"}, nil)
			return err
		}, invalidOnly},
		{"zero guard", func(ctx context.Context) error { return (&vramguard.Guard{}).Run(ctx, "tiny", noop) }, invalidOnly},
		{"nil fn", func(ctx context.Context) error { return (&vramguard.Guard{Client: c}).Run(ctx, "tiny", nil) }, invalidOnly},
		{"blank model", func(ctx context.Context) error { return (&vramguard.Guard{Client: c}).Run(ctx, "  ", noop) }, invalidOnly},
		{"nil request", func(ctx context.Context) error {
			_, err := (&vramguard.Guard{Client: c}).Generate(ctx, nil, nil)
			return err
		}, invalidOnly},
		{"session nil request", func(ctx context.Context) error {
			return (&vramguard.Guard{Client: c}).Run(ctx, "tiny", func(ctx context.Context, s *vramguard.Session) error {
				_, err := s.Generate(ctx, nil, nil)
				return err
			})
		}, invalidOnly},
		{"session other model", func(ctx context.Context) error {
			return (&vramguard.Guard{Client: c}).Run(ctx, "tiny", func(ctx context.Context, s *vramguard.Session) error {
				_, err := s.Generate(ctx, &vramguard.GenerateRequest{Model: "other", Prompt: "x"}, nil)
				return err
			})
		}, invalidOnly},
		{"ended phase guard", func(ctx context.Context) error {
			g := ended.Guard()
			_, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, nil)
			return err
		}, invalidOnly},
		{"phase negative timeout", func(ctx context.Context) error {
			_, err := c.StartPhase(ctx, "p", vramguard.PhaseOptions{Timeout: math.MinInt64})
			return err
		}, invalidOnly},
		{"phase need over MaxBytes", func(ctx context.Context) error {
			_, err := c.StartPhase(ctx, "p", vramguard.PhaseOptions{NeedBytes: math.MaxUint64})
			return err
		}, invalidOnly},
		{"phase garbage name, ended twice", func(ctx context.Context) error {
			ph, err := c.StartPhase(ctx, "\xff\x00"+strings.Repeat("p", 1<<16), vramguard.PhaseOptions{KeepAlive: vramguard.KeepAliveFor(time.Millisecond)})
			if err != nil {
				return err
			}
			_, err1 := ph.End(ctx)
			_, err2 := ph.End(ctx)
			return errors.Join(err1, err2)
		}, successOnly},
		{"phase need without reader", func(ctx context.Context) error {
			ph, err := c.StartPhase(ctx, "p", vramguard.PhaseOptions{NeedBytes: vramguard.MaxBytes, Device: math.MaxInt})
			if err != nil {
				return err
			}
			_, err = ph.End(ctx)
			return err
		}, invalidOnly}, // without a reader the hand-over cannot measure: ErrNoVRAMReader
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runHostile(t, t.Context(), tc) })
	}
}

// TestHostileVRAM covers AwaitFree.
func TestHostileVRAM(t *testing.T) {
	fast := vramguard.AwaitRequest{PollInterval: time.Millisecond, Timeout: 50 * time.Millisecond}
	with := func(f func(*vramguard.AwaitRequest)) vramguard.AwaitRequest { r := fast; f(&r); return r }
	await := func(r vramguard.VRAMReader, req vramguard.AwaitRequest) func(context.Context) error {
		return func(ctx context.Context) error { _, err := vramguard.AwaitFree(ctx, r, req); return err }
	}
	good := &fixedReader{free: 1 << 30, total: 8 << 30}
	nilSnap := funcReader(func(context.Context) (*vramguard.VRAMSnapshot, error) { return nil, nil })
	failing := funcReader(func(context.Context) (*vramguard.VRAMSnapshot, error) { return nil, errors.New("driver wedged") })
	noDevices := funcReader(func(context.Context) (*vramguard.VRAMSnapshot, error) { return &vramguard.VRAMSnapshot{}, nil })
	zeroTotal := funcReader(func(context.Context) (*vramguard.VRAMSnapshot, error) {
		return &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Index: 0}}}, nil
	})
	liar := funcReader(func(context.Context) (*vramguard.VRAMSnapshot, error) {
		return &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Index: 0, Total: 1, Free: math.MaxUint64, Used: math.MaxUint64,
			ProcessesKnown: true, Processes: []vramguard.GPUProcess{{PID: math.MaxUint32, UsedBytes: math.MaxUint64, UsedKnown: true, Command: "\xff"}}}}}, nil
	})
	tests := []hostileCase{
		{"nil reader", await(nil, fast), invalidOnly},
		{"negative device", await(good, with(func(r *vramguard.AwaitRequest) { r.Device = -1 })), invalidOnly},
		{"bytes over MaxBytes", await(good, with(func(r *vramguard.AwaitRequest) { r.Bytes = math.MaxUint64 })), invalidOnly},
		{"reserve over MaxBytes", await(good, with(func(r *vramguard.AwaitRequest) { r.Reserve = vramguard.MaxBytes + 1 })), invalidOnly},
		{"max bytes and reserve", await(good, with(func(r *vramguard.AwaitRequest) { r.Bytes, r.Reserve = vramguard.MaxBytes, vramguard.MaxBytes })), invalidOnly},
		{"negative interval", await(good, with(func(r *vramguard.AwaitRequest) { r.PollInterval = -1 })), invalidOnly},
		{"negative timeout", await(good, with(func(r *vramguard.AwaitRequest) { r.Timeout = math.MinInt64 })), invalidOnly},
		{"1ns interval", await(good, with(func(r *vramguard.AwaitRequest) { r.PollInterval, r.Bytes = 1, 2<<30 })), []vramguard.Kind{vramguard.KindTimeout}},
		{"missing device", await(good, with(func(r *vramguard.AwaitRequest) { r.Device = math.MaxInt })), notFoundOnly},
		{"more than the device has", await(good, with(func(r *vramguard.AwaitRequest) { r.Bytes = 9 << 30 })), invalidOnly},
		{"reader returns nil, nil", await(nilSnap, fast), []vramguard.Kind{vramguard.KindTimeout}},
		{"reader always fails", await(failing, fast), []vramguard.Kind{vramguard.KindTimeout}},
		{"reader lists no device", await(noDevices, fast), notFoundOnly},
		{"reader reports no figures", await(zeroTotal, fast), unavailable},
		{"reader lies", await(liar, with(func(r *vramguard.AwaitRequest) { r.Bytes = 1 })), successOnly},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runHostile(t, t.Context(), tc) })
	}
}

// TestHostileParsers covers ParseKeepAlive and NormalizeModelName.
func TestHostileParsers(t *testing.T) {
	for _, s := range []string{
		"", " ", "\x00", "NaN", "nan", "-nan", "inf", "+Inf", "-Inf", "1e309", "-1e309", "1e-400",
		"9223372036.854775807", "9223372036.854775", "-0", "0x1p-2", "0x", "1_000", "٣", "5m\x00",
		"2562047h47m16.854775807s", "2562047h48m", "-2562047h48m", "1ns", "999999999999999999999h",
		strings.Repeat("9", 1<<16), strings.Repeat("1h", 1<<12), "\xff\xfe", "forever ", " UNLOAD",
	} {
		ka, err := vramguard.ParseKeepAlive(s)
		if err != nil {
			if !errors.Is(err, vramguard.KindInvalidInput) {
				t.Errorf("ParseKeepAlive(%.40q): %v, want invalid input", s, err)
			}
			continue
		}
		back, err := vramguard.ParseKeepAlive(ka.String())
		if err != nil || back != ka {
			t.Errorf("ParseKeepAlive(%.40q) = %v, which reads back as %v, %v", s, ka, back, err)
		}
	}
	for _, s := range []string{"", "\xff", "library/", "https://", "a@", "@", ":", "/", "A/B/C:D@E", strings.Repeat("ü/", 1<<12)} {
		n := vramguard.NormalizeModelName(s)
		if again := vramguard.NormalizeModelName(n); again != n {
			t.Errorf("NormalizeModelName(%.40q) = %.40q, then %.40q", s, n, again)
		}
	}
}

// TestHostilePanickingChunkFunc: a chunk callback that panics (a caller's
// bug) lets the panic through to the caller, and leaves the client
// usable: the generation no longer counts as in flight, so an unload
// right after is verified at once instead of waiting out UnloadTimeout
// for a generation that will never end.
func TestHostilePanickingChunkFunc(t *testing.T) {
	s, c := hostileSim(t)
	var calls atomic.Int32
	panicky := func(vramguard.Chunk) error {
		calls.Add(1)
		panic("progress bar exploded")
	}
	func() {
		defer func() {
			if r := recover(); r != "progress bar exploded" {
				t.Fatalf("recovered %v, want the callback's panic", r)
			}
		}()
		_, _ = c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveForever, panicky)
	}()
	start := time.Now()
	rep, err := c.UnloadModel(t.Context(), "tiny")
	d := time.Since(start)
	if err != nil || !rep.Verified {
		t.Fatalf("unload after the panic: %v (report %+v)", err, rep)
	}
	if d > 2*time.Second {
		t.Errorf("unload after the panic took %v: the panicked generation still counts as in flight", d)
	}
	if s.Listed("tiny") {
		t.Error("model resident after the verified unload")
	}

	// The same through a guard: the panic reaches the caller after the
	// guard's cleanup, which must not wait for the dead generation either.
	g := vramguard.Guard{Client: c}
	start = time.Now()
	func() {
		defer func() { _ = recover() }()
		_, _ = g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, panicky)
	}()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the panic reached the caller after %v: the guard's cleanup waited for the dead generation", d)
	}
	if calls.Load() != 2 {
		t.Errorf("callback called %d times", calls.Load())
	}
}
