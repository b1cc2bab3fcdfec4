package vramguard

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"time"
)

// releaseFunc is a Tenant's Release.
type releaseFunc = func(ctx context.Context) error

// ReleaseReport says what ReleaseVRAM did. Before and After are nil without
// a VRAM reader; SnapshotErr records a reader failure, which does not fail
// ReleaseVRAM.
type ReleaseReport struct {
	Ran         []string // names of the tenants whose Release ran, in order
	Before      *VRAMSnapshot
	After       *VRAMSnapshot
	SnapshotErr error
	Elapsed     time.Duration
}

// ReleaseVRAM runs the Release of every registered tenant
// (RegisterTenant), on a device or on none, one after another in
// registration order, then runtime.GC and debug.FreeOSMemory, and reports
// device memory before and after when a VRAM reader is configured. Unlike
// room-making it asks every tenant, needed or not, and waits for no device
// to show what they gave. Each Release runs under ctx. It never fails for
// want of a GPU; it returns the joined failures of the releases
// (KindInternal, a panic included; a tenant's own error, a refusal say,
// stays reachable with errors.Is) and KindCanceled if ctx ends first. It is
// safe for concurrent use. On a closed client it fails with ErrClosed and
// runs nothing.
func (c *OllamaClient) ReleaseVRAM(ctx context.Context) (*ReleaseReport, error) {
	if err := c.checkOpen("release vram", ""); err != nil {
		return nil, err
	}
	return c.releaseVRAM(ctx, true)
}

// releaseVRAM is ReleaseVRAM for every tenant (all), or the library's own
// release step, which runs only the tenants on no device (see Tenant).
func (c *OllamaClient) releaseVRAM(ctx context.Context, all bool) (*ReleaseReport, error) {
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

	var errs []error
	for _, e := range c.tenants.releasing(all) {
		if err := ctx.Err(); err != nil {
			errs = append(errs, newError(op, "", KindCanceled, context.Cause(ctx)))
			break
		}
		rep.Ran = append(rep.Ran, e.t.Name)
		if err := runRelease(ctx, e.t.Release); err != nil {
			errs = append(errs, newError(op, "", KindInternal, fmt.Errorf("%s: %w", e.t.Name, err)))
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
	Release   bool     // run ReleaseVRAM after the unloads: every tenant's Release
	// Timeout bounds the whole cleanup; zero means Options.CleanupTimeout.
	Timeout time.Duration

	// afterUse: the library's own after-use cleanup (a Guard's, Phase.End's),
	// whose Release runs only the tenants on no device (see Tenant).
	afterUse bool

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
		rr, err := c.releaseVRAM(ctx, !opts.afterUse)
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
