package vramotel_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramotel"
)

// rig is an Instrumentation on the real SDK: spans exported as they end
// to memory, metrics read on demand.
type rig struct {
	t      *testing.T
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	inst   *vramotel.Instrumentation
	leases string // the lease directory of the rig's clients, made 0700 by the first
}

func newRig(t *testing.T, cfg vramotel.Config) *rig {
	t.Helper()
	r := &rig{t: t, spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader(), leases: filepath.Join(t.TempDir(), "leases")}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	cfg.TracerProvider, cfg.MeterProvider = tp, mp
	inst, err := vramotel.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.inst = inst
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		if err := inst.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		_ = tp.Shutdown(ctx)
		_ = mp.Shutdown(ctx)
	})
	return r
}

// newSim starts a simulator with the given models, closed at the end of
// the test.
func newSim(t *testing.T, cfg vramguardtest.Config, models ...vramguardtest.ModelConfig) *vramguardtest.Server {
	t.Helper()
	cfg.Models = append(cfg.Models, models...)
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// client returns a client of s with the rig's hooks.
func (r *rig) client(s *vramguardtest.Server, opts vramguard.Options) *vramguard.OllamaClient {
	r.t.Helper()
	opts.Hooks = r.inst.Hooks()
	return r.plainClient(s, opts)
}

// plainClient returns a client of s with opts' own hooks, fast polling and
// the rig's lease directory; it is closed at the end of the test.
func (r *rig) plainClient(s *vramguardtest.Server, opts vramguard.Options) *vramguard.OllamaClient {
	r.t.Helper()
	opts.Host = s.URL().String()
	opts.PollInterval = 5 * time.Millisecond
	opts.UnloadTimeout = 10 * time.Second
	opts.Leases.Dir = r.leases
	c, err := vramguard.NewClient(opts)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		if err := c.Close(); err != nil {
			r.t.Errorf("closing the client: %v", err)
		}
	})
	return c
}

// named returns the ended spans called name.
func (r *rig) named(name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range r.spans.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// span returns the one ended span called name.
func (r *rig) span(name string) tracetest.SpanStub {
	r.t.Helper()
	ss := r.named(name)
	if len(ss) != 1 {
		var names []string
		for _, s := range r.spans.GetSpans() {
			names = append(names, s.Name)
		}
		r.t.Fatalf("%d spans %q, want 1; spans: %q", len(ss), name, names)
	}
	return ss[0]
}

type sdkEvent = sdktrace.Event

// eventAttr is the value of the event's attribute key (EMPTY when
// absent).
func eventAttr(e sdkEvent, key string) attribute.Value {
	return attr(tracetest.SpanStub{Attributes: e.Attributes}, key)
}

// attr is the value of the span's attribute key (EMPTY when absent).
func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// collect reads the metrics.
func (r *rig) collect() metricdata.ResourceMetrics {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(r.t.Context(), &rm); err != nil {
		r.t.Fatalf("collect: %v", err)
	}
	return rm
}

// metric returns the metric called name; ok is false when none was
// reported.
func metric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// points returns the int64 points (of a counter or a gauge) of the metric
// called name whose attributes include kv.
func points(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) []metricdata.DataPoint[int64] {
	t.Helper()
	m, ok := metric(rm, name)
	if !ok {
		return nil
	}
	var all []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		all = d.DataPoints
	case metricdata.Gauge[int64]:
		all = d.DataPoints
	default:
		t.Fatalf("%s is a %T, not an int64 sum or gauge", name, m.Data)
	}
	var out []metricdata.DataPoint[int64]
	for _, p := range all {
		if includes(p.Attributes, kv) {
			out = append(out, p)
		}
	}
	return out
}

// total is the sum of the values of points(...).
func total(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) int64 {
	t.Helper()
	var n int64
	for _, p := range points(t, rm, name, kv...) {
		n += p.Value
	}
	return n
}

// observations returns the histogram points of the metric called name
// whose attributes include kv.
func observations(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) []metricdata.HistogramDataPoint[float64] {
	t.Helper()
	m, ok := metric(rm, name)
	if !ok {
		return nil
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, not a float64 histogram", name, m.Data)
	}
	var out []metricdata.HistogramDataPoint[float64]
	for _, p := range h.DataPoints {
		if includes(p.Attributes, kv) {
			out = append(out, p)
		}
	}
	return out
}

// count is the number of observations of observations(...).
func count(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) uint64 {
	t.Helper()
	var n uint64
	for _, p := range observations(t, rm, name, kv...) {
		n += p.Count
	}
	return n
}

func includes(set attribute.Set, kv []attribute.KeyValue) bool {
	for _, want := range kv {
		if got, ok := set.Value(want.Key); !ok || got != want.Value {
			return false
		}
	}
	return true
}

func model(name string) attribute.KeyValue { return attribute.String(vramotel.AttrRequestModel, name) }
