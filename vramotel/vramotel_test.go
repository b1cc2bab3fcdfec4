package vramotel_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramotel"
)

const loadLatency = 30 * time.Millisecond // above the client's LoadThreshold of 10 ms

// A phase over two models, a generation and a chat: a client span per
// call with the GenAI attributes, a load span under each, an unload span
// per model from Phase.End, and the loads, durations and token usage in
// the metrics.
func TestPhaseTrace(t *testing.T) {
	r := newRig(t, vramotel.Config{})
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "a", LoadLatency: loadLatency, Chunks: 3},
		vramguardtest.ModelConfig{Name: "b", LoadLatency: loadLatency, Chunks: 4})
	c := r.client(s, vramguard.Options{})
	p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Guard()
	if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "a castle"}, nil); err != nil {
		t.Fatal(err)
	}
	chat := &vramguard.ChatRequest{Model: "b", Messages: []api.Message{{Role: "user", Content: "a castle"}}}
	if _, err := g.Chat(t.Context(), chat, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Fatal(err)
	}

	port, _ := strconv.Atoi(s.URL().Port())
	for _, tc := range []struct {
		span, model, op string
		output          int64
	}{
		{"text_completion a", "a", vramotel.OperationTextCompletion, 3},
		{"chat b", "b", vramotel.OperationChat, 4},
	} {
		call := r.span(tc.span)
		if call.SpanKind != trace.SpanKindClient || call.Status.Code == codes.Error {
			t.Errorf("%s: kind %v, status %v", tc.span, call.SpanKind, call.Status)
		}
		want := map[string]attribute.Value{
			vramotel.AttrOperationName:     attribute.StringValue(tc.op),
			vramotel.AttrProviderName:      attribute.StringValue(vramotel.ProviderOllama),
			vramotel.AttrRequestModel:      attribute.StringValue(tc.model),
			vramotel.AttrServerAddress:     attribute.StringValue("127.0.0.1"),
			vramotel.AttrServerPort:        attribute.IntValue(port),
			vramotel.AttrUsageOutputTokens: attribute.Int64Value(tc.output),
			vramotel.AttrReloadCause:       attribute.StringValue(vramotel.ReloadCauseNone),
		}
		for k, v := range want {
			if got := attr(call, k); got != v {
				t.Errorf("%s: %s = %v, want %v", tc.span, k, got.String(), v.String())
			}
		}
		if attr(call, vramotel.AttrUsageInputTokens).AsInt64() <= 0 || attr(call, vramotel.AttrTimeToFirstChunk).AsFloat64() <= 0 {
			t.Errorf("%s: no input tokens or time to first chunk: %v", tc.span, call.Attributes)
		}
		load := r.span("load " + tc.model)
		d := load.EndTime.Sub(load.StartTime)
		if load.Parent.SpanID() != call.SpanContext.SpanID() || !load.StartTime.Equal(call.StartTime) || d < loadLatency || d > call.EndTime.Sub(call.StartTime) {
			t.Errorf("load %s: parent %v (call %v), %v from %v; want the call's child from its start, at least %v",
				tc.model, load.Parent.SpanID(), call.SpanContext.SpanID(), d, load.StartTime, loadLatency)
		}
		if got := attr(load, vramotel.AttrLoadDuration).AsFloat64(); got != d.Seconds() {
			t.Errorf("load %s: %s = %v, span %v", tc.model, vramotel.AttrLoadDuration, got, d)
		}
		unload := r.span("unload " + tc.model)
		if attr(unload, vramotel.AttrUnloadCause).AsString() != string(vramguard.CausePhaseEnd) ||
			!attr(unload, vramotel.AttrUnloadVerified).AsBool() || attr(unload, vramotel.AttrUnloadLeased).AsBool() ||
			attr(unload, vramotel.AttrUnloadAttempts).AsInt64() < 1 || attr(unload, vramotel.AttrUnloadPolls).AsInt64() < 1 ||
			attr(unload, vramotel.AttrUnloadChecks).AsString() == "" {
			t.Errorf("unload %s: %v, want verified by the phase's end with its checks", tc.model, unload.Attributes)
		}
	}

	rm := r.collect()
	for _, m := range []string{"a", "b"} {
		if n := total(t, rm, vramotel.MetricModelLoads, model(m+":latest"), attribute.String(vramotel.AttrReloadCause, vramotel.ReloadCauseNone)); n != 1 {
			t.Errorf("loads of %s: %d, want 1 first load", m, n)
		}
		if n := count(t, rm, vramotel.MetricModelLoadDuration, model(m+":latest")); n != 1 {
			t.Errorf("load durations of %s: %d, want 1", m, n)
		}
		if n := count(t, rm, vramotel.MetricModelUnloadDuration, model(m+":latest"),
			attribute.String(vramotel.AttrUnloadCause, string(vramguard.CausePhaseEnd)),
			attribute.Bool(vramotel.AttrUnloadVerified, true), attribute.Bool(vramotel.AttrUnloadLeased, false)); n != 1 {
			t.Errorf("verified phase-end unload durations of %s: %d, want 1", m, n)
		}
		for _, typ := range []string{vramotel.TokenTypeInput, vramotel.TokenTypeOutput} {
			if n := count(t, rm, vramotel.MetricTokenUsage, model(m+":latest"), attribute.String(vramotel.AttrTokenType, typ)); n != 1 {
				t.Errorf("%s token usage of %s: %d observations, want 1", typ, m, n)
			}
		}
	}
	if n := total(t, rm, vramotel.MetricModelLoads); n != 2 {
		t.Errorf("%d loads in all, want 2", n)
	}
	if n := count(t, rm, vramotel.MetricOperationDuration, attribute.String(vramotel.AttrServerAddress, "127.0.0.1")); n != 2 {
		t.Errorf("%d operation durations, want 2", n)
	}
	if n := count(t, rm, vramotel.MetricTimeToFirstChunk); n != 2 {
		t.Errorf("%d times to the first chunk, want 2", n)
	}
	if n := total(t, rm, vramotel.MetricModelReloads); n != 0 {
		t.Errorf("%d reloads of first loads", n)
	}
}

