package vramotel

// The spans and metrics of what a client does to device memory: unloads
// (OnUnloadStart, OnUnloadEnd), budget admissions (OnAdmission) and waits
// for free memory (OnVRAMWait).

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/vramguard/vramguard"
)

// unloadSpanKey marks, in the context OnUnloadStart returns, the unload's
// span, as callKey does for a call.
type unloadSpanKey struct{}

func (i *Instrumentation) unloadStart(ctx context.Context, us vramguard.UnloadStart) context.Context {
	ctx, span := i.tracer.Start(ctx, "unload "+us.Model, trace.WithTimestamp(us.Start))
	if !span.IsRecording() {
		return ctx
	}
	span.SetAttributes(attribute.String(AttrRequestModel, us.Model), attribute.String(AttrUnloadCause, string(us.Cause)))
	span.SetAttributes(i.cache.server(us.Server)...)
	return context.WithValue(ctx, unloadSpanKey{}, span)
}

func (i *Instrumentation) unloadEnd(ctx context.Context, ue vramguard.UnloadEnd) {
	rep := ue.Report
	leased := len(rep.Leased) > 0
	if i.m.unloadDuration.Enabled(ctx) {
		kv := append([]attribute.KeyValue{metricModel(ue.Model),
			attribute.String(AttrUnloadCause, string(ue.Cause)),
			attribute.Bool(AttrUnloadVerified, rep.Verified),
			attribute.Bool(AttrUnloadWasLoaded, rep.WasLoaded),
			attribute.Bool(AttrUnloadLeased, leased)}, i.cache.server(ue.Server)...)
		i.m.unloadDuration.Record(ctx, time.Since(ue.Start).Seconds(), metric.WithAttributes(kv...))
	}
	span, ok := ctx.Value(unloadSpanKey{}).(trace.Span)
	if !ok {
		return
	}
	span.SetAttributes(
		attribute.Bool(AttrUnloadVerified, rep.Verified),
		attribute.Bool(AttrUnloadWasLoaded, rep.WasLoaded),
		attribute.Int(AttrUnloadAttempts, rep.Attempts),
		attribute.Int(AttrUnloadPolls, rep.Polls),
		attribute.Bool(AttrUnloadLeased, leased))
	if rep.Checked != 0 {
		span.SetAttributes(attribute.String(AttrUnloadChecks, rep.Checked.String()))
	}
	if leased {
		holders := make([]string, len(rep.Leased))
		for k, l := range rep.Leased {
			holders[k] = l.String()
		}
		name := EventLeaseRefusal
		if rep.Attempts > 0 { // a forced unload sent its request anyway
			name = EventLeaseOverride
		}
		span.AddEvent(name, trace.WithAttributes(attribute.StringSlice(AttrLeaseHolders, holders)))
	}
	if ue.Err != nil {
		fail(span, ue.Err, errorType(ue.Err))
	}
	span.End()
}

// admissionOutcome is vramguard.admission.outcome for an admission's
// error.
func admissionOutcome(err error) string {
	var be *vramguard.RoomError
	switch {
	case err == nil:
		return OutcomeAdmitted
	case errors.Is(err, vramguard.KindOutOfMemory) && errors.As(err, &be) && be.Budget != nil:
		return OutcomeRefused
	default:
		return OutcomeFailed
	}
}

func (i *Instrumentation) admission(ctx context.Context, ev vramguard.AdmissionEvent) {
	outcome := admissionOutcome(ev.Err)
	device := attribute.Int(AttrDeviceIndex, ev.Device)
	kv := append([]attribute.KeyValue{metricModel(ev.Model), device, attribute.String(AttrAdmissionOutcome, outcome)}, i.cache.server(ev.Server)...)
	i.m.admissions.Add(ctx, 1, metric.WithAttributes(kv...))
	_, span := i.tracer.Start(ctx, "budget admission "+ev.Model, trace.WithTimestamp(ev.Start))
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrRequestModel, ev.Model), device,
			attribute.String(AttrAdmissionOutcome, outcome),
			attribute.Int64(AttrAdmissionNeedBytes, bytes64(ev.Need)),
			attribute.Bool(AttrAdmissionMadeRoom, ev.MadeRoom))
		if ev.Err != nil {
			fail(span, ev.Err, errorType(ev.Err))
		}
	}
	span.End(trace.WithTimestamp(ev.Start.Add(ev.Elapsed)))
}

func (i *Instrumentation) vramWait(ctx context.Context, ev vramguard.VRAMWaitEvent) {
	end := time.Now()
	device := attribute.Int(AttrDeviceIndex, ev.Device)
	if i.m.vramWait.Enabled(ctx) {
		kv := append([]attribute.KeyValue{device}, i.cache.server(ev.Server)...)
		if ev.Err != nil {
			kv = append(kv, attribute.String(AttrErrorType, errorType(ev.Err)))
		}
		i.m.vramWait.Record(ctx, ev.Waited.Seconds(), metric.WithAttributes(kv...))
	}
	_, span := i.tracer.Start(ctx, "vram wait", trace.WithTimestamp(end.Add(-ev.Waited)))
	if span.IsRecording() {
		span.SetAttributes(device,
			attribute.Int64(AttrVRAMNeedBytes, bytes64(ev.Need)),
			attribute.Int64(AttrVRAMFreeBytes, bytes64(ev.Free)))
		if ev.Err != nil {
			fail(span, ev.Err, errorType(ev.Err))
		}
	}
	span.End(trace.WithTimestamp(end))
}

// bytes64 is a byte count as an int64 attribute or measurement; counts
// beyond its range (which no device has) are capped.
func bytes64(b uint64) int64 { return int64(min(b, 1<<63-1)) }
