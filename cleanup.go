package vramguard

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"
)

// releaseFunc frees memory the caller owns, such as a CUDA caching
// allocator's pool (the Go side of torch.cuda.empty_cache), or a tenant's
// cache (Tenant.Release). It must honour ctx.
type releaseFunc = func(ctx context.Context) error

type namedRelease struct {
	id   int
	name string
	fn   releaseFunc
}

// releaseList holds the functions ReleaseVRAM runs, in registration order.
type releaseList struct {
	mu     sync.Mutex
	nextID int
	fns    []namedRelease
}

func (l *releaseList) add(name string, fn releaseFunc) (remove func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextID++
	id := l.nextID
	l.fns = append(l.fns, namedRelease{id: id, name: name, fn: fn})
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.fns = slices.DeleteFunc(l.fns, func(r namedRelease) bool { return r.id == id })
	}
}

func (l *releaseList) list() []namedRelease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.fns)
}

// RegisterRelease adds fn to the functions ReleaseVRAM runs, in registration
// order. The returned func removes it; calling it twice is harmless.
func (c *OllamaClient) RegisterRelease(name string, fn func(ctx context.Context) error) (unregister func()) {
	if fn == nil {
		return func() {}
	}
	return c.releases.add(name, fn)
}

// ReleaseReport says what ReleaseVRAM did. Before and After are nil without
// a VRAM reader; SnapshotErr records a reader failure, which does not fail
// ReleaseVRAM.
type ReleaseReport struct {
	Ran         []string // names of the release functions run, in order
	Before      *VRAMSnapshot
	After       *VRAMSnapshot
	SnapshotErr error
	Elapsed     time.Duration
}

// ReleaseVRAM runs the registered release functions, then runtime.GC and
// debug.FreeOSMemory, and reports device memory before and after when a
// VRAM reader is configured. It never fails for want of a GPU; it returns
// the joined failures of release functions (KindInternal, a panic included)
// and KindCanceled if ctx ends first. On a closed client it fails with
// ErrClosed and runs nothing.
func (c *OllamaClient) ReleaseVRAM(ctx context.Context) (*ReleaseReport, error) {
	if err := c.checkOpen("release vram", ""); err != nil {
		return nil, err
	}
	return c.releaseVRAM(ctx)
}

func (c *OllamaClient) releaseVRAM(ctx context.Context) (*ReleaseReport, error) {
	const op = "release vram"
	start := time.Now()
	rep := &ReleaseReport{}
	snap := func() *VRAMSnapshot {
		if c.opts.VRAM == nil {
			return nil
		}
		s, err := c.opts.VRAM.Snapshot(ctx)
		if err != nil {
			rep.SnapshotErr = errors.Join(rep.SnapshotErr, err)
			return nil
		}
		return s
	}
	rep.Before = snap()

	fns := c.releases.list()

	var errs []error
	for _, r := range fns {
		if err := ctx.Err(); err != nil {
			errs = append(errs, newError(op, "", KindCanceled, context.Cause(ctx)))
			break
		}
		rep.Ran = append(rep.Ran, r.name)
		if err := runRelease(ctx, r.fn); err != nil {
			errs = append(errs, newError(op, "", KindInternal, fmt.Errorf("%s: %w", r.name, err)))
		}
	}
	runtime.GC()
	debug.FreeOSMemory()
	rep.After = snap()
	rep.Elapsed = time.Since(start)
	return rep, errors.Join(errs...)
}

func runRelease(ctx context.Context, fn releaseFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn(ctx)
}

// CleanupOptions says what Cleanup does. The zero value does nothing but
// report; set Models, AllModels and/or Release.
type CleanupOptions struct {
	Models    []string // unload these, verified (a model named twice, "tiny" and "TINY:latest" alike, once)
	AllModels bool     // unload every model the server lists, and those this client is loading, verified
	Release   bool     // run ReleaseVRAM after the unloads
	// Timeout bounds the whole cleanup; zero means Options.CleanupTimeout.
	Timeout time.Duration

	// mode: how the unloads treat requests the caller did not send (the
	// library's own cleanups; see unloadMode).
	mode unloadMode
}

// CleanupReport says what Cleanup did.
type CleanupReport struct {
	Unloads []UnloadReport
	Release *ReleaseReport
	Elapsed time.Duration
}