// A runner that crashes mid-stream: the call's span fails with the
// error's kind, and so does its operation duration.
func TestCrashMidStream(t *testing.T) {
	r := newRig(t, vramotel.Config{})
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 6})
	c := r.client(s, vramguard.Options{})
	if err := s.FailNext("tiny", vramguardtest.CrashAfter(2)); err != nil {
		t.Fatal(err)
	}
	_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	if !errors.Is(err, vramguard.KindModelCrash) {
		t.Fatalf("generation returned %v, want a model crash", err)
	}
	crash := vramguard.KindModelCrash.String()
	call := r.span("text_completion tiny")
	if call.Status.Code != codes.Error || call.Status.Description != err.Error() || attr(call, vramotel.AttrErrorType).AsString() != crash {
		t.Errorf("span status %v, %s %v; want Error, %q", call.Status, vramotel.AttrErrorType, attr(call, vramotel.AttrErrorType).String(), crash)
	}
	if !slices.ContainsFunc(call.Events, func(e sdkEvent) bool { return e.Name == "exception" }) {
		t.Errorf("the error is not recorded on the span: events %v", call.Events)
	}
	if attr(call, vramotel.AttrUsageOutputTokens).Type() != attribute.EMPTY {
		t.Errorf("a failed call reports token usage: %v", call.Attributes)
	}
	rm := r.collect()
	if n := count(t, rm, vramotel.MetricOperationDuration, model("tiny:latest"), attribute.String(vramotel.AttrErrorType, crash)); n != 1 {
		t.Errorf("%d failed operation durations with error.type %q, want 1", n, crash)
	}
	if n := count(t, rm, vramotel.MetricTokenUsage); n != 0 {
		t.Errorf("%d token usage observations of a failed call", n)
	}
}

