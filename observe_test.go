package vramguard_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

type ctxKey string

// recorder is a set of hooks that writes down what each saw, and the value
// its own start hook put in the context when the end hook ran.
type recorder struct {
	name string
	mu   sync.Mutex
	log  []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

func (r *recorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *recorder) hooks() vramguard.Hooks {
	k := ctxKey(r.name)
	mine := func(ctx context.Context) string {
		v, _ := ctx.Value(k).(string)
		return v
	}
	return vramguard.Hooks{
		OnCallStart: func(ctx context.Context, ev vramguard.CallStart) context.Context {
			r.add("call start " + ev.Op + " " + ev.Model)
			return context.WithValue(ctx, k, r.name+" call")
		},
		OnCallEnd: func(ctx context.Context, ev vramguard.CallEnd) {
			r.add("call end " + ev.Model + " ctx=" + mine(ctx) + " kind=" + vramguard.KindOf(ev.Err).String() +
				" loaded=" + map[bool]string{true: "yes", false: "no"}[ev.Generation != nil && ev.Generation.Loaded])
		},
		OnUnloadStart: func(ctx context.Context, ev vramguard.UnloadStart) context.Context {
			r.add("unload start " + ev.Model + " " + string(ev.Cause))
			return context.WithValue(ctx, k, r.name+" unload")
		},
		OnUnloadEnd: func(ctx context.Context, ev vramguard.UnloadEnd) {
			r.add("unload end " + ev.Model + " ctx=" + mine(ctx) + " verified=" + map[bool]string{true: "yes", false: "no"}[ev.Report.Verified])
		},
	}
}

// JoinHooks calls every set of hooks in order, and each end hook gets the
// context its own start hook returned, however many are joined and whether
// or not the others set a start hook.
func TestJoinHooks(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 20 * time.Millisecond})
	a, b := &recorder{name: "a"}, &recorder{name: "b"}
	var endOnly []string
	third := vramguard.Hooks{OnCallEnd: func(ctx context.Context, ev vramguard.CallEnd) {
		v, _ := ctx.Value(ctxKey("b")).(string)
		endOnly = append(endOnly, v) // no start of its own: sees the last start's context
	}}
	c := newTestClient(t, s, vramguard.Options{Hooks: vramguard.JoinHooks(a.hooks(), b.hooks(), third)})
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*recorder{a, b} {
		want := []string{
			"call start generate tiny",
			"call end tiny ctx=" + r.name + " call kind=unknown loaded=yes",
			"unload start tiny unload",
			"unload end tiny ctx=" + r.name + " unload verified=yes",
		}
		if got := r.lines(); !slices.Equal(got, want) {
			t.Errorf("hooks %s saw\n%q\nwant\n%q", r.name, got, want)
		}
	}
	if !slices.Equal(endOnly, []string{"b call"}) {
		t.Errorf("the end-only hook saw %q; want the context b's start returned", endOnly)
	}
}

// A start hook that panics or returns nil leaves the call's context as it
// was; the call goes on and its end hook runs.
func TestStartHookPanicsOrReturnsNil(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	for _, tc := range []struct {
		name  string
		start func(context.Context, vramguard.CallStart) context.Context
	}{
		{"panics", func(context.Context, vramguard.CallStart) context.Context { panic("boom") }},
		{"returns nil", func(context.Context, vramguard.CallStart) context.Context { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ended []error
			c := newTestClient(t, s, vramguard.Options{Hooks: vramguard.Hooks{
				OnCallStart: tc.start,
				OnCallEnd: func(ctx context.Context, ev vramguard.CallEnd) {
					if ctx == nil || ctx.Value(ctxKey("caller")) != "yes" {
						t.Error("OnCallEnd lost the caller's context")
					}
					ended = append(ended, ev.Err)
				},
			}})
			ctx := context.WithValue(t.Context(), ctxKey("caller"), "yes")
			if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
				t.Fatal(err)
			}
			if len(ended) != 1 || ended[0] != nil {
				t.Errorf("OnCallEnd saw %v; want one successful call", ended)
			}
		})
	}
}

