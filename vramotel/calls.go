package vramotel

// The spans and metrics of generations and chats: OnCallStart, OnCallEnd
// (with the call's reload, from Generation.Reload), and Place for a pool's OnPlace.

import (
	"context"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
)

// callSpanKey marks, in the context OnCallStart returns, the call's span, so
// that OnCallEnd ends that span and never one of the caller's (a span not
// recording is not marked: its end has nothing to add).
type callSpanKey struct{}

// operation is gen_ai.operation.name for a vramguard call's Op.
func operation(op string) string {
	switch op {
	case "generate":
		return OperationTextCompletion
	case "chat":
		return OperationChat
	}
	return op
}

func (i *Instrumentation) callStart(ctx context.Context, cs vramguard.CallStart) context.Context {
	a := i.cache.call(cs)
	ctx, span := i.tracer.Start(ctx, a.name, a.kind, a.attrs, trace.WithTimestamp(cs.Start))
	if !span.IsRecording() {
		return ctx
	}
	return context.WithValue(ctx, callSpanKey{}, span)
}

func (i *Instrumentation) callEnd(ctx context.Context, ce vramguard.CallEnd) {
	errType := errorType(ce.Err)
	i.recordCall(ctx, ce, errType)
	span, ok := ctx.Value(callSpanKey{}).(trace.Span)
	if !ok {
		return
	}
	if gen := ce.Generation; gen != nil {
		kv := make([]attribute.KeyValue, 0, 6)
		if gen.DoneReason != "" {
			kv = append(kv, attribute.StringSlice(AttrResponseFinishReasons, []string{gen.DoneReason}))
		}
		if !gen.Fallback {
			kv = append(kv, attribute.Int(AttrUsageInputTokens, gen.Metrics.PromptEvalCount),
				attribute.Int(AttrUsageOutputTokens, gen.Metrics.EvalCount))
		}
		if gen.FirstChunk > 0 {
			kv = append(kv, attribute.Float64(AttrTimeToFirstChunk, gen.FirstChunk.Seconds()))
		}
		if gen.Loaded {
			kv = append(kv, attribute.Float64(AttrLoadDuration, gen.Metrics.LoadDuration.Seconds()),
				attribute.String(AttrReloadCause, reloadCause(gen)))
			i.loadSpan(ctx, ce, gen)
		}
		if ev := gen.Reload; ev != nil {
			span.AddEvent(EventReload, trace.WithAttributes(
				attribute.String(AttrRequestModel, ev.Model),
				attribute.String(AttrReloadCause, string(ev.Cause)),
				attribute.Float64(AttrReloadSince, ev.Since.Seconds()),
				attribute.String(AttrReloadEvidence, ev.Evidence)))
		}
		span.SetAttributes(kv...)
	}
	if ce.Err != nil {
		fail(span, ce.Err, errType)
	}
	span.End(trace.WithTimestamp(ce.Start.Add(ce.Elapsed)))
}

// loadSpan records the call's load as a child span: from the call's start,
// for the load_duration the server reported (at most the call's length).
func (i *Instrumentation) loadSpan(ctx context.Context, ce vramguard.CallEnd, gen *vramguard.Generation) {
	d := min(gen.Metrics.LoadDuration, ce.Elapsed)
	_, span := i.tracer.Start(ctx, "load "+ce.Model, trace.WithTimestamp(ce.Start))
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrRequestModel, ce.Model),
			attribute.Float64(AttrLoadDuration, gen.Metrics.LoadDuration.Seconds()),
			attribute.String(AttrReloadCause, reloadCause(gen)))
	}
	span.End(trace.WithTimestamp(ce.Start.Add(d)))
}

// recordCall records the GenAI client metrics and the loads of a call.
func (i *Instrumentation) recordCall(ctx context.Context, ce vramguard.CallEnd, errType string) {
	a := i.cache.call(ce.CallStart)
	if i.m.opDuration.Enabled(ctx) {
		if errType == "" {
			i.m.opDuration.Record(ctx, ce.Elapsed.Seconds(), a.ok...)
		} else { // failures are rare: their attributes are not kept
			kv := append(slices.Clip(a.kv), attribute.String(AttrErrorType, errType))
			i.m.opDuration.Record(ctx, ce.Elapsed.Seconds(), metric.WithAttributes(kv...))
		}
	}
	gen := ce.Generation
	if gen == nil {
		return
	}
	if gen.FirstChunk > 0 && i.m.firstChunk.Enabled(ctx) {
		i.m.firstChunk.Record(ctx, gen.FirstChunk.Seconds(), a.ok...)
	}
	if !gen.Fallback && i.m.tokenUsage.Enabled(ctx) {
		if n := gen.Metrics.PromptEvalCount; n > 0 {
			i.m.tokenUsage.Record(ctx, float64(n), a.input...)
		}
		if n := gen.Metrics.EvalCount; n > 0 {
			i.m.tokenUsage.Record(ctx, float64(n), a.output...)
		}
	}
	if gen.Loaded {
		i.m.loadDuration.Record(ctx, gen.Metrics.LoadDuration.Seconds(), metric.WithAttributes(a.model...))
		kv := append(slices.Clip(a.model), attribute.String(AttrReloadCause, reloadCause(gen)))
		i.m.loads.Add(ctx, 1, metric.WithAttributes(kv...))
		if gen.Reload != nil {
			i.m.reloads.Add(ctx, 1, metric.WithAttributes(kv...))
		}
	}
}

// Place adds the event "placement" to the call's span (the pool calls it
// with the call's context, which carries the span) and counts the
// placement: set pool.Options.OnPlace to it.
func (i *Instrumentation) Place(ctx context.Context, p pool.Placement) {
	i.m.placements.Add(ctx, 1, metric.WithAttributes(
		attribute.String(AttrPoolMember, p.Member),
		attribute.String(AttrPlacementReason, string(p.Reason)),
		metricModel(p.Model)))
	span, ok := ctx.Value(callSpanKey{}).(trace.Span)
	if !ok {
		return
	}
	span.AddEvent(EventPlacement, trace.WithAttributes(
		attribute.String(AttrPoolMember, p.Member),
		attribute.String(AttrPlacementReason, string(p.Reason)),
		attribute.Int(AttrDeviceIndex, p.Device),
		attribute.Int64(AttrVRAMNeedBytes, bytes64(p.Need)),
		attribute.Int64(AttrVRAMFreeBytes, bytes64(p.Free)),
		attribute.StringSlice(AttrPlacementEvicted, p.Evicted)))
}

// metricModel is gen_ai.request.model in metrics: the model as /api/ps
// lists it, so that a call's series and the residency gauge of one model
// match ("tiny" and "tiny:latest" are one model). Spans keep the name the
// caller gave.
func metricModel(model string) attribute.KeyValue {
	return attribute.String(AttrRequestModel, vramguard.NormalizeModelName(model))
}

// reloadCause is vramguard.reload.cause for a generation that loaded its
// model.
func reloadCause(gen *vramguard.Generation) string {
	if gen.Reload == nil {
		return ReloadCauseNone
	}
	return string(gen.Reload.Cause)
}

// errorType is error.type for err: its Kind's name, "" for nil.
func errorType(err error) string {
	if err == nil {
		return ""
	}
	if k := vramguard.KindOf(err); k != vramguard.KindUnknown {
		return k.String()
	}
	return ErrorTypeOther
}

// fail marks span as failed with err.
func fail(span trace.Span, err error, errType string) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(attribute.String(AttrErrorType, errType))
}