// Ollama 0.17 loses an unload sent while the model loads (the simulator's
// default version does too): Close's unload of a generation still loading
// is lost and sent again once the model is listed, and the unload's span
// counts both requests and ends verified.
func TestLostUnloadResent(t *testing.T) {
	r := newRig(t, vramotel.Config{})
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: 300 * time.Millisecond})
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond,
		Leases: vramguard.LeaseOptions{Dir: r.leases}, Hooks: r.inst.Hooks()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveServerDefault, nil)
		done <- err
	}()
	if err := s.WaitFor(t.Context(), func() bool { rs := s.Running(); return len(rs) == 1 && rs[0].Loading }); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the generation failed: %v", err)
	}
	lost := 0
	for _, ev := range s.Events("tiny") {
		if ev.Kind == vramguardtest.EventUnloadLost {
			lost++
		}
	}
	if lost == 0 {
		t.Fatal("no unload was lost: the test did not make the race it is about")
	}
	unload := r.span("unload tiny:latest") // Close unloads what /api/ps lists
	if attr(unload, vramotel.AttrUnloadCause).AsString() != string(vramguard.CauseClose) ||
		attr(unload, vramotel.AttrUnloadAttempts).AsInt64() < int64(lost)+1 || !attr(unload, vramotel.AttrUnloadVerified).AsBool() {
		t.Errorf("unload span %v; want Close's, verified after %d lost and one more", unload.Attributes, lost)
	}
	if unload.Status.Code == codes.Error {
		t.Errorf("unload span status %v", unload.Status)
	}
}

// A budget that refuses a model larger than the device: the admission's
// span and counter say "refused", and the call fails out of memory.
func TestAdmissionRefused(t *testing.T) {
	r := newRig(t, vramotel.Config{})
	s := newSim(t, vramguardtest.Config{TotalVRAM: 8 << 30}, vramguardtest.ModelConfig{Name: "huge", Size: 16 << 30})
	c := r.client(s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{}})
	_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "huge", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	if !errors.Is(err, vramguard.KindOutOfMemory) {
		t.Fatalf("generation returned %v, want out of memory", err)
	}
	oom := vramguard.KindOutOfMemory.String()
	call := r.span("text_completion huge")
	adm := r.span("budget admission huge")
	if attr(call, vramotel.AttrErrorType).AsString() != oom || call.Status.Code != codes.Error {
		t.Errorf("call span %v, status %v; want error.type %q", call.Attributes, call.Status, oom)
	}
	if adm.Parent.SpanID() != call.SpanContext.SpanID() || attr(adm, vramotel.AttrAdmissionOutcome).AsString() != vramotel.OutcomeRefused ||
		attr(adm, vramotel.AttrAdmissionNeedBytes).AsInt64() < 16<<30 || adm.Status.Code != codes.Error || attr(adm, vramotel.AttrErrorType).AsString() != oom {
		t.Errorf("admission span %v (status %v, parent %v); want the call's child, refused", adm.Attributes, adm.Status, adm.Parent.SpanID())
	}
	if len(r.named("load huge")) != 0 || s.Requests("huge") != 0 {
		t.Errorf("a refused model was loaded: %d requests", s.Requests("huge"))
	}
	rm := r.collect()
	if n := total(t, rm, vramotel.MetricBudgetAdmissions, model("huge:latest"), attribute.String(vramotel.AttrAdmissionOutcome, vramotel.OutcomeRefused),
		attribute.Int(vramotel.AttrDeviceIndex, 0)); n != 1 {
		t.Errorf("%d refused admissions counted, want 1", n)
	}
	if n := total(t, rm, vramotel.MetricBudgetAdmissions); n != 1 {
		t.Errorf("%d admissions counted, want 1", n)
	}
	// Every lifecycle series carries the server, as the call's do (#35).
	if n := total(t, rm, vramotel.MetricBudgetAdmissions, attribute.String(vramotel.AttrServerAddress, "127.0.0.1")); n != 1 {
		t.Errorf("%d admissions counted with server.address 127.0.0.1, want 1", n)
	}
}