// OnCallEnd is told about failures too, with the library's error (its kind
// says what failed), and about calls refused before anything was sent.
func TestCallEndSeesFailures(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	var ends []vramguard.CallEnd
	c := newTestClient(t, s, vramguard.Options{Hooks: vramguard.Hooks{
		OnCallEnd: func(_ context.Context, ev vramguard.CallEnd) { ends = append(ends, ev) },
	}})
	if err := s.FailNext("tiny", vramguardtest.CrashAfter(1)); err != nil {
		t.Fatal(err)
	}
	_, crash := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	_, missing := c.ChatStreaming(t.Context(), &vramguard.ChatRequest{Model: "nope", Messages: []api.Message{{Role: "user", Content: "x"}}}, vramguard.KeepAliveUnload, nil)
	if crash == nil || missing == nil {
		t.Fatalf("errors %v, %v; want both calls to fail", crash, missing)
	}
	want := []struct {
		op   string
		kind vramguard.Kind
	}{{"generate", vramguard.KindModelCrash}, {"chat", vramguard.KindOf(missing)}}
	if len(ends) != 2 {
		t.Fatalf("OnCallEnd ran %d times, want 2", len(ends))
	}
	for i, w := range want {
		e := ends[i]
		if e.Op != w.op || e.Generation != nil || vramguard.KindOf(e.Err) != w.kind || e.Server != s.URL().String() || e.Elapsed <= 0 {
			t.Errorf("end %d: %+v; want op %s, kind %v, no generation, the server and an elapsed time", i, e, w.op, w.kind)
		}
	}
}

// OnAdmission is told of each budget check: a refusal with the
// *RoomError, an admission after making room with MadeRoom; OnVRAMWait
// gets the context of the EnsureFree that waited.
func TestAdmissionAndWaitHooks(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	loadForever(t, s, "big")
	if err := s.Reserve("comfyui", 14*gib); err != nil { // 2 GiB free
		t.Fatal(err)
	}
	var evs []vramguard.AdmissionEvent
	var waits []string
	opts := vramguard.Options{VRAM: s.GPU(), Hooks: vramguard.Hooks{
		OnAdmission: func(_ context.Context, ev vramguard.AdmissionEvent) { evs = append(evs, ev) },
		OnVRAMWait: func(ctx context.Context, ev vramguard.VRAMWaitEvent) {
			v, _ := ctx.Value(ctxKey("caller")).(string)
			waits = append(waits, v)
		},
	}}
	opts.Budget = &vramguard.Budget{}
	refusing := newTestClient(t, s, opts)
	_, err := refusing.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	var be *vramguard.RoomError
	if !errors.As(err, &be) || be.Budget == nil {
		t.Fatalf("GenerateStreaming = %v; want a budget refusal", err)
	}
	opts.Budget = &vramguard.Budget{MakeRoom: true}
	making := newTestClient(t, s, opts)
	ctx := context.WithValue(t.Context(), ctxKey("caller"), "admit")
	if _, err := making.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
		t.Fatal(err)
	}
	est, err := making.EstimateModel(t.Context(), "mid", 0)
	if err != nil {
		t.Fatal(err)
	}
	need := uint64(est.Total)
	if len(evs) != 2 {
		t.Fatalf("OnAdmission ran %d times, want 2: %+v", len(evs), evs)
	}
	if r := evs[0]; r.Model != "mid" || r.Need != need || r.MadeRoom || !errors.As(r.Err, &be) || !errors.Is(r.Err, vramguard.KindOutOfMemory) {
		t.Errorf("refusal event %+v; want mid, its estimate and the RoomError", r)
	}
	if a := evs[1]; a.Err != nil || !a.MadeRoom || a.Need != need {
		t.Errorf("admission event %+v; want admitted after making room", a)
	}
	if !slices.Equal(waits, []string{"admit"}) {
		t.Errorf("OnVRAMWait contexts %q; want the admitted call's", waits)
	}
}

