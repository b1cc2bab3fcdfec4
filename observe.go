package vramguard

// The hooks, every event they are told, and JoinHooks, which lets several
// watchers (vramotel, vramprom, a program's own) share one client.

import (
	"context"
	"time"
)

// Hooks are optional callbacks for lifecycle events, for tracing, metrics
// and tests. Each is told one event, with the context of the call it
// describes, and no two report the same event: a load or a reuse, an
// offload and a reload are fields of the Generation OnCallEnd is told; an
// unload request's count and its verdict are fields of the UnloadReport
// OnUnloadEnd is told. They run synchronously on the goroutine that caused
// the event and must not block; a panicking hook is recovered and logged.
// Join several with JoinHooks.
type Hooks struct {
	// OnCallStart: a generation or chat begins. The context it returns
	// (nil: ctx) is the one the call runs under, so that what the call
	// does (admission, waits, its guard's unloads) and OnCallEnd see it:
	// a span, for instance.
	OnCallStart func(context.Context, CallStart) context.Context
	// OnCallEnd: the call ended, with its Generation (whether it loaded
	// its model, Loaded and Metrics.LoadDuration; Offload; Reload) or its failure, Err, with Generation nil: a generation
	// Options.FailOnOffload refused is errors.Is ErrOffloaded, and
	// errors.As finds its *Offload.
	OnCallEnd func(context.Context, CallEnd)
	// OnUnloadStart: an unload begins (every cause: UnloadModel, guards,
	// phases, cleanups, evictions, the budget's room-making). The context
	// it returns (nil: ctx) is the one OnUnloadEnd receives. A generation
	// sent with KeepAliveUnload is no unload by itself: the server unloads
	// the model when the request ends (a Guard's cleanup after it is an
	// unload of its own).
	OnUnloadStart func(context.Context, UnloadStart) context.Context
	// OnUnloadEnd: the unload ended, verified or not (Report.Verified,
	// Report.Attempts: the requests it sent), or left because a lease
	// keeps the model (Report.Leased).
	OnUnloadEnd func(context.Context, UnloadEnd)
	// OnAdmission: Options.Budget admitted or refused a load.
	OnAdmission func(context.Context, AdmissionEvent)
	// OnVRAMWait: a wait for free device memory ended (see EnsureFree).
	OnVRAMWait func(context.Context, VRAMWaitEvent)
	// OnFallback: the subprocess fallback is about to run after a failed
	// generation.
	OnFallback func(context.Context, FallbackEvent)
	// OnCleanupFailed: Cleanup, CleanupAsync or Close failed; each
	// unload's own failure is also its OnUnloadEnd.
	OnCleanupFailed func(context.Context, CleanupEvent)
}

// CallStart is what Hooks.OnCallStart is told: a generation or a chat
// begins.
type CallStart struct {
	Op     string // "generate" or "chat"
	Model  string // as the caller named it
	Server string // the client's Ollama server, as Options.Host names it
	Start  time.Time
}

// CallEnd is what Hooks.OnCallEnd is told: the call ended. Generation is
// nil when Err is not.
type CallEnd struct {
	CallStart
	Elapsed    time.Duration
	Generation *Generation
	Err        error
}

// UnloadStart is what Hooks.OnUnloadStart is told: an unload of Model
// begins, sent by the call Cause names.
type UnloadStart struct {
	Model  string
	Server string
	Cause  UnloadCause
	Start  time.Time
}

// UnloadEnd is what Hooks.OnUnloadEnd is told: the unload ended. Report is
// never nil; Err is the unload's failure (a model left because a lease
// keeps it is no failure of a cleanup: Report.Leased says so).
type UnloadEnd struct {
	UnloadStart
	Report *UnloadReport
	Err    error
}

// AdmissionEvent is what Hooks.OnAdmission is told: Options.Budget checked
// a load (a generation's, or one OllamaClient.Admit admitted) against its
// slots and the device's memory (a model already listed, or a budget
// that is off, is no check). Err is nil when the load was admitted, else
// an *Error of KindOutOfMemory wrapping the *RoomError, or the failure
// that stopped the check. Admit hands it to its run too.
type AdmissionEvent struct {
	Model  string
	Server string // the client's Ollama server, as Options.Host names it
	Device int
	// Need is the model's estimate, in bytes (0 when the estimate
	// failed, or when the memory checks are off: Budget.OffWithoutGPU).
	Need    uint64
	Start   time.Time
	Elapsed time.Duration
	// MadeRoom: Budget.MakeRoom or MaxLoaded unloaded a model, verified,
	// to admit the load; Evicted reports each unload sent for it.
	MadeRoom bool
	Evicted  []UnloadReport
	// Load: the server did not list the model, so the request loads it
	// (Hooks.OnAdmission is told of loads only; Admit's run is told
	// either way).
	Load bool
	Err  error
}

// VRAMWaitEvent is what Hooks.OnVRAMWait is told: a wait for free device
// memory ended.
type VRAMWaitEvent struct {
	Device int
	Server string // the client's Ollama server, as Options.Host names it
	Need   uint64
	Free   uint64
	Waited time.Duration
	Err    error
}

// FallbackEvent is what Hooks.OnFallback is told: the subprocess fallback
// is about to run Model after the generation failed with Err.
type FallbackEvent struct {
	Model  string
	Server string
	Err    error
}