// An unload of a model gone already is told apart from an eviction:
// was_loaded false on its span and its duration point (#35).
func TestUnloadAlreadyGone(t *testing.T) {
	r := newRig(t, vramotel.Config{})
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: loadLatency})
	c := r.client(s, vramguard.Options{})
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
			t.Fatal(err)
		}
	}
	spans := r.named("unload tiny")
	if len(spans) != 2 || !attr(spans[0], vramotel.AttrUnloadWasLoaded).AsBool() || attr(spans[1], vramotel.AttrUnloadWasLoaded).AsBool() {
		t.Fatalf("unload spans %v; want two, the first was_loaded, the second not", spans)
	}
	rm := r.collect()
	verified := attribute.Bool(vramotel.AttrUnloadVerified, true)
	if n := count(t, rm, vramotel.MetricModelUnloadDuration, verified, attribute.Bool(vramotel.AttrUnloadWasLoaded, true)); n != 1 {
		t.Errorf("%d verified evictions recorded, want 1", n)
	}
	if n := count(t, rm, vramotel.MetricModelUnloadDuration, verified, attribute.Bool(vramotel.AttrUnloadWasLoaded, false)); n != 1 {
		t.Errorf("%d unloads of a model gone already, want 1", n)
	}
}

// Another program unloads the model between two calls: the second call's
// span has the event "reload" with the cause, and the reload is counted.
func TestReloadAfterForeignUnload(t *testing.T) {
	r := newRig(t, vramotel.Config{})
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", LoadLatency: loadLatency})
	c := r.client(s, vramguard.Options{})
	gen := func() *vramguard.Generation {
		t.Helper()
		g, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	gen()
	// Another program's unload, through Ollama's own client.
	zero := &api.Duration{}
	if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", KeepAlive: zero}, func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitFor(t.Context(), func() bool { return !s.Listed("tiny") }); err != nil {
		t.Fatal(err)
	}
	if g := gen(); g.Reload == nil || g.Reload.Cause != vramguard.ReloadForeign {
		t.Fatalf("second generation's reload %+v, want %q", g.Reload, vramguard.ReloadForeign)
	}
	calls := r.named("text_completion tiny")
	if len(calls) != 2 {
		t.Fatalf("%d call spans, want 2", len(calls))
	}
	foreign := string(vramguard.ReloadForeign)
	second := calls[1]
	k := slices.IndexFunc(second.Events, func(e sdkEvent) bool { return e.Name == vramotel.EventReload })
	if k < 0 || eventAttr(second.Events[k], vramotel.AttrReloadCause).AsString() != foreign {
		t.Fatalf("second call's events %v, want %q with cause %q", second.Events, vramotel.EventReload, foreign)
	}
	if slices.ContainsFunc(calls[0].Events, func(e sdkEvent) bool { return e.Name == vramotel.EventReload }) {
		t.Errorf("the first load has a reload event: %v", calls[0].Events)
	}
	if got := attr(second, vramotel.AttrReloadCause).AsString(); got != foreign {
		t.Errorf("second call's %s = %q", vramotel.AttrReloadCause, got)
	}
	rm := r.collect()
	cause := attribute.String(vramotel.AttrReloadCause, foreign)
	if n := total(t, rm, vramotel.MetricModelReloads, model("tiny:latest"), cause); n != 1 {
		t.Errorf("reloads{cause=%q} = %d, want 1", foreign, n)
	}
	if n := total(t, rm, vramotel.MetricModelReloads); n != 1 {
		t.Errorf("%d reloads in all, want 1", n)
	}
	first := attribute.String(vramotel.AttrReloadCause, vramotel.ReloadCauseNone)
	if a, b := total(t, rm, vramotel.MetricModelLoads, first), total(t, rm, vramotel.MetricModelLoads, cause); a != 1 || b != 1 {
		t.Errorf("loads: %d first, %d after the foreign unload; want 1 and 1", a, b)
	}
}

