package vramguardtest

import (
	"context"
	"math"
	"slices"
	"time"
)

// model is a registered model and its current runner. Guarded by Server.mu.
type model struct {
	key, short string
	name       string // full name, as Ollama's capability errors write it
	cfg        ModelConfig
	added      time.Time

	runner   *runner // loading or loaded; nil when not loaded
	inFlight int     // requests being served, past loading
	faults   faults  // for every request
	next     []faults
	stats    Stats
	calls    []recorded // the last maxCalls requests, oldest first
}

// runner is one load of a model, like an Ollama runner process.
// Guarded by Server.mu.
type runner struct {
	m   *model
	pid uint32

	loading  bool
	loadDone chan struct{} // closed when loading ends, well or not
	loadErr  error
	// readyAt is when the load ends: its start plus max(LoadLatency,
	// MinLoadDuration). Every request that waited for it reports the time
	// until then (Ollama's handlers each take their checkpoint when the
	// scheduler hands them the one runner).
	readyAt time.Time

	dead      bool          // crashed mid-stream; still listed
	doomed    bool          // expired or unloaded: goes once refs is 0
	refs      int           // requests holding the runner
	keepAlive time.Duration // sticky; math.MaxInt64 is forever
	expiresAt time.Time     // zero until the runner first goes idle
	expiry    *timer        // keep-alive timer while idle
	removal   *timer        // pending removal from /api/ps
	hold      *holding      // its GPU memory, nil once freed
	vram      uint64        // bytes on the GPU (size_vram): cfg.SizeVRAM, less after an offload
	numCtx    int           // the num_ctx the load was asked for (0: the default)
}

// expiresAtFor returns what /api/ps reports as expires_at: like Ollama, a
// runner that never went idle shows now plus its keep-alive.
func (r *runner) expiresAtFor(now time.Time) time.Time {
	if r.expiresAt.IsZero() {
		return now.Add(r.keepAlive)
	}
	return r.expiresAt
}

// forever reports whether d means "never expire".
func forever(d time.Duration) bool { return d < 0 || d == math.MaxInt64 }

// takeFaultsLocked returns the faults for a request on m, consuming one
// queued FailNext set.
func (s *Server) takeFaultsLocked(m *model) faults {
	fs := slices.Clone(m.faults)
	if len(m.next) > 0 {
		fs = append(fs, m.next[0]...)
		m.next = m.next[1:]
	}
	return fs
}

// acquire returns m's runner with a reference held for the caller, loading
// the model first if needed. keepAlive, if set, becomes the runner's sticky
// keep-alive. loadDur is non-zero when the caller had to wait for a load:
// the time from start (the handler's, as Ollama measures it) to the load's
// end.
// A request for another context size (numCtx, 0 for the default) than the
// runner was loaded with loads the model again once the runner is idle, as
// Ollama's scheduler does (needsReload); while other requests hold the
// runner, the request shares it instead (Ollama would wait for them).
// On success the caller must call release.
func (s *Server) acquire(ctx context.Context, start time.Time, m *model, keepAlive *time.Duration, numCtx int, fs faults) (r *runner, loadDur time.Duration, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, 0, errClosed
	}
	r = m.runner
	switch {
	case r == nil || r.loading:
	case r.dead:
		// Ollama pings the runner, finds it dead and loads a new one.
		s.removeRunnerLocked(r)
		r = nil
	case r.refs == 0 && r.numCtx != numCtx:
		// The model loads again with the new context size.
		s.removeRunnerLocked(r)
		r = nil
	case r.doomed && r.refs == 0:
		// An unload or expiry is pending and nobody holds the runner: Ollama
		// kills it within milliseconds, and this request waits for that and
		// loads the model again.
		s.removeRunnerLocked(r)
		r = nil
	}
	if r == nil {
		vram, err := s.admitLocked(m, fs)
		if err != nil {
			m.stats.LoadFailures++
			s.eventLocked(m, EventLoadFailed, nil)
			s.notifyLocked()
			s.mu.Unlock()
			return nil, 0, err
		}
		r = s.startLoadLocked(m, vram, keepAlive, fs.loadFault())
		r.numCtx = numCtx
	} else if keepAlive != nil {
		r.keepAlive = *keepAlive
	}
	r.refs++
	s.stopLocked(r.expiry)
	r.expiry = nil
	if !r.loading {
		m.inFlight++
		s.notifyLocked() // after the count, so that WaitInFlight sees it
		s.mu.Unlock()
		return r, 0, nil
	}
	s.notifyLocked()
	loadDone := r.loadDone
	s.mu.Unlock()

	select {
	case <-loadDone:
	case <-ctx.Done():
		s.release(r, false)
		return nil, 0, context.Cause(ctx)
	case <-s.done:
		s.release(r, false)
		return nil, 0, errClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.loadErr != nil {
		r.refs--
		s.notifyLocked()
		return nil, 0, r.loadErr
	}
	m.inFlight++
	s.notifyLocked()
	// Every request that waited for the load reports the time until its
	// one end, so their load windows end together, as on Ollama.
	return r, max(r.readyAt.Sub(start), time.Nanosecond), nil
}