// CleanupEvent is what Hooks.OnCleanupFailed is told: Err is what
// Cleanup, CleanupAsync's task or Close returned.
type CleanupEvent struct {
	Server string
	Err    error
}

// JoinHooks returns Hooks that call each of hs in order, so that a tracing
// adapter, a metrics adapter and a program's own hooks can watch one
// client. The context an OnCallStart or OnUnloadStart returns is the one
// the next hook receives; each one's end hook gets the context its own
// start hook returned. A panicking hook is recovered and logged as usual
// and does not stop the ones after it.
func JoinHooks(hs ...Hooks) Hooks {
	var j Hooks
	for _, h := range hs {
		j.OnAdmission = join2(j.OnAdmission, h.OnAdmission)
		j.OnVRAMWait = join2(j.OnVRAMWait, h.OnVRAMWait)
		j.OnFallback = join2(j.OnFallback, h.OnFallback)
		j.OnCleanupFailed = join2(j.OnCleanupFailed, h.OnCleanupFailed)
		j.OnCallStart, j.OnCallEnd = joinPair(j.OnCallStart, j.OnCallEnd, h.OnCallStart, h.OnCallEnd)
		j.OnUnloadStart, j.OnUnloadEnd = joinPair(j.OnUnloadStart, j.OnUnloadEnd, h.OnUnloadStart, h.OnUnloadEnd)
	}
	return j
}

func join2[E any](a, b func(context.Context, E)) func(context.Context, E) {
	if a == nil || b == nil {
		if a == nil {
			return b
		}
		return a
	}
	return func(ctx context.Context, ev E) {
		defer b(ctx, ev)
		a(ctx, ev)
	}
}

// pairKey marks, in the context a joined start hook returns, the context
// each side's start hook returned, for that side's end hook. Each joinPair
// has its own key (a pointer to a value of non-zero size is unique), so
// nested joins do not read each other's marks.
type pairKey struct{ _ byte }

type joined struct{ a, b context.Context }

// joinPair joins two start/end pairs: b's start receives the context a's
// start returned, and each end hook receives the context its own side's
// start returned.
func joinPair[S, E any](as func(context.Context, S) context.Context, ae func(context.Context, E),
	bs func(context.Context, S) context.Context, be func(context.Context, E)) (func(context.Context, S) context.Context, func(context.Context, E)) {
	if as == nil && ae == nil {
		return bs, be
	}
	if bs == nil && be == nil {
		return as, ae
	}
	key := &pairKey{}
	start := func(ctx context.Context, ev S) context.Context {
		ca, pa := safeStart(as, ctx, ev)
		cb, pb := safeStart(bs, ca, ev)
		out := context.WithValue(cb, key, &joined{a: ca, b: cb})
		if pa == nil {
			pa = pb
		}
		if pa != nil {
			panic(joinedPanic{ctx: out, v: pa})
		}
		return out
	}
	end := func(ctx context.Context, ev E) {
		ca, cb := ctx, ctx
		if j, ok := ctx.Value(key).(*joined); ok {
			ca, cb = j.a, j.b
		}
		if be != nil {
			defer be(cb, ev)
		}
		if ae != nil {
			ae(ca, ev)
		}
	}
	return start, end
}

// safeStart runs one side's start hook, keeping ctx when the hook is nil,
// returns nil or panics: a panicking side must not take the other side's
// context (its span, say) with it. The panic is raised again once both
// sides ran (joinPair), for the client's recover to log.
func safeStart[E any](h func(context.Context, E) context.Context, ctx context.Context, ev E) (out context.Context, panicked any) {
	out = ctx
	if h == nil {
		return out, nil
	}
	defer func() {
		if r := recover(); r != nil {
			out, panicked = ctx, r
			if jp, ok := r.(joinedPanic); ok { // a nested join: keep what its sides returned
				out, panicked = jp.ctx, jp.v
			}
		}
	}()
	if c := h(ctx, ev); c != nil {
		out = c
	}
	return out, nil
}

// joinedPanic is the panic of a joined start hook: v is the hook's, ctx
// the context both sides returned (the panicking side's own left as it
// was), which the client keeps.
type joinedPanic struct {
	ctx context.Context
	v   any
}

// hookCtx calls a context hook with ev, unless the hook is nil; a panic in
// it is recovered and logged.
func hookCtx[E any](c *OllamaClient, h func(context.Context, E), ctx context.Context, ev E) {
	if h == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("hook panicked", "panic", r)
		}
	}()
	h(ctx, ev)
}

// hookStart calls a start hook and returns the context it returned: ctx
// when the hook is nil, returns nil or panics (recovered and logged).
func hookStart[E any](c *OllamaClient, h func(context.Context, E) context.Context, ctx context.Context, ev E) (out context.Context) {
	out = ctx
	if h == nil {
		return out
	}
	defer func() {
		if r := recover(); r != nil {
			out = ctx
			if jp, ok := r.(joinedPanic); ok {
				out, r = jp.ctx, jp.v
			}
			c.log.Error("hook panicked", "panic", r)
		}
	}()
	if n := h(ctx, ev); n != nil {
		out = n
	}
	return out
}
