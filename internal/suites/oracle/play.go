package oracle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
)

// The client under test's settings: short enough that a schedule that
// runs into a timeout still ends in seconds.
const (
	unloadTimeout  = 10 * time.Second
	cleanupTimeout = 15 * time.Second
	firstChunk     = 15 * time.Second
	totalTimeout   = 20 * time.Second
	hangFirstChunk = 1500 * time.Millisecond // with FaultHangLoad
	// margin is what a call may take beyond its timeouts on a busy
	// machine.
	margin = 10 * time.Second
)

// Config says how Play runs a schedule.
type Config struct {
	// Child returns the command of a second process that runs one guarded
	// generation of model with vramguard against host (the server's own
	// address), records its sends with ChildTransport and prints a
	// ChildLine; nil skips OpChild actions.
	Child func(ctx context.Context, host, model string, tokens int) *exec.Cmd
	// Look is the time between two looks at the server. Zero means 20 ms.
	Look time.Duration
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// player is one schedule's run.
type player struct {
	tgt   Target
	cfg   Config
	trace *Trace
	raw   *api.Client // the foreign party
	rawTr *http.Transport
	cli   *proxy

	mu      sync.Mutex
	client  *vramguard.OllamaClient
	clients []*vramguard.OllamaClient
	ownTr   *http.Transport
	fault   Fault
}

// Play runs s against tgt and returns its trace; the error is a failure of
// the harness (a proxy that could not listen), not of the library.
func Play(ctx context.Context, tgt Target, s *Schedule, cfg Config) (*Trace, error) {
	if cfg.Look <= 0 {
		cfg.Look = 20 * time.Millisecond
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	p := &player{tgt: tgt, cfg: cfg, trace: &Trace{}}
	var err error
	if p.cli, err = newProxy(PartyCLI, p.trace, tgt.URL()); err != nil {
		return nil, err
	}
	defer p.cli.Close()
	p.rawTr = http.DefaultTransport.(*http.Transport).Clone()
	defer p.rawTr.CloseIdleConnections()
	p.raw = api.NewClient(tgt.URL(), &http.Client{Transport: &recorder{party: PartyForeign, trace: p.trace, next: p.rawTr}})
	p.ownTr = http.DefaultTransport.(*http.Transport).Clone()
	defer p.ownTr.CloseIdleConnections()
	// A schedule starts on an empty server, so that its replay starts
	// from the same state.
	if err := waitEmpty(ctx, tgt, 20*time.Second); err != nil {
		return nil, fmt.Errorf("oracle: the server is not empty at the start: %w", err)
	}
	if err := p.newClient(); err != nil {
		return nil, err
	}

	// The watcher looks at the server until the end.
	wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(cfg.Look)
		defer t.Stop()
		for {
			p.trace.observe(tgt.Observe(wctx))
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
		}
	}()

	id := 0
	for _, round := range s.Rounds {
		var wg sync.WaitGroup
		start := time.Now()
		// The round's fault is in force before its other actions start,
		// so that each sees it the same way in every replay.
		for _, a := range round {
			if a.Op == OpFault {
				p.trace.result(p.run(ctx, id, a))
				id++
			}
		}
		for _, a := range round {
			if a.Op == OpFault {
				continue
			}
			wg.Add(1)
			go func(id int, a Action) {
				defer wg.Done()
				if d := time.Until(start.Add(a.At)); d > 0 {
					time.Sleep(d)
				}
				p.trace.result(p.run(ctx, id, a))
			}(id, a)
			id++
		}
		if hung := p.wait(&wg, start, round); hung != "" {
			// A call that outlives its bound by a minute is a hang: the
			// schedule is abandoned with what its goroutines were doing.
			p.trace.mu.Lock()
			p.trace.Hung = hung
			p.trace.mu.Unlock()
			stopWatch()
			<-watched
			return p.trace.freeze(), nil
		}
		if err := p.clearFault(); err != nil {
			stopWatch()
			<-watched
			return p.trace.freeze(), fmt.Errorf("oracle: clear the fault: %w", err)
		}
		p.mu.Lock()
		closed := p.client == nil
		p.mu.Unlock()
		if closed {
			if err := p.newClient(); err != nil {
				stopWatch()
				<-watched
				return p.trace.freeze(), err
			}
		}
	}

	// The end: the client under test closes, then the foreign party
	// cleans up after itself; the watch goes on for a window after the
	// last verdict.
	// Both under the hang watchdog too.
	var closed Result
	end := func(fn func()) bool {
		done := make(chan struct{})
		go func() {
			defer close(done)
			fn()
		}()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { <-done; wg.Done() }()
		hung := p.wait(&wg, time.Now(), []Action{{Op: OpClose}})
		if hung != "" {
			p.trace.mu.Lock()
			p.trace.Hung = "at the end: " + hung
			p.trace.mu.Unlock()
		}
		return hung == ""
	}
	if !end(func() { closed = p.closeAll(ctx, id) }) {
		stopWatch()
		<-watched
		return p.trace.freeze(), nil
	}
	p.trace.result(closed)
	after := tgt.Observe(ctx)
	p.trace.mu.Lock()
	p.trace.AfterClose, p.trace.CloseErr = after, closed.Err
	p.trace.mu.Unlock()
	var cleaned Result
	if !end(func() { cleaned = p.foreignCleanup(ctx, id+1) }) {
		stopWatch()
		<-watched
		return p.trace.freeze(), nil
	}
	p.trace.result(cleaned)
	w := Window(tgt, p.trace)
	p.trace.mu.Lock()
	var last time.Time
	for _, v := range p.trace.Verdicts {
		last = maxTime(last, v.T)
	}
	p.trace.mu.Unlock()
	if d := time.Until(last.Add(w)); d > 0 {
		time.Sleep(d)
	}
	time.Sleep(2 * cfg.Look)
	stopWatch()
	<-watched
	return p.trace.freeze(), nil
}

// wait waits for a round's actions, or returns a description of a hang
// once one outlived its bound by a minute.
func (p *player) wait(wg *sync.WaitGroup, start time.Time, round []Action) string {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	var limit time.Duration
	for _, a := range round {
		limit = max(limit, a.At+a.bound())
	}
	select {
	case <-done:
		return ""
	case <-time.After(time.Until(start.Add(limit + time.Minute))):
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		return fmt.Sprintf("a round of %d actions still runs %v after its start, past every bound; goroutines:\n%s",
			len(round), time.Since(start).Round(time.Second), b.String())
	}
}

// Window is how long a verified model must stay gone: longer than the
// slowest load the schedule saw or the target measured, and a second at
// least.
func Window(tgt Target, tr *Trace) time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return max(2*max(tgt.LoadTime(), tr.MaxLoad), time.Second)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (p *player) newClient() error {
	c, err := vramguard.NewClient(vramguard.Options{
		Host:           p.tgt.URL().String(),
		HTTPClient:     &http.Client{Transport: &recorder{party: PartyOwn, trace: p.trace, next: p.ownTr}},
		PollInterval:   25 * time.Millisecond,
		UnloadTimeout:  unloadTimeout,
		CleanupTimeout: cleanupTimeout,
		Timeouts:       vramguard.Timeouts{FirstChunk: firstChunk, Total: totalTimeout},
		Hooks: vramguard.Hooks{
			OnUnloadEnd: func(_ context.Context, e vramguard.UnloadEnd) {
				if r := e.Report; e.Err == nil && r.Verified {
					p.trace.verdict(Verdict{T: time.Now(), Party: PartyOwn, Model: Group(r.Model), Checked: r.Checked, NoRunnerCheck: r.NoRunnerCheck,
						Elapsed: r.Elapsed, Attempts: r.Attempts})
				}
			},
			OnCallEnd: func(_ context.Context, e vramguard.CallEnd) {
				if g := e.Generation; g != nil && g.Loaded {
					p.trace.load(g.Metrics.LoadDuration)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.client = c
	p.clients = append(p.clients, c)
	return nil
}

// own returns the current client, or the last one once closed (its
// calls then fail with ErrClosed, which is what a caller racing Close
// gets).
func (p *player) own() *vramguard.OllamaClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.client != nil {
		return p.client
	}
	return p.clients[len(p.clients)-1]
}

func keepAlive(ka string) vramguard.KeepAlive {
	switch ka {
	case KAUnload:
		return vramguard.KeepAliveUnload
	case KAHour:
		return vramguard.KeepAliveFor(time.Hour)
	case KAForever:
		return vramguard.KeepAliveForever
	}
	return vramguard.KeepAliveServerDefault
}

func rawKeepAlive(ka string) *api.Duration {
	switch ka {
	case KAUnload:
		return &api.Duration{Duration: 0}
	case KAHour:
		return &api.Duration{Duration: time.Hour}
	case KAForever:
		return &api.Duration{Duration: -1}
	}
	return nil
}

func (p *player) timeouts() vramguard.Timeouts {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == FaultHangLoad {
		return vramguard.Timeouts{FirstChunk: hangFirstChunk}
	}
	return vramguard.Timeouts{}
}

func (p *player) request(a Action) *vramguard.GenerateRequest {
	return &vramguard.GenerateRequest{Model: a.Model, Prompt: "a castle at dawn",
		Options: map[string]any{"num_predict": a.Tokens, "temperature": 0.7, "seed": 1}, Timeouts: p.timeouts()}
}

// run plays one action.
func (p *player) run(ctx context.Context, id int, a Action) Result {
	p.mu.Lock()
	res := Result{ID: id, Action: a, Start: time.Now(), Fault: p.fault}
	p.mu.Unlock()
	ctx = withAction(ctx, id)
	if a.CancelAt > 0 {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		t := time.AfterFunc(a.CancelAt, func() { cancel(errOracleCancel) })
		defer t.Stop()
		defer cancel(nil)
	}
	res.Bound = a.bound()
	c := p.own()
	g := vramguard.Guard{Client: c}
	switch a.Op {
	case OpGenerate:
		_, res.Err = c.GenerateStreaming(ctx, p.request(a), keepAlive(a.KeepAlive), nil)
	case OpGuard:
		_, res.Err = g.Generate(ctx, p.request(a), nil)
	case OpGuardAsync:
		g.Async = true
		_, res.Err = g.Generate(ctx, p.request(a), nil)
	case OpGuardChat:
		_, res.Err = g.Chat(ctx, &vramguard.ChatRequest{Model: a.Model,
			Messages: []api.Message{{Role: "user", Content: "a castle at dawn"}},
			Options:  map[string]any{"num_predict": a.Tokens, "seed": 1}, Timeouts: p.timeouts()}, nil)
	case OpPhase:
		ph, err := c.StartPhase(ctx, "oracle", vramguard.PhaseOptions{})
		if err != nil {
			res.Err = err
			break
		}
		pg := ph.Guard()
		var errs []error
		for range a.Steps {
			if _, err := pg.Generate(ctx, p.request(a), nil); err != nil {
				errs = append(errs, err)
			}
		}
		if _, err := ph.End(ctx); err != nil {
			errs = append(errs, err)
		}
		res.Err = errors.Join(errs...)
	case OpUnload:
		_, res.Err = c.UnloadModel(ctx, a.Model)
	case OpUnloadAll:
		_, res.Err = c.UnloadAll(ctx)
	case OpEnsureFree:
		_, res.Err = c.EnsureFree(ctx, vramguard.EnsureRequest{AllModels: true})
	case OpCleanup:
		_, res.Err = c.Cleanup(ctx, vramguard.CleanupOptions{Models: []string{a.Model}})
	case OpCleanupAsync:
		_, res.Err = c.CleanupAsync(ctx, vramguard.CleanupOptions{AllModels: true}).Wait()
	case OpClose:
		p.mu.Lock()
		if p.client == c {
			p.client = nil
		}
		p.mu.Unlock()
		if a.Shutdown {
			res.Err = c.Shutdown(ctx)
		} else {
			res.Err = c.Close()
		}
	case OpForeign:
		fctx, cancel := context.WithTimeout(ctx, p.foreignLimit())
		defer cancel()
		res.Err = p.raw.Generate(fctx, &api.GenerateRequest{Model: a.Model, Prompt: "a castle at dawn",
			KeepAlive: rawKeepAlive(a.KeepAlive), Options: map[string]any{"num_predict": a.Tokens, "seed": 1}},
			func(api.GenerateResponse) error { return nil })
	case OpForeignStop:
		stream := false
		fctx, cancel := context.WithTimeout(ctx, margin)
		defer cancel()
		res.Err = p.raw.Generate(fctx, &api.GenerateRequest{Model: a.Model, KeepAlive: &api.Duration{Duration: 0}, Stream: &stream},
			func(api.GenerateResponse) error { return nil })
	case OpCLI:
		fctx, cancel := context.WithTimeout(ctx, p.foreignLimit())
		defer cancel()
		res.Err = p.tgt.CLI(fctx, p.cli.Host(), a.Model)
	case OpChild:
		res.Note, res.Err = p.runChild(ctx, a)
	case OpKillRunner:
		killed, err := p.tgt.KillRunner(Group(a.Model))
		res.Err = err
		res.Note = fmt.Sprintf("killed %v", killed)
	case OpRestart:
		res.Err = p.tgt.Restart(ctx)
	case OpFault:
		p.mu.Lock()
		p.fault = a.Fault
		p.mu.Unlock()
		res.Err = p.tgt.SetFault(a.Fault)
	default:
		res.Err = fmt.Errorf("oracle: unknown op %q", a.Op)
	}
	res.End = time.Now()
	res.Canceled = a.CancelAt > 0 && res.End.Sub(res.Start) > a.CancelAt
	return res
}

// bound is the longest a may take: its timeouts plus margin.
func (a Action) bound() time.Duration {
	gen := totalTimeout + cleanupTimeout + margin
	switch a.Op {
	case OpGenerate, OpGuard, OpGuardAsync, OpGuardChat:
		return gen
	case OpPhase:
		return time.Duration(a.Steps)*gen + 2*cleanupTimeout + margin
	case OpUnload, OpUnloadAll, OpEnsureFree:
		return unloadTimeout + margin
	case OpCleanup, OpCleanupAsync:
		return cleanupTimeout + margin
	case OpClose:
		return 3*cleanupTimeout + margin
	case OpForeign, OpCLI:
		return totalTimeout + margin
	case OpForeignStop:
		return margin + margin // its own deadline is margin (run), then the margin
	case OpChild:
		return gen + margin
	case OpRestart:
		return 20*time.Second + margin // Stop's SIGTERM grace, then the start
	}
	return margin
}

// errOracleCancel is the cause of the oracle's cancels.
var errOracleCancel = errors.New("canceled by the oracle")

// foreignLimit bounds a foreign request: a hanging load is given up like a
// user would.
func (p *player) foreignLimit() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == FaultHangLoad {
		return hangFirstChunk
	}
	return totalTimeout
}

func (p *player) clearFault() error {
	p.mu.Lock()
	f := p.fault
	p.fault = ""
	p.mu.Unlock()
	if f == "" {
		return nil
	}
	return p.tgt.ClearFault()
}

func (p *player) runChild(ctx context.Context, a Action) (string, error) {
	if p.cfg.Child == nil {
		return "skipped: no child command", nil
	}
	cmd := p.cfg.Child(ctx, p.tgt.URL().Host, a.Model, a.Tokens)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	cl, ok := readChildLine(out)
	if !ok || err != nil {
		// A child that died, or exited non-zero after its result (the
		// race detector exits 66), crashed.
		return "crashed", &childError{kind: childCrashed, msg: fmt.Sprintf("%v; stdout %q; stderr %q", err, tailOf(out, 300), tailOf([]byte(stderr.String()), 2000))}
	}
	for _, s := range cl.Sends {
		s.Party, s.Action = PartyChild, -1
		p.trace.send(&s)
	}
	for _, v := range cl.Verdicts {
		v.Party = PartyChild
		p.trace.verdict(v)
	}
	if cl.Err != "" {
		return "kind " + cl.Kind, &childError{msg: cl.Err, kind: cl.Kind}
	}
	return "ok", nil
}

// childCrashed is the kind of a child that printed no result or exited
// non-zero.
const childCrashed = "crashed"

// childError is a child process's failure, with the kind it had there.
type childError struct{ msg, kind string }

func (e *childError) Error() string { return "child: " + e.msg }

// closeAll closes every client of the schedule: the end of the client's
// life, whose unloads are checked like the others.
func (p *player) closeAll(ctx context.Context, id int) Result {
	res := Result{ID: id, Action: Action{Op: OpClose}, Start: time.Now(), Bound: 3*cleanupTimeout + margin}
	p.mu.Lock()
	cs := p.clients
	p.client = nil
	p.mu.Unlock()
	var errs []error
	for _, c := range cs {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	res.Err = errors.Join(errs...)
	res.End = time.Now()
	res.Note = "final close"
	return res
}

// foreignCleanup is the other programs cleaning up after themselves: an
// unload of each model, sent again while it is listed (nothing loads any
// more, so this ends), up to 20 s.
func (p *player) foreignCleanup(ctx context.Context, id int) Result {
	res := Result{ID: id, Action: Action{Op: OpForeignStop}, Start: time.Now(), Bound: 20*time.Second + margin, Note: "final foreign cleanup"}
	ctx = withAction(context.WithoutCancel(ctx), id)
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := p.tgt.Observe(ctx)
		if o.Err == "" && len(o.Listed) == 0 && len(o.Runners) == 0 {
			break
		}
		if time.Now().After(deadline) {
			res.Err = fmt.Errorf("foreign cleanup: listed %v, runners %v after 20 s %s", o.Listed, o.Runners, o.Err)
			break
		}
		stream := false
		uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		for _, m := range []string{ModelA, ModelAShort, ModelB} {
			if o.Listed[Group(m)] {
				_ = p.raw.Generate(uctx, &api.GenerateRequest{Model: m, KeepAlive: &api.Duration{Duration: 0}, Stream: &stream},
					func(api.GenerateResponse) error { return nil })
			}
		}
		cancel()
		time.Sleep(50 * time.Millisecond)
	}
	res.End = time.Now()
	return res
}