// Cleanup unloads models (verified) and/or releases VRAM, synchronously.
//
// It deliberately outlives the caller's cancellation: it runs under
// context.WithTimeout(context.WithoutCancel(ctx), timeout), so a cleanup
// deferred by code whose context was already canceled still happens. The
// error joins every failure; each is also passed to Hooks.OnCleanupFailed.
// On a closed client it fails with ErrClosed and sends nothing (Close
// itself unloads what the client left warm).
func (c *OllamaClient) Cleanup(ctx context.Context, opts CleanupOptions) (*CleanupReport, error) {
	if err := c.checkOpen("cleanup", ""); err != nil {
		return nil, err
	}
	return c.cleanup(ctx, opts)
}

// cleanup is Cleanup for the library's own calls: the after-use cleanups
// of guards, phases and CLI fallbacks that began before Close, and Close.
func (c *OllamaClient) cleanup(ctx context.Context, opts CleanupOptions) (*CleanupReport, error) {
	const op = "cleanup"
	if opts.Timeout < 0 {
		return nil, invalid(op, "", "negative timeout %v", opts.Timeout)
	}
	for _, m := range opts.Models {
		if err := validModelName(op, m); err != nil {
			return nil, err
		}
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = c.opts.CleanupTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()

	start := time.Now()
	rep := &CleanupReport{}
	var errs []error
	models := slices.Clone(opts.Models)
	if opts.mode.cause == "" {
		opts.mode.cause = CauseCleanup // Cleanup, CleanupAsync, the fallback's
	}
	if opts.AllModels {
		ms, err := c.running(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		names := make([]string, 0, len(ms))
		for _, m := range ms {
			names = append(names, m.Model)
		}
		if !opts.mode.keepLoads {
			names = append(names, c.book.loadingModels()...)
		}
		for _, m := range names {
			if !slices.ContainsFunc(models, func(x string) bool { return NormalizeModelName(x) == NormalizeModelName(m) }) {
				models = append(models, m)
			}
		}
	}
	if len(models) > 0 {
		reps, err := c.unloadMany(ctx, models, opts.mode)
		rep.Unloads = reps
		if err != nil {
			errs = append(errs, err)
		}
	}
	if opts.Release {
		rr, err := c.releaseVRAM(ctx)
		rep.Release = rr
		if err != nil {
			errs = append(errs, err)
		}
	}
	rep.Elapsed = time.Since(start)
	err := errors.Join(errs...)
	if err != nil {
		c.cleanupFailed(ctx, err)
	}
	return rep, err
}

func (c *OllamaClient) cleanupFailed(ctx context.Context, err error) {
	c.log.Warn("cleanup failed", "err", err)
	hookCtx(c, c.opts.Hooks.OnCleanupFailed, ctx, CleanupEvent{Server: c.host, Err: err})
}

// CleanupTask is a cleanup running in the background. Its methods are safe
// for concurrent use.
type CleanupTask struct {
	done   chan struct{}
	report *CleanupReport
	err    error
}

// Done is closed when the cleanup has ended.
func (t *CleanupTask) Done() <-chan struct{} { return t.done }

// Wait blocks until the cleanup has ended and returns its result.
func (t *CleanupTask) Wait() (*CleanupReport, error) {
	<-t.done
	return t.report, t.err
}

// CleanupAsync starts Cleanup in a goroutine owned by the client and returns
// at once. The work is joinable: through the task's Wait, or the client's
// Wait and Close, so a program can exit knowing nothing is left running or
// resident. A panic inside the cleanup is recovered into a KindInternal
// error. On a closed client the task fails at once with ErrClosed.
func (c *OllamaClient) CleanupAsync(ctx context.Context, opts CleanupOptions) *CleanupTask {
	t := &CleanupTask{done: make(chan struct{})}
	ctx = context.WithoutCancel(ctx)
	closed := func() *CleanupTask {
		t.err = newError("cleanup", "", KindUnavailable, ErrClosed)
		close(t.done)
		return t
	}
	if c.book.isClosed() {
		return closed()
	}
	started := c.tasks.start(func() (err error) {
		defer close(t.done)
		defer func() {
			if r := recover(); r != nil {
				t.err = newError("cleanup", "", KindInternal, fmt.Errorf("panic: %v", r))
				c.cleanupFailed(ctx, t.err)
				err = t.err
			}
		}()
		t.report, t.err = c.cleanup(ctx, opts)
		return t.err
	})
	if !started {
		return closed()
	}
	return t
}