// The gauges: a watched client's loaded model is resident with its
// size_vram, under the server's address and port as the call's metrics
// have them, and the device's memory splits into the runner and the free
// memory, which add up to the total. A stopped watch reports nothing.
func TestGauges(t *testing.T) {
	const size = 3 << 30
	s := newSim(t, vramguardtest.Config{TotalVRAM: 8 << 30}, vramguardtest.ModelConfig{Name: "tiny", Size: size})
	r := newRig(t, vramotel.Config{VRAM: s.GPU()})
	c := r.client(s, vramguard.Options{})
	stop := r.inst.Watch(c)
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	rm := r.collect()
	srv := serverAttrs(t, s)
	if ps := points(t, rm, vramotel.MetricModelResident, append(srv, model("tiny:latest"))...); len(ps) != 1 || ps[0].Value != 1 {
		t.Errorf("resident points %v, want one of 1 with %v", points(t, rm, vramotel.MetricModelResident), srv)
	}
	if n := total(t, rm, vramotel.MetricModelVRAM, append(srv, model("tiny:latest"))...); n != size {
		t.Errorf("model VRAM %d with %v, want %d", n, srv, size)
	}
	if n := count(t, rm, vramotel.MetricOperationDuration, append(srv, model("tiny:latest"))...); n != 1 {
		t.Errorf("%d operation durations with the gauges' model and server attributes, want 1", n)
	}
	if ps := points(t, rm, vramotel.MetricPoolMemberUp); len(ps) != 0 {
		t.Errorf("member points for a client of one server: %v", ps)
	}
	dev := attribute.Int(vramotel.AttrDeviceIndex, 0)
	runner := total(t, rm, vramotel.MetricDeviceMemory, dev, attribute.String(vramotel.AttrMemoryHolderKind, string(vramguard.HolderRunner)))
	free := total(t, rm, vramotel.MetricDeviceMemory, dev, attribute.String(vramotel.AttrMemoryHolderKind, string(vramguard.HolderFree)))
	all := total(t, rm, vramotel.MetricDeviceMemory, dev)
	if runner != size || free != 8<<30-size || all != 8<<30 || len(points(t, rm, vramotel.MetricDeviceMemory)) != 2 {
		t.Errorf("device memory: runner %d, free %d, all %d in %d points; want %d + %d = %d in 2",
			runner, free, all, len(points(t, rm, vramotel.MetricDeviceMemory)), size, 8<<30-size, 8<<30)
	}
	stop()
	stop()
	rm = r.collect()
	if ps := points(t, rm, vramotel.MetricModelResident); len(ps) != 0 {
		t.Errorf("resident points after stop: %v", ps)
	}
	if n := total(t, rm, vramotel.MetricDeviceMemory, dev); n != 8<<30 {
		t.Errorf("device memory after the watch stopped: %d, want %d (the reader is not a watch)", n, 8<<30)
	}
	if err := r.inst.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := metric(r.collect(), vramotel.MetricDeviceMemory); ok {
		t.Error("device memory reported after Close")
	}
	r.inst.Watch(c)() // a no-op after Close
}

// vramotel's hooks joined with a program's own: each end hook gets the
// context its own start hook returned, in either order, and the span is
// ended once, with its attributes.
func TestJoinHooks(t *testing.T) {
	type userKey struct{}
	for _, otelFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "vramotel first", false: "user first"}[otelFirst], func(t *testing.T) {
			r := newRig(t, vramotel.Config{})
			s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
			var sawSpanAtStart, sawOwnAtEnd bool
			user := vramguard.Hooks{
				OnCallStart: func(ctx context.Context, cs vramguard.CallStart) context.Context {
					sawSpanAtStart = trace.SpanFromContext(ctx).SpanContext().IsValid()
					return context.WithValue(ctx, userKey{}, cs.Model)
				},
				OnCallEnd: func(ctx context.Context, ce vramguard.CallEnd) {
					sawOwnAtEnd = ctx.Value(userKey{}) == ce.Model
				},
			}
			hooks := vramguard.JoinHooks(user, r.inst.Hooks())
			if otelFirst {
				hooks = vramguard.JoinHooks(r.inst.Hooks(), user)
			}
			c := r.plainClient(s, vramguard.Options{Hooks: hooks})
			if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
				t.Fatal(err)
			}
			if !sawOwnAtEnd {
				t.Error("the user's OnCallEnd did not get its own context")
			}
			if sawSpanAtStart != otelFirst {
				t.Errorf("the user's OnCallStart saw a span: %v, want %v", sawSpanAtStart, otelFirst)
			}
			call := r.span("text_completion tiny")
			if attr(call, vramotel.AttrUsageOutputTokens).AsInt64() != vramguardtest.DefaultChunks || call.EndTime.IsZero() {
				t.Errorf("call span %v: not ended by vramotel's OnCallEnd with the usage", call.Attributes)
			}
		})
	}
}

