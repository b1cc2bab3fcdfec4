package vramguard

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// book is a client's record of its models: the generations in flight, the
// guarded uses, the models left warm and the phases not yet ended, and
// whether the client is closed. It owns its lock; nothing else touches its
// maps.
type book struct {
	mu       sync.Mutex
	closed   bool
	inflight map[string]map[*flight]struct{} // normalized model -> generations of this client
	warm     map[string]struct{}             // models used with a keep-alive other than unload
	uses     map[string]*use                 // normalized model -> guarded users
	phases   map[*Phase]func() bool          // phases not yet ended, with the stop of each one's context watch
	begun    map[string]uint64               // normalized model -> generations begun so far
	// starting holds a channel per call between its start and begin (or
	// its failure before it), closed then: EnsureFree waits for those
	// started before it, whose loads it cannot see yet.
	starting map[chan struct{}]struct{}
}

func newBook() *book {
	return &book{
		inflight: make(map[string]map[*flight]struct{}),
		warm:     make(map[string]struct{}),
		uses:     make(map[string]*use),
		phases:   make(map[*Phase]func() bool),
		begun:    make(map[string]uint64),
		starting: make(map[chan struct{}]struct{}),
	}
}

// start registers a call that has not begun its generation yet (its
// admission by Options.Budget, its capabilities question still to come).
// The returned func ends that; it is safe to call more than once.
func (b *book) start() (begun func()) {
	done := make(chan struct{})
	b.mu.Lock()
	b.starting[done] = struct{}{}
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.endStarting(done)
	}
}

// endStarting ends one starting call; b.mu is held. Ending it twice does
// nothing.
func (b *book) endStarting(done chan struct{}) {
	if _, ok := b.starting[done]; ok {
		delete(b.starting, done)
		close(done)
	}
}

// startingNow returns a channel per call started and not yet begun, each
// closed once that call began its generation (its load is then in
// loadingModels) or failed before it.
func (b *book) startingNow() []<-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]<-chan struct{}, 0, len(b.starting))
	for done := range b.starting {
		out = append(out, done)
	}
	return out
}

// flight is one generation of this client, from begin to its end.
type flight struct {
	// cancel cuts the request with a cause; nil when the request cannot
	// be cut from outside.
	cancel context.CancelCauseFunc
	// streaming is set at the first chunk: the model is loaded by then,
	// and an unload no longer cancels the request (see cancelLoads).
	streaming atomic.Bool
	// sent is set once the request's headers were written to the server
	// (httptrace), or when the request does not go through net/http (the
	// CLI fallback): before that it cannot have loaded anything.
	sent atomic.Bool
	// cut is set, under the book's lock, once an unload canceled it.
	cut bool
	// admitted: a request OllamaClient.Admit admitted, which the caller
	// sends: once it has landed (streaming) it loads nothing again, and an
	// unload's verdict does not wait for its end (the caller may hold its
	// reply until the unload is verified: vramgate's keep_alive 0).
	admitted bool

	// What begin changed, for unsent: the model's begin count after
	// this one, whether the model was warm before, and the guarded use
	// it touched for the first time (nil if none).
	key     string
	begunAt uint64
	wasWarm bool
	touched *use
}

// use counts the guarded users of one model in one client.
type use struct {
	n          int
	wantUnload bool // a user that left while others held the model wanted it unloaded
	// touched: a generation on the model began during the uses (begin
	// marks it). Uses refused before any request went out leave the
	// model alone: their cleanup has nothing to unload.
	touched bool
}

// isClosed reports whether Close has begun.
func (b *book) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// close marks the book closed and returns the models left warm; ok is
// false when it was closed already.
func (b *book) close() (warm []string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, false
	}
	b.closed = true
	// Calls not yet begun will fail with ErrClosed: room-making (the
	// phases' hand-overs Close makes) has no load of theirs to wait for.
	for done := range b.starting {
		b.endStarting(done)
	}
	for m := range b.warm {
		warm = append(warm, m)
	}
	slices.Sort(warm)
	return warm, true
}

// begin registers a generation on model; the returned func ends it.
// cancel, when not nil, lets an unload of the model cut the request while
// it is still loading; admitted marks a request Admit admitted (flight).
// It fails with ErrClosed once Close has begun.
func (b *book) begin(op, model string, ka KeepAlive, cancel context.CancelCauseFunc, admitted bool) (f *flight, end func(), err error) {
	key := NormalizeModelName(model)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, newError(op, model, KindUnavailable, ErrClosed)
	}
	_, wasWarm := b.warm[key]
	f = &flight{cancel: cancel, key: key, wasWarm: wasWarm, admitted: admitted}
	if b.inflight[key] == nil {
		b.inflight[key] = make(map[*flight]struct{})
	}
	b.inflight[key][f] = struct{}{}
	b.begun[key]++
	f.begunAt = b.begun[key]
	if u := b.uses[key]; u != nil && !u.touched {
		u.touched, f.touched = true, u // a guarded use's request goes out
	}
	if ka != KeepAliveUnload {
		b.warm[key] = struct{}{}
	}
	return f, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if delete(b.inflight[key], f); len(b.inflight[key]) == 0 {
			delete(b.inflight, key)
		}
	}, nil
}