// OnUnloadStart and OnUnloadEnd see every cause of unload: a guard's
// cleanup, Phase.End, UnloadAll and Close, with the report.
func TestUnloadHooksSeeEveryCause(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"}, vramguardtest.ModelConfig{Name: "b"})
	var mu sync.Mutex
	var got []string
	c := newTestClient(t, s, vramguard.Options{Hooks: vramguard.Hooks{
		OnUnloadStart: func(ctx context.Context, ev vramguard.UnloadStart) context.Context {
			return context.WithValue(ctx, ctxKey("u"), string(ev.Cause))
		},
		OnUnloadEnd: func(ctx context.Context, ev vramguard.UnloadEnd) {
			mu.Lock()
			defer mu.Unlock()
			if ctx.Value(ctxKey("u")) != string(ev.Cause) || ev.Report == nil || ev.Report.Cause != ev.Cause {
				t.Errorf("end %+v: context or report does not match its start", ev)
			}
			got = append(got, string(ev.Cause)+" "+vramguard.NormalizeModelName(ev.Model))
		},
	}})
	gen := func(model string, ka vramguard.KeepAlive) {
		t.Helper()
		if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: model, Prompt: "x"}, ka, nil); err != nil {
			t.Fatal(err)
		}
	}
	session := func(ctx context.Context, ss *vramguard.Session) error {
		_, err := ss.Generate(ctx, &vramguard.GenerateRequest{Prompt: "x"}, nil)
		return err
	}
	g := vramguard.Guard{Client: c}
	if err := g.Run(t.Context(), "a", session); err != nil {
		t.Fatal(err)
	}
	p, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{NoLease: true})
	if err != nil {
		t.Fatal(err)
	}
	pg := p.Guard()
	if err := pg.Run(t.Context(), "b", session); err != nil {
		t.Fatal(err)
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Fatal(err)
	}
	gen("a", vramguard.KeepAliveForever)
	if _, err := c.UnloadAll(t.Context()); err != nil {
		t.Fatal(err)
	}
	gen("b", vramguard.KeepAliveForever)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{"guard a:latest", "phase end b:latest", "unload all a:latest", "close b:latest"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("unloads seen %q; want %q", got, want)
	}
}

// A joined start hook that panics leaves the other side's context in
// place: the other side's end hook still sees what its start returned (an
// adapter's span is still ended), and the call goes on.
func TestJoinHooksPanickingSide(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	for _, first := range []bool{true, false} {
		t.Run(map[bool]string{true: "panicking side first", false: "panicking side last"}[first], func(t *testing.T) {
			a := &recorder{name: "a"}
			boom := vramguard.Hooks{OnCallStart: func(context.Context, vramguard.CallStart) context.Context { panic("boom") }}
			hs := []vramguard.Hooks{a.hooks(), boom, (&recorder{name: "c"}).hooks()}
			if first {
				hs = []vramguard.Hooks{boom, a.hooks()}
			}
			c := newTestClient(t, s, vramguard.Options{Hooks: vramguard.JoinHooks(hs...)})
			if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(a.lines(), "call end tiny ctx=a call kind=unknown loaded=yes") {
				t.Errorf("a saw %q; want its end hook with its own context", a.lines())
			}
		})
	}
}

// OnCallEnd runs once for a call whose ChunkFunc panics, with a
// KindInternal error, and the panic goes on with its own value.
func TestCallEndOnPanic(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	var ends []vramguard.CallEnd
	c := newTestClient(t, s, vramguard.Options{Hooks: vramguard.Hooks{
		OnCallEnd: func(_ context.Context, e vramguard.CallEnd) { ends = append(ends, e) },
	}})
	var got any
	func() {
		defer func() { got = recover() }()
		_, _ = c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"},
			vramguard.KeepAliveUnload, func(vramguard.Chunk) error { panic("boom") })
	}()
	if got != "boom" {
		t.Errorf("recovered %v; want the ChunkFunc's own panic value", got)
	}
	if len(ends) != 1 || ends[0].Generation != nil || !errors.Is(ends[0].Err, vramguard.KindInternal) {
		t.Errorf("OnCallEnd saw %+v; want one end with a KindInternal error", ends)
	}
}