// release drops a reference taken by acquire; served tells whether acquire
// had succeeded (the request was counted in flight).
func (s *Server) release(r *runner, served bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.refs--
	if served {
		r.m.inFlight--
	}
	if r.refs == 0 && !r.loading && r.m.runner == r {
		s.idleLocked(r)
	}
	s.notifyLocked()
}

// admitLocked decides whether m may start loading, evicting idle models
// under StrictVRAM like Ollama's scheduler, and returns the bytes its
// runner will hold on the GPU: all of SizeVRAM, or with Config.Offload
// what is free when that is less.
func (s *Server) admitLocked(m *model, fs faults) (uint64, error) {
	need := m.cfg.SizeVRAM
	if fs.has(FaultOOM) {
		return 0, oomError(need, s.freeLocked())
	}
	if !s.cfg.StrictVRAM || s.freeLocked() >= need {
		return need, nil
	}
	var idle []*runner
	for _, o := range s.order {
		if r := o.runner; r != nil && o != m && r.refs == 0 && !r.loading && r.hold != nil {
			idle = append(idle, r)
		}
	}
	now := time.Now()
	slices.SortStableFunc(idle, func(a, b *runner) int {
		return a.expiresAtFor(now).Compare(b.expiresAtFor(now))
	})
	for _, r := range idle {
		if s.freeLocked() >= need {
			break
		}
		r.m.stats.Evictions++
		s.eventLocked(r.m, EventEvicted, nil)
		s.freeHoldingLocked(r, true) // the scheduler waits for the memory
		s.removeRunnerLocked(r)
	}
	free := s.freeLocked()
	switch {
	case free >= need:
		return need, nil
	case s.cfg.Offload:
		return free, nil // the rest goes to the CPU
	}
	return 0, oomError(need, free)
}

// startLoadLocked creates a loading runner for m, holding vram bytes on
// the GPU, and starts its loader.
func (s *Server) startLoadLocked(m *model, vram uint64, keepAlive *time.Duration, fail *statusError) *runner {
	r := &runner{
		m:         m,
		pid:       s.newPIDLocked(),
		loading:   true,
		loadDone:  make(chan struct{}),
		readyAt:   time.Now().Add(max(m.cfg.LoadLatency, MinLoadDuration)),
		keepAlive: s.cfg.DefaultKeepAlive,
		vram:      vram,
	}
	if keepAlive != nil {
		r.keepAlive = *keepAlive
	}
	s.holdLocked(r)
	m.runner = r
	s.wg.Add(1)
	go s.load(r, fail)
	return r
}

