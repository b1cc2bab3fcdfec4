package vramotel

import (
	"errors"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/vramguard/vramguard"
)

// Config configures an Instrumentation. The zero value reports to the
// global providers (otel.GetTracerProvider, otel.GetMeterProvider, read
// once by New) and reports no device memory.
type Config struct {
	// TracerProvider makes the spans; nil: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics; nil: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// VRAM, when set, is read at each collection for the
	// vramguard.device.memory gauge: each device's memory by holder
	// (runners by model, other processes, unattributed, free). Nil: no
	// device gauge.
	VRAM vramguard.VRAMReader
	// Devices are the indexes of the devices the gauge reports; empty:
	// every device the reader lists.
	Devices []int
}

// Instrumentation turns a vramguard client's hooks into spans and metrics.
// Create it with New, put Hooks in vramguard.Options.Hooks, and Close it
// when done.
//
// It is safe for concurrent use, and one Instrumentation may serve several
// clients. Its hooks take the context of the call they describe and
// return it with the call's span; they never block.
type Instrumentation struct {
	tracer  trace.Tracer
	m       instruments
	vram    vramguard.VRAMReader
	devices []int
	reg     metric.Registration

	watch watchList

	cache attrCache

	closeOnce sync.Once
	closeErr  error
}

// instruments are the instruments: those the hooks record to, and the
// gauges the collection's callback observes.
type instruments struct {
	opDuration, tokenUsage, firstChunk     metric.Float64Histogram
	loadDuration, unloadDuration, vramWait metric.Float64Histogram
	loads, reloads, admissions, placements metric.Int64Counter
	resident, modelVRAM, deviceMemory      metric.Int64ObservableGauge
	memberUp                               metric.Int64ObservableGauge
}

// New returns an Instrumentation reporting to cfg's providers. It fails
// when the meter refuses an instrument or the gauges' callback.
func New(cfg Config) (*Instrumentation, error) {
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	i := &Instrumentation{
		tracer:  tp.Tracer(ScopeName),
		vram:    cfg.VRAM,
		devices: append([]int(nil), cfg.Devices...),
	}
	meter := mp.Meter(ScopeName)
	if err := i.m.make(meter); err != nil {
		return nil, err
	}
	reg, err := meter.RegisterCallback(i.observe, i.m.resident, i.m.modelVRAM, i.m.deviceMemory, i.m.memberUp)
	if err != nil {
		return nil, err
	}
	i.reg = reg
	return i, nil
}

func (m *instruments) make(meter metric.Meter) error {
	seconds := metric.WithExplicitBucketBoundaries(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
	tokens := metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
	var errs []error
	hist := func(name, desc, unit string, buckets metric.HistogramOption) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit(unit), buckets)
		errs = append(errs, err)
		return h
	}
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, desc, unit string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return g
	}
	m.opDuration = hist(MetricOperationDuration, "Duration of GenAI operations: generations and chats.", "s", seconds)
	m.tokenUsage = hist(MetricTokenUsage, "Tokens used by GenAI operations, by token type.", "{token}", tokens)
	m.firstChunk = hist(MetricTimeToFirstChunk, "Time from a call's start to its first streamed chunk.", "s", seconds)
	m.loadDuration = hist(MetricModelLoadDuration, "Model load time, as the server reported it.", "s", seconds)
	m.unloadDuration = hist(MetricModelUnloadDuration, "Time an unload took, to verified absence or failure.", "s", seconds)
	m.vramWait = hist(MetricVRAMWaitDuration, "Time spent waiting for free device memory.", "s", seconds)
	m.loads = counter(MetricModelLoads, "Model loads caused by this program's calls.", "{load}")
	m.reloads = counter(MetricModelReloads, "Loads of a model used shortly before, by why it had left.", "{reload}")
	m.admissions = counter(MetricBudgetAdmissions, "Checks of a load against the VRAM budget, by outcome.", "{admission}")
	m.placements = counter(MetricPoolPlacements, "Members a pool chose for calls, by member, reason and model.", "{placement}")
	m.resident = gauge(MetricModelResident, "Models the watched servers hold: 1 per model listed.", "{model}")
	m.modelVRAM = gauge(MetricModelVRAM, "Device memory a listed model holds, as the server reports it.", "By")
	m.deviceMemory = gauge(MetricDeviceMemory, "Device memory by holder; the holders of a device add up to its total.", "By")
	m.memberUp = gauge(MetricPoolMemberUp, "1 while a watched pool's member answers, else 0.", "1")
	return errors.Join(errs...)
}

// Hooks returns the hooks that report to i, for vramguard.Options.Hooks;
// join them with a program's own through vramguard.JoinHooks. They set
// OnCallStart, OnCallEnd, OnUnloadStart, OnUnloadEnd, OnAdmission and
// OnVRAMWait. A pool's placements reach i through pool.Options.OnPlace:
// set it to i.Place.
func (i *Instrumentation) Hooks() vramguard.Hooks {
	return vramguard.Hooks{
		OnCallStart:   i.callStart,
		OnCallEnd:     i.callEnd,
		OnUnloadStart: i.unloadStart,
		OnUnloadEnd:   i.unloadEnd,
		OnAdmission:   i.admission,
		OnVRAMWait:    i.vramWait,
	}
}

// Close unregisters the gauges' callback: later collections report no
// residency and no device memory. The hooks go on reporting spans and the
// other metrics. Close is idempotent and safe for concurrent use.
func (i *Instrumentation) Close() error {
	i.closeOnce.Do(func() {
		i.watch.close()
		i.closeErr = i.reg.Unregister()
	})
	return i.closeErr
}