// unsent takes back what begin recorded for f, a generation that cannot
// have loaded its model (the server never received it, or has no such
// model): the model is not warm because of it, and a guarded use it alone
// touched has nothing to unload. A later generation on the model keeps
// everything as it is, since it may load the model.
func (b *book) unsent(f *flight) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.begun[f.key] != f.begunAt {
		return
	}
	if !f.wasWarm {
		delete(b.warm, f.key)
	}
	if f.touched != nil {
		f.touched.touched = false
	}
}

// inFlight returns the number of this client's generations on model that
// may still load it (an admitted request that landed may not), and how
// many have begun so far (for forget). With sentOnly it counts only those
// whose request has gone out.
func (b *book) inFlight(model string, sentOnly bool) (n int, begun uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := NormalizeModelName(model)
	for f := range b.inflight[key] {
		if (!sentOnly || f.sent.Load()) && !(f.admitted && f.streaming.Load()) {
			n++
		}
	}
	return n, b.begun[key]
}

// inFlightModels returns the models (normalized) on which this client
// has a generation in flight: room-making leaves them (KeptModel.InUse).
func (b *book) inFlightModels() map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]bool, len(b.inflight))
	for k, fs := range b.inflight {
		if len(fs) > 0 {
			out[k] = true
		}
	}
	return out
}

// loadingModels returns the models on which this client has a generation
// with no chunk yet (which /api/ps does not list while it loads).
func (b *book) loadingModels() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ms []string
	for m, fs := range b.inflight {
		for f := range fs {
			if !f.streaming.Load() {
				ms = append(ms, m)
				break
			}
		}
	}
	slices.Sort(ms)
	return ms
}

// cancelLoads cuts this client's generations on model that have not
// received a chunk yet (they may be loading it: an unload that arrives
// during a load is dropped, and canceling the request that caused the
// load aborts it) with cause ErrUnloadedWhileLoading. It returns how many
// it cut; a generation is cut once.
func (b *book) cancelLoads(model string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for f := range b.inflight[NormalizeModelName(model)] {
		if f.cancel != nil && !f.cut && !f.streaming.Load() {
			f.cut = true
			f.cancel(ErrUnloadedWhileLoading)
			n++
		}
	}
	return n
}

// forget drops model from the warm set once it was verified gone, unless
// a generation began on it since the count the verdict rests on (begun, as
// inFlight returned it): that one may load it again with its keep-alive,
// and Close must still unload it.
func (b *book) forget(model string, begun uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := NormalizeModelName(model)
	if b.begun[key] == begun {
		delete(b.warm, key)
	}
}

// acquire registers a guarded user of model. release returns whether the
// caller was the last user and whether an earlier user asked for an unload.
func (b *book) acquire(model string) (release func(wantUnload bool) (last, unload bool)) {
	key := NormalizeModelName(model)
	b.mu.Lock()
	u := b.uses[key]
	if u == nil {
		u = &use{}
		b.uses[key] = u
	}
	u.n++
	b.mu.Unlock()
	var once sync.Once
	return func(wantUnload bool) (last, unload bool) {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			u.n--
			u.wantUnload = u.wantUnload || wantUnload
			if u.n == 0 {
				last, unload = true, u.wantUnload && u.touched
				delete(b.uses, key)
			}
		})
		return last, unload
	}
}

// users returns how many guarded uses of model are running.
func (b *book) users(model string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if u := b.uses[NormalizeModelName(model)]; u != nil {
		return u.n
	}
	return 0
}

// addPhase registers p, unless the client is closed. arm starts the
// watch of p's context and returns its stop; it runs under the same lock,
// so that Close cannot slip in between, and a watch that fires at once
// finds p registered with its stop (removePhase waits for the lock).
func (b *book) addPhase(op string, p *Phase, arm func() (stop func() bool)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return newError(op, "", KindUnavailable, ErrClosed)
	}
	b.phases[p] = arm()
	return nil
}

// removePhase forgets p and returns the func that stops its context
// watch (nil if it was gone).
func (b *book) removePhase(p *Phase) (stop func() bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	stop = b.phases[p]
	delete(b.phases, p)
	return stop
}

// livePhases returns the phases not yet ended: all of them, or only those
// whose context is done.
func (b *book) livePhases(all bool) []*Phase {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ps []*Phase
	for p := range b.phases {
		select {
		case <-p.ctxDone:
			ps = append(ps, p)
		default:
			if all {
				ps = append(ps, p)
			}
		}
	}
	return ps
}
