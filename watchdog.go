package vramguard

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// watchdog enforces the timeouts of one generation on its context: Total
// through a deadline, FirstChunk and Idle through one timer, armed for
// FirstChunk, then for Idle at the first chunk, and re-armed by itself when
// it fires while chunks are still coming. Each cancels ctx with its
// own cause, which cancels the HTTP request (or kills the CLI).
type watchdog struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	noTotal context.CancelFunc
	timer   *time.Timer
	idle    time.Duration
	start   time.Time
	// last is the time of the latest chunk in ns since start; 0 before the
	// first. Chunks only store it: the timer re-arms itself when it fires
	// early, so a chunk costs no timer operation.
	last atomic.Int64
	// stopped keeps fire from re-arming the timer after finish or release.
	stopped atomic.Bool
}

// newWatchdog starts the timeouts t of a call that has already spent
// spent (asking the model's capabilities): they count from the call's
// start.
func newWatchdog(parent context.Context, t Timeouts, spent time.Duration) *watchdog {
	w := &watchdog{idle: t.Idle, start: time.Now().Add(-spent)}
	ctx, cancel := context.WithCancelCause(parent)
	w.ctx, w.noTotal = context.WithTimeoutCause(ctx, t.Total-spent, ErrTotalTimeout)
	w.cancel = cancel
	w.timer = time.AfterFunc(t.FirstChunk-spent, w.fire)
	return w
}

// fire runs when the timer expires: before the first chunk that is the
// first-chunk timeout; after it, the idle timeout unless a chunk came since,
// in which case the timer is re-armed for the rest of the idle period.
func (w *watchdog) fire() {
	if w.stopped.Load() {
		return
	}
	last := w.last.Load()
	if last == 0 {
		w.cancel(ErrFirstChunkTimeout)
		return
	}
	if left := w.idle - (time.Since(w.start) - time.Duration(last)); left > 0 {
		w.timer.Reset(left)
		return
	}
	w.cancel(ErrIdleTimeout)
}

// chunk records progress now.
func (w *watchdog) chunk() { w.chunkAt(time.Since(w.start)) }

// chunkAt records progress at elapsed since the watchdog started.
func (w *watchdog) chunkAt(elapsed time.Duration) {
	first := w.last.Load() == 0
	w.last.Store(max(int64(elapsed), 1))
	if first {
		w.timer.Reset(w.idle) // from the first-chunk to the idle period
	}
}

// abort cancels the request because the caller's callback failed.
func (w *watchdog) abort(err error) { w.cancel(err) }

// finish stops the timer and returns the error of a call that was cut:
// by the chunk callback (fnErr), by the caller's parent context, or by one
// of the timeouts; nil when none of these happened.
func (w *watchdog) finish(op, model string, parent context.Context, fnErr error) error {
	w.stopped.Store(true)
	w.timer.Stop()
	switch {
	case fnErr != nil:
		return newError(op, model, KindCanceled, fmt.Errorf("chunk callback: %w", fnErr))
	case parent.Err() != nil:
		return newError(op, model, KindCanceled, context.Cause(parent))
	case w.ctx.Err() != nil:
		return newError(op, model, KindTimeout, context.Cause(w.ctx))
	}
	return nil
}

// release frees the contexts; call it when the request is over.
func (w *watchdog) release() {
	w.stopped.Store(true)
	w.timer.Stop()
	w.noTotal()
	w.cancel(nil)
}
