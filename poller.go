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

	mu   sync.Mutex
	last listing // the latest completed request
}

func newPoller(a *api.Client, opts Options) *poller {
	return &poller{list: a.ListRunning, interval: opts.PollInterval, timeout: opts.UnloadTimeout}
}

// listing is one /api/ps reply and when its request went out.
type listing struct {
	sent time.Time
	resp *api.ProcessResponse
	err  error
}

// get returns a listing whose request went out at or after since: the
// latest one if it qualifies, else the one in flight, else a new one, sent
// no sooner than one interval after the previous request. It waits at
// most until ctx is done.
func (p *poller) get(ctx context.Context, since time.Time) (listing, error) {
	for {
		p.mu.Lock()
		last := p.last
		p.mu.Unlock()
		if !last.sent.IsZero() && !last.sent.Before(since) {
			return last, nil
		}
		ch := p.group.DoChan("ps", func() (any, error) {
			p.mu.Lock()
			prev := p.last.sent
			p.mu.Unlock()
			if wait := time.Until(prev.Add(p.interval)); !prev.IsZero() && wait > 0 {
				time.Sleep(wait) // one request per interval, shared by every waiter
			}
			ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
			defer cancel()
			l := listing{sent: time.Now()}
			l.resp, l.err = p.list(ctx)
			p.mu.Lock()
			if l.sent.After(p.last.sent) {
				p.last = l
			}
			p.mu.Unlock()
			return l, nil
		})
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