// A lease keeps the model: the unload's span says leased, not verified,
// fails as refused, and names the holder in the event "lease refusal".
func TestLeaseRefusal(t *testing.T) {
	r := newRig(t, vramotel.Config{})
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny"})
	holder := r.plainClient(s, vramguard.Options{})
	c := r.client(s, vramguard.Options{})
	if _, err := holder.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	lease, err := holder.HoldModel(t.Context(), "tiny", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release() }()
	if _, err := c.UnloadModel(t.Context(), "tiny"); !errors.Is(err, vramguard.ErrLeased) {
		t.Fatalf("UnloadModel returned %v, want ErrLeased", err)
	}
	unload := r.span("unload tiny")
	if !attr(unload, vramotel.AttrUnloadLeased).AsBool() || attr(unload, vramotel.AttrUnloadVerified).AsBool() ||
		attr(unload, vramotel.AttrUnloadAttempts).AsInt64() != 0 || attr(unload, vramotel.AttrErrorType).AsString() != vramguard.KindRefused.String() {
		t.Errorf("unload span %v, want leased, unverified, nothing sent, refused", unload.Attributes)
	}
	k := slices.IndexFunc(unload.Events, func(e sdkEvent) bool { return e.Name == vramotel.EventLeaseRefusal })
	if k < 0 {
		t.Fatalf("unload events %v, want %q", unload.Events, vramotel.EventLeaseRefusal)
	}
	holders := eventAttr(unload.Events[k], vramotel.AttrLeaseHolders).AsStringSlice()
	if len(holders) != 1 || holders[0] != lease.Info().String() {
		t.Errorf("lease holders %q, want [%q]", holders, lease.Info().String())
	}
	rm := r.collect()
	if n := count(t, rm, vramotel.MetricModelUnloadDuration, model("tiny:latest"), attribute.Bool(vramotel.AttrUnloadLeased, true),
		attribute.Bool(vramotel.AttrUnloadVerified, false)); n != 1 {
		t.Errorf("%d leased unload durations, want 1", n)
	}
}

// The zero Config reports to the global providers, which are no-ops
// unless a program sets them: the hooks run and record nothing, and the
// client's calls are unchanged.
func TestZeroConfig(t *testing.T) {
	inst, err := vramotel.New(vramotel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	r := newRig(t, vramotel.Config{}) // for its lease directory
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Chunks: 2})
	c := r.plainClient(s, vramguard.Options{Hooks: inst.Hooks()})
	defer inst.Watch(c)()
	gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	if err != nil || gen.Chunks != 3 {
		t.Fatalf("generation %+v, %v", gen, err)
	}
	if n := len(r.spans.GetSpans()); n != 0 {
		t.Errorf("%d spans in another provider", n)
	}
}

// serverAttrs are server.address and server.port of s.
func serverAttrs(t *testing.T, s *vramguardtest.Server) []attribute.KeyValue {
	t.Helper()
	port, err := strconv.Atoi(s.URL().Port())
	if err != nil {
		t.Fatal(err)
	}
	return []attribute.KeyValue{attribute.String(vramotel.AttrServerAddress, s.URL().Hostname()), attribute.Int(vramotel.AttrServerPort, port)}
}

