package vramguard

import (
	"context"
	"errors"
	"sync"
)

// Wait blocks until every cleanup started by CleanupAsync has ended,
// including the ends of phases whose context was canceled, and returns the
// failures among them that no earlier Wait returned.
func (c *OllamaClient) Wait() error {
	perr := c.endPhases(false)
	return errors.Join(perr, c.tasks.join(context.Background(), false))
}

// closeState is the one Close (or Shutdown) of a client: the first call
// runs it; every call waits for it.
type closeState struct {
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error // until a call returns it
}

// Shutdown stops the client, as net/http's Server.Shutdown does: every
// later call of the client, and of its guards, sessions and phases, fails
// with ErrClosed (KindUnavailable) and sends nothing; phases not yet ended
// are ended (each within its own timeout); pending CleanupAsync work is
// joined; and, unless Options.KeepModelsOnClose is set, every model this
// client used with a keep-alive other than KeepAliveUnload is unloaded,
// verified, within CleanupTimeout. It returns every failure not yet
// returned by Wait, joined.
//
// If ctx is done first, Shutdown returns a KindCanceled error wrapping
// context.Cause(ctx) while the work goes on in the background; a later
// Shutdown or Close waits for it and returns its failures. Once a call has
// returned them, later calls return nil.
//
// Close and Shutdown are the two calls that do not fail with ErrClosed on
// a closed client: stopping is idempotent, as net/http's Server.Shutdown
// and Close are, so a deferred Close after an explicit Shutdown is safe.
func (c *OllamaClient) Shutdown(ctx context.Context) error {
	cs := &c.closing
	cs.once.Do(func() {
		cs.done = make(chan struct{})
		go func() {
			err := c.shutdown()
			cs.mu.Lock()
			cs.err = err
			cs.mu.Unlock()
			close(cs.done)
		}()
	})
	select {
	case <-cs.done:
	case <-ctx.Done():
		select {
		case <-cs.done: // both ready: the result wins
		default:
			return newError("close", "", KindCanceled, context.Cause(ctx))
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	err := cs.err
	cs.err = nil
	return err
}

// Close is Shutdown without a deadline of the caller's (each step is
// bounded by its own timeout).
func (c *OllamaClient) Close() error { return c.Shutdown(context.Background()) }

func (c *OllamaClient) shutdown() error {
	warm, _ := c.book.close()
	errs := []error{c.endPhases(true), c.tasks.join(context.Background(), true)}
	// This client's own leases end first: they must not keep its models.
	errs = append(errs, c.releaseLeases())
	if !c.opts.KeepModelsOnClose && len(warm) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.CleanupTimeout)
		_, err := c.unloadMany(ctx, warm, unloadMode{keepLoads: true, cause: CauseClose})
		cancel()
		if err != nil {
			c.cleanupFailed(ctx, err)
		}
		errs = append(errs, err)
	}
	// A shared /api/ps request whose waiters gave up ends within the
	// unload timeout; none outlives Close.
	_ = c.ps.join(context.Background())
	return errors.Join(errs...)
}
