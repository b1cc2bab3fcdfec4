package vramguard

// The reload-churn report: when a model loads again soon after it left,
// why it had left.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/procs"
)

// ReloadCause says why a model that loaded again had left the server.
type ReloadCause string

// The causes of a reload, in the order they are tested: the first that
// the client's own record supports is the one reported.
const (
	// ReloadUnloaded: this client unloaded the model (ReloadEvent.Unload
	// names the call) other than to make room.
	ReloadUnloaded ReloadCause = "unloaded by this client"
	// ReloadEvicted: this client's budget (Budget.MakeRoom) evicted the
	// model to admit another.
	ReloadEvicted ReloadCause = "evicted by this client's budget"
	// ReloadContextChanged: the request asked for another context size
	// (num_ctx) than the load before it; Ollama loads the model again for
	// that, resident or not.
	ReloadContextChanged ReloadCause = "context size changed"
	// ReloadRestarted: the server restarted since the model's last use:
	// a runner of another `ollama serve` process serves it now (a local
	// server), or a connection to the server failed in between (refused,
	// reset or cut mid-reply: a restart, a crash of the server, or a proxy
	// that dropped it; Evidence says which was seen). A keep-alive this
	// client sent that ran out before the load is reported first, as
	// ReloadExpired. A pool (package pool) reports no restart for a
	// member that went away: its failures do not reach the client as a
	// connection lost to its own address (they are the pool's typed
	// errors, ErrUnreachable), except a stream cut mid-reply.
	ReloadRestarted ReloadCause = "server restarted"
	// ReloadExpired: the model's keep-alive ran out before the load
	// (ReloadEvent.KeepAlive says which one); a keep-alive of 0
	// (KeepAliveUnload) runs out when the request ends.
	ReloadExpired ReloadCause = "keep-alive expired"
	// ReloadForeign: the model left while its keep-alive still ran and
	// this client did not unload it: another program unloaded it, or the
	// server evicted it to load another program's model.
	ReloadForeign ReloadCause = "unloaded or evicted by another program"
)

// ReloadEvent says why a model loaded again (Generation.Reload, which
// Hooks.OnCallEnd sees).
type ReloadEvent struct {
	Model  string
	Server string // the client's Ollama server, as Options.Host names it
	Cause  ReloadCause
	// Since is the time from this client's last use of the model (or its
	// unload, when that came later) to this load's request.
	Since time.Duration
	// Unload is the call of this client that unloaded the model, for
	// ReloadUnloaded and ReloadEvicted.
	Unload UnloadCause
	// KeepAlive is the keep-alive the last use left the model with, for
	// ReloadExpired and ReloadForeign: the one the request sent, else
	// the expiry /api/ps listed after it, else Ollama's default of 5
	// minutes (Evidence says which).
	KeepAlive time.Duration
	// NumCtx and PrevNumCtx are the context sizes this load and the one
	// before it asked for (0: the server's default).
	NumCtx, PrevNumCtx int
	// Evidence says what the cause rests on, in words.
	Evidence string
}

// ollamaDefaultKeepAlive is the keep-alive of a server started without
// OLLAMA_KEEP_ALIVE.
const ollamaDefaultKeepAlive = 5 * time.Minute

// churn is the record the report is made from: per model, this client's
// last use, its keep-alive and context size, its own last unload and the
// server that served it; and when the server last refused a connection.
type churn struct {
	mu     sync.Mutex
	models map[string]*churnModel
	downAt time.Time // the last failed connection
}

type churnModel struct {
	lastUse   time.Time // the end of the last successful call
	keepAlive KeepAlive // what that call sent
	expires   time.Time // the expiry /api/ps listed after lastUse; zero: none seen
	loaded    bool      // a load of this client was recorded (numCtx is known)
	numCtx    int       // what the last load asked for
	server    int       // pid of the `ollama serve` whose runner served the last load; 0: unknown
	unloadAt  time.Time // this client's last verified unload after lastUse
	unload    UnloadCause
	loadEnd   stamp // when the last load this client counted ended
}

// stamp is when a load ended, on the server's clock (from a reply's
// created_at) or, where the reply had none, on this client's.
type stamp struct {
	at     time.Time
	server bool
	numCtx int // what the load was asked for
	// callEnd is when the call that reported it ended, on this client's
	// clock: a call begun after it cannot have waited for the same load.
	callEnd time.Time
}

// loadEnd is when the load a successful call waited for ended: on the
// server's clock, its done line's created_at less total_duration (the
// handler's start) plus load_duration; without a created_at, the call's
// start on this client's clock plus load_duration.
func loadEnd(st *streamState, m api.Metrics) stamp {
	if !st.last.at.IsZero() && m.TotalDuration >= m.LoadDuration {
		return stamp{at: st.last.at.Add(m.LoadDuration - m.TotalDuration), server: true}
	}
	return stamp{at: st.start.Add(m.LoadDuration)}
}