// A pool of two members (16 and 24 GiB): the first call is placed by room
// on the larger, the next warm there; each call's span has the event
// "placement" with the member, reason, need, free bytes and evictions,
// the counter counts both by member, reason and model, both members are
// up, and the pool's model is resident under the pool's own address.
func TestPool(t *testing.T) {
	const gib = 1 << 30
	r := newRig(t, vramotel.Config{})
	var sims []*vramguardtest.Server
	var ms []pool.Member
	for i, total := range []uint64{16 * gib, 24 * gib} {
		s := newSim(t, vramguardtest.Config{TotalVRAM: total, StrictVRAM: true}, vramguardtest.ModelConfig{Name: "tiny", Size: 2 * gib, LoadLatency: loadLatency})
		sims = append(sims, s)
		ms = append(ms, pool.Member{Name: "gpu" + strconv.Itoa(i), Host: s.URL().String(), VRAM: s.GPU()})
	}
	c, err := pool.New(pool.Options{Members: ms, ProbeInterval: 20 * time.Millisecond, OnPlace: r.inst.Place},
		vramguard.Options{Hooks: r.inst.Hooks(), PollInterval: 5 * time.Millisecond, Leases: vramguard.LeaseOptions{Dir: r.leases}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	stop := r.inst.WatchPool(c)
	defer stop()

	var placed []pool.Placement
	for range 2 {
		ctx, got := pool.WithPlacements(t.Context())
		if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		if len(got()) != 1 {
			t.Fatalf("a pool's generation with placements %+v; want one", got())
		}
		placed = append(placed, got()[0])
	}
	if placed[0].Member != "gpu1" || placed[0].Reason != pool.PlaceRoom || placed[1].Member != "gpu1" || placed[1].Reason != pool.PlaceWarm || !sims[1].Listed("tiny") {
		t.Fatalf("placements %+v, %+v; want room then warm, on gpu1", placed[0], placed[1])
	}

	calls := r.named("text_completion tiny")
	if len(calls) != 2 {
		t.Fatalf("%d call spans, want 2", len(calls))
	}
	for k, call := range calls {
		p := placed[k]
		var evs []sdkEvent
		for _, e := range call.Events {
			if e.Name == vramotel.EventPlacement {
				evs = append(evs, e)
			}
		}
		if len(evs) != 1 {
			t.Errorf("call %d: %d placement events, want 1: %v", k, len(evs), call.Events)
			continue
		}
		e := evs[0]
		if eventAttr(e, vramotel.AttrPoolMember).AsString() != p.Member || eventAttr(e, vramotel.AttrPlacementReason).AsString() != string(p.Reason) ||
			eventAttr(e, vramotel.AttrVRAMNeedBytes).AsInt64() != int64(p.Need) || eventAttr(e, vramotel.AttrVRAMFreeBytes).AsInt64() != int64(p.Free) ||
			eventAttr(e, vramotel.AttrDeviceIndex).AsInt64() != 1 || eventAttr(e, vramotel.AttrPlacementEvicted).Type() != attribute.STRINGSLICE ||
			len(eventAttr(e, vramotel.AttrPlacementEvicted).AsStringSlice()) != 0 {
			t.Errorf("call %d: placement event %v; want %+v", k, e.Attributes, p)
		}
	}
	if p := placed[0]; p.Need == 0 || p.Free != 24*gib {
		t.Errorf("placement by room %+v; want a need and gpu1's 24 GiB free", p)
	}

	rm := r.collect()
	member := attribute.String(vramotel.AttrPoolMember, "gpu1")
	for _, reason := range []pool.PlaceReason{pool.PlaceRoom, pool.PlaceWarm} {
		if n := total(t, rm, vramotel.MetricPoolPlacements, member, attribute.String(vramotel.AttrPlacementReason, string(reason)), model("tiny:latest")); n != 1 {
			t.Errorf("%d placements %q on gpu1, want 1: %v", n, reason, points(t, rm, vramotel.MetricPoolPlacements))
		}
	}
	if ps := points(t, rm, vramotel.MetricPoolPlacements); len(ps) != 2 {
		t.Errorf("placement points %v, want 2", ps)
	}
	for _, m := range []string{"gpu0", "gpu1"} {
		if ps := points(t, rm, vramotel.MetricPoolMemberUp, attribute.String(vramotel.AttrPoolMember, m)); len(ps) != 1 || ps[0].Value != 1 {
			t.Errorf("%s up: %v, want one point of 1", m, ps)
		}
	}
	u, err := url.Parse(c.Host())
	if err != nil {
		t.Fatal(err)
	}
	addr := attribute.String(vramotel.AttrServerAddress, u.Hostname())
	if ps := points(t, rm, vramotel.MetricModelResident, addr, model("tiny:latest")); len(ps) != 1 {
		t.Errorf("resident points %v, want tiny:latest at %v", points(t, rm, vramotel.MetricModelResident), addr)
	}
	stop()
	if ps := points(t, r.collect(), vramotel.MetricPoolMemberUp); len(ps) != 0 {
		t.Errorf("member points after stop: %v", ps)
	}
}
