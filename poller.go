package vramguard

import (
	"context"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
	"golang.org/x/sync/singleflight"
)

// poller shares a client's /api/ps requests among the unloads that wait on
// them: at most one request per poll interval, and one in flight at a
// time (singleflight), however many models are being unloaded. Fewer
// requests also mean less exposure to the /api/ps crash of Ollama v0.6.5 to
// v0.32.3 (see the README).
type poller struct {
	list     func(context.Context) (*api.ProcessResponse, error)
	interval time.Duration
	timeout  time.Duration // bounds one shared request
	group    singleflight.Group
	seen     func(listing) // told every listing read (the churn record); nil: none

	mu      sync.Mutex
	last    listing       // the latest completed request
	running int           // shared requests in flight (0 or 1)
	idle    chan struct{} // closed when running drops to zero; nil when none waits
}

func newPoller(a *api.Client, opts Options, seen func(listing)) *poller {
	return &poller{list: a.ListRunning, interval: opts.PollInterval, timeout: opts.UnloadTimeout, seen: seen}
}

// listing is one /api/ps reply and when its request went out.
type listing struct {
	sent time.Time
	resp *api.ProcessResponse
	err  error
}

// get returns a listing whose request went out at or after since: the
// latest one if it qualifies, else the one in flight, else a new one, sent
// no sooner than one interval after the previous request (the caller
// waits for that, bounded by ctx). It waits at most until ctx is done.
func (p *poller) get(ctx context.Context, since time.Time) (listing, error) {
	for {
		p.mu.Lock()
		last := p.last
		p.mu.Unlock()
		if !last.sent.IsZero() && !last.sent.Before(since) {
			return last, nil
		}
		// One request per interval, shared by every waiter.
		if wait := time.Until(last.sent.Add(p.interval)); !last.sent.IsZero() && wait > 0 {
			if err := sleepCtx(ctx, wait); err != nil {
				return listing{}, err
			}
		}
		ch := p.group.DoChan("ps", p.fetch)
		select {
		case r := <-ch:
			l := r.Val.(listing)
			if !l.sent.Before(since) {
				return l, nil
			}
			// A request that went out before since: ask again.
		case <-ctx.Done():
			return listing{}, context.Cause(ctx)
		}
	}
}

// fetch makes the shared request, unless another went out less than an
// interval ago (a waiter raced it): that one's listing is returned, and
// the waiter asks again. Its run is counted for join.
func (p *poller) fetch() (any, error) {
	p.mu.Lock()
	if prev := p.last; !prev.sent.IsZero() && time.Since(prev.sent) < p.interval {
		p.mu.Unlock()
		return prev, nil
	}
	p.running++
	p.mu.Unlock()
	defer p.done()
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	l := listing{sent: time.Now()}
	l.resp, l.err = p.list(ctx)
	p.record(l)
	return l, nil
}

// done ends a request counted in running, waking join at the last.
func (p *poller) done() {
	p.mu.Lock()
	if p.running--; p.running == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
	p.mu.Unlock()
}

// record tells seen of l and keeps it as the latest, unless a newer one is.
func (p *poller) record(l listing) {
	if p.seen != nil {
		p.seen(l)
	}
	p.mu.Lock()
	if l.sent.After(p.last.sent) {
		p.last = l
	}
	p.mu.Unlock()
}

// now makes a request at once, outside the interval that paces the
// unloads' polls, and shares its listing as the latest: an admission must
// see the server as it is when its request is about to go out, and one
// admission after another (a proxy's requests in a row) must not wait an
// interval each. It is counted for join, and bounded by ctx and the
// poller's timeout.
func (p *poller) now(ctx context.Context) (listing, error) {
	p.mu.Lock()
	p.running++
	p.mu.Unlock()
	defer p.done()
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	l := listing{sent: time.Now()}
	l.resp, l.err = p.list(rctx)
	if ctx.Err() != nil {
		return listing{}, context.Cause(ctx)
	}
	p.record(l)
	return l, nil
}

// join waits for the shared request in flight, if any, or until ctx is
// done: Shutdown leaves no request of the client running.
func (p *poller) join(ctx context.Context) error {
	p.mu.Lock()
	if p.running == 0 {
		p.mu.Unlock()
		return nil
	}
	if p.idle == nil {
		p.idle = make(chan struct{})
	}
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