// sameLoadWithin is how close the ends of two calls' loads are when they
// waited for one load: Ollama hands the one runner to every waiter within
// a few milliseconds, while two loads of a model end at least a load
// apart (the second starts after the first's runner went). At most half
// the threshold, so that a load it counts is never taken for another.
func sameLoadWithin(threshold time.Duration) time.Duration {
	return min(5*time.Millisecond, threshold/2)
}

// sameLoad reports whether a call begun at start whose load ended at end
// waited for the load prev records.
func (prev stamp) sameLoad(start time.Time, end stamp, tol time.Duration) bool {
	return !prev.at.IsZero() && prev.server == end.server && prev.numCtx == end.numCtx &&
		start.Before(prev.callEnd) && prev.at.Sub(end.at).Abs() <= tol
}

func (ch *churn) model(key string) *churnModel {
	if ch.models == nil {
		ch.models = make(map[string]*churnModel)
	}
	m := ch.models[key]
	if m == nil {
		m = &churnModel{}
		ch.models[key] = m
	}
	return m
}

// unloaded records a verified unload of this client.
func (ch *churn) unloaded(model string, cause UnloadCause, at time.Time) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	m := ch.model(NormalizeModelName(model))
	m.unloadAt, m.unload = at, cause
}

// connLost records a connection to the server that failed: refused, reset,
// or cut mid-reply. Whatever the cause (a restart, a crash of the server,
// a proxy in between), a model's runner may have gone with it.
func (ch *churn) connLost(err error, at time.Time) {
	if !connFailed(err) {
		return
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if at.After(ch.downAt) {
		ch.downAt = at
	}
}

// listed records the expiries an /api/ps listing shows.
func (ch *churn) listed(l listing) {
	if l.err != nil {
		ch.connLost(l.err, l.sent)
		return
	}
	if l.resp == nil {
		return
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for _, r := range l.resp.Models {
		m := ch.models[NormalizeModelName(r.Model)]
		if m != nil && !m.lastUse.IsZero() && l.sent.After(m.lastUse) && !r.ExpiresAt.IsZero() {
			m.expires = r.ExpiresAt
		}
	}
}

// used records a successful call that did not load its model.
func (ch *churn) used(model string, ka KeepAlive, at time.Time) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	m := ch.model(NormalizeModelName(model))
	m.lastUse, m.keepAlive, m.expires = at, ka, time.Time{}
	m.unloadAt, m.unload = time.Time{}, ""
}

// loadedAgain records a call that began at start, ended at end and
// reported a load that ended at le. A call that waited for the load
// another call of this client reported (stamp.sameLoad within tol) is a
// use: first is false. Otherwise it records the load and returns why the
// model had left, or nil when this client had not used it within window.
// server is the pid of the server that serves it now (0: unknown).
func (ch *churn) loadedAgain(model string, ka KeepAlive, numCtx, server int, start, end time.Time, window time.Duration, le stamp, tol time.Duration) (ev *ReloadEvent, first bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	m := ch.model(NormalizeModelName(model))
	le.numCtx = numCtx
	if m.loadEnd.sameLoad(start, le, tol) {
		m.lastUse, m.keepAlive, m.expires = end, ka, time.Time{}
		m.unloadAt, m.unload = time.Time{}, ""
		return nil, false
	}
	le.callEnd = end
	prev := *m
	downAt := ch.downAt
	*m = churnModel{lastUse: end, keepAlive: ka, loaded: true, numCtx: numCtx, server: server, loadEnd: le}
	ref := prev.lastUse
	if prev.unloadAt.After(ref) {
		ref = prev.unloadAt
	}
	if ref.IsZero() || start.Sub(ref) > window {
		return nil, true
	}
	ev = &ReloadEvent{Model: model, Since: max(0, start.Sub(ref)), NumCtx: numCtx}
	if prev.loaded {
		ev.PrevNumCtx = prev.numCtx
	}
	switch {
	case !prev.unloadAt.IsZero() && prev.unload == CauseBudget:
		ev.Cause, ev.Unload = ReloadEvicted, prev.unload
		ev.Evidence = "this client's budget unloaded it, verified"
	case !prev.unloadAt.IsZero():
		ev.Cause, ev.Unload = ReloadUnloaded, prev.unload
		ev.Evidence = fmt.Sprintf("this client unloaded it (%s), verified", prev.unload)
	case prev.loaded && prev.numCtx != numCtx:
		ev.Cause = ReloadContextChanged
		ev.Evidence = fmt.Sprintf("num_ctx %s, the load before %s", ctxWords(numCtx), ctxWords(prev.numCtx))
	case prev.server != 0 && server != 0 && prev.server != server:
		ev.Cause = ReloadRestarted
		ev.Evidence = fmt.Sprintf("its runner's server was pid %d, now pid %d", prev.server, server)
	default:
		ch.leftIdle(ev, prev, downAt, start)
	}
	return ev, true
}

// leftIdle names the cause of a model that left while this client did not
// use it: a keep-alive this client sent and that ran out is certain; a
// failed connection since the last use comes next; then the keep-alive
// the server had (seen or assumed), else another program.
func (ch *churn) leftIdle(ev *ReloadEvent, prev churnModel, downAt, start time.Time) {
	d, how := keepAliveOf(prev)
	expired := d >= 0 && !start.Before(prev.lastUse.Add(d))
	_, sent := prev.keepAlive.Duration()
	switch {
	case expired && sent:
		ev.Cause, ev.KeepAlive = ReloadExpired, d
		ev.Evidence = how + "; expired before this request"
	case !prev.lastUse.IsZero() && downAt.After(prev.lastUse):
		ev.Cause = ReloadRestarted
		ev.Evidence = fmt.Sprintf("the connection to the server failed %v after the last use", downAt.Sub(prev.lastUse).Round(time.Millisecond))
	case expired:
		ev.Cause, ev.KeepAlive = ReloadExpired, d
		ev.Evidence = how + "; expired before this request"
	default:
		ev.Cause, ev.KeepAlive = ReloadForeign, d
		ev.Evidence = how + "; still running when the model left"
	}
}

// keepAliveOf is the keep-alive a model was left with (-1: forever) and
// where that figure comes from.
func keepAliveOf(m churnModel) (time.Duration, string) {
	if d, ok := m.keepAlive.Duration(); ok {
		return d, fmt.Sprintf("keep-alive %s sent with the last request", m.keepAlive)
	}
	if !m.expires.IsZero() {
		return max(0, m.expires.Sub(m.lastUse).Round(time.Second)), "expiry listed by /api/ps after the last request"
	}
	return ollamaDefaultKeepAlive, "server's keep-alive not seen, Ollama's default of 5m assumed"
}

func ctxWords(n int) string {
	if n == 0 {
		return "the server's default"
	}
	return fmt.Sprint(n)
}

// noteLoad feeds a successful call to the churn record: a load returns the
// reload event, if any, which is logged and hooked here.
func (c *OllamaClient) noteLoad(ctx context.Context, gen *Generation, ka KeepAlive, options map[string]any, start time.Time, le stamp) {
	end := time.Now()
	if !gen.Loaded {
		c.churn.used(gen.Model, ka, end)
		return
	}
	numCtx := numCtxOf(options)
	server := c.servingServer(ctx, gen.Model)
	ev, first := c.churn.loadedAgain(gen.Model, ka, numCtx, server, start, end, c.opts.ReloadWindow, le, sameLoadWithin(c.opts.LoadThreshold))
	if !first {
		// Another call of this client waited for the same load: Ollama
		// reports its load_duration to each, and one load is one.
		gen.Loaded = false
		return
	}
	if ev == nil {
		return
	}
	ev.Server = c.host
	gen.Reload = ev
	c.log.Info("model loaded again", "model", ev.Model, "cause", string(ev.Cause), "since", ev.Since.Round(time.Millisecond), "evidence", ev.Evidence)
}

// servingServer is the pid of the `ollama serve` whose runner serves the
// model's weights on this machine, or 0 when that cannot be told (a
// remote server, a runner gone already, no procfs).
func (c *OllamaClient) servingServer(ctx context.Context, model string) int {
	if !isLocalHost(c.host) {
		return 0
	}
	path, blob, err := c.modelWeights(ctx, model)
	if err != nil || blob == "" {
		return 0
	}
	rs, err := procs.RunnersFor(c.procRoot, blob)
	if err != nil {
		return 0
	}
	pid := 0
	for _, r := range rs {
		if r.ServerPID == 0 || (filepath.IsAbs(path) && filepath.IsAbs(r.ModelPath) && filepath.Clean(r.ModelPath) != filepath.Clean(path)) {
			continue
		}
		if pid != 0 && pid != r.ServerPID {
			return 0 // two servers run it: which one is this client's is not known
		}
		pid = r.ServerPID
	}
	return pid
}

// connFailed reports whether err is a connection to the server that
// failed: refused, reset, closed before the reply (the transport's EOF),
// or cut mid-reply.
func connFailed(err error) bool {
	var op *net.OpError
	var ue *url.Error
	return errors.As(err, &op) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		(errors.As(err, &ue) && errors.Is(err, io.EOF))
}
