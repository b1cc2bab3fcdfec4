package vramguard

import (
	"context"
	"errors"
	"sync"
)

// tasks owns a client's background work (CleanupAsync, phases ended by
// their context): every goroutine it starts is joined by join, and the
// failures are kept until a join takes them. Once closed it starts
// nothing.
type tasks struct {
	mu      sync.Mutex
	closed  bool
	pending int
	idle    chan struct{} // closed when pending drops to zero; nil while idle
	errs    []error
}

// start runs fn in a goroutine, unless the tasks are closed (it returns
// false then). A failure of fn is kept for the next join.
func (t *tasks) start(fn func() error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if t.pending == 0 {
		t.idle = make(chan struct{})
	}
	t.pending++
	go func() {
		err := fn()
		t.mu.Lock()
		defer t.mu.Unlock()
		if err != nil {
			t.errs = append(t.errs, err)
		}
		if t.pending--; t.pending == 0 {
			close(t.idle)
			t.idle = nil
		}
	}()
	return true
}

// join waits until no work is left, or ctx is done, and returns (and
// forgets) the failures collected since the last join. With close set, no
// work starts from now on.
func (t *tasks) join(ctx context.Context, close bool) error {
	for {
		t.mu.Lock()
		if close {
			t.closed = true
		}
		idle := t.idle
		if idle == nil {
			errs := t.errs
			t.errs = nil
			t.mu.Unlock()
			return errors.Join(errs...)
		}
		t.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}