// load waits out the model's load latency, then lists the runner, or fails
// the load with fail.
func (s *Server) load(r *runner, fail *statusError) {
	defer s.wg.Done()
	t := time.NewTimer(time.Until(r.readyAt))
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.done:
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.notifyLocked()
	r.loading = false
	defer close(r.loadDone)
	m := r.m
	if s.closed {
		r.loadErr = errClosed
		return
	}
	if fail != nil {
		r.loadErr = fail
		m.stats.LoadFailures++
		s.eventLocked(m, EventLoadFailed, nil)
		if m.runner == r {
			m.runner = nil
		}
		s.freeHoldingLocked(r, false)
		return
	}
	m.stats.Loads++
	s.eventLocked(m, EventLoaded, nil)
	if r.doomed {
		r.expiresAt = time.Now()
	}
	if r.refs == 0 && m.runner == r {
		// Every waiter gave up during the load. Ollama 0.17 then drops the
		// runner (measured on a real server); with the race fixed it idles
		// for its keep-alive.
		if s.lose {
			s.removeRunnerLocked(r)
		} else {
			s.idleLocked(r)
		}
	}
}

// idleLocked starts r's keep-alive once its last reference is gone.
func (s *Server) idleLocked(r *runner) {
	now := time.Now()
	switch {
	case r.doomed || r.keepAlive == 0:
		r.doomed = true
		if r.expiresAt.IsZero() || r.expiresAt.After(now) {
			r.expiresAt = now
		}
		s.scheduleRemovalLocked(r)
	case forever(r.keepAlive):
		r.expiresAt = now.Add(math.MaxInt64)
	default:
		r.expiresAt = now.Add(r.keepAlive)
		s.stopLocked(r.expiry)
		r.expiry = s.afterLocked(r.keepAlive, func() {
			r.expiry = nil
			if r.refs > 0 || r.m.runner != r {
				return
			}
			r.doomed = true
			s.scheduleRemovalLocked(r)
		})
	}
}

// expireLocked handles an unload request for m, like Ollama's expireRunner.
func (s *Server) expireLocked(m *model) {
	r := m.runner
	if r == nil {
		return
	}
	if r.loading {
		// v0.17.x registers the runner only when loading is over, so the
		// unload finds nothing.
		if !s.lose {
			r.doomed = true
			r.keepAlive = 0
		} else {
			s.eventLocked(m, EventUnloadLost, nil)
		}
		return
	}
	r.expiresAt = time.Now()
	r.keepAlive = 0
	r.doomed = true
	s.stopLocked(r.expiry)
	r.expiry = nil
	if r.refs == 0 {
		s.scheduleRemovalLocked(r)
	}
	s.notifyLocked()
}

// scheduleRemovalLocked removes r from /api/ps after UnloadDelay, if it is
// still unreferenced then.
func (s *Server) scheduleRemovalLocked(r *runner) {
	if s.cfg.UnloadDelay < 0 {
		s.removeRunnerLocked(r)
		return
	}
	if r.removal != nil {
		return // an unload under way is not restarted by another request
	}
	r.removal = s.afterLocked(s.cfg.UnloadDelay, func() {
		r.removal = nil
		if r.refs > 0 || r.m.runner != r {
			return // a new request took it; its end reschedules
		}
		s.removeRunnerLocked(r)
	})
}

// removeRunnerLocked takes r off /api/ps and frees its memory.
func (s *Server) removeRunnerLocked(r *runner) {
	s.stopLocked(r.expiry)
	s.stopLocked(r.removal)
	r.expiry, r.removal = nil, nil
	if r.m.runner == r {
		r.m.runner = nil
		r.m.stats.Unloads++
		s.eventLocked(r.m, EventUnloaded, nil)
	}
	s.freeHoldingLocked(r, false)
	s.notifyLocked()
}

// crash marks r dead after a mid-stream crash: it stays listed, but its
// process, and so its GPU memory, is gone.
func (s *Server) crash(r *runner) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.dead = true
	r.m.stats.Crashes++
	s.eventLocked(r.m, EventCrashed, nil)
	s.freeHoldingLocked(r, false)
	s.notifyLocked()
}
