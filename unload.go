package vramguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
	"golang.org/x/sync/errgroup"

	"github.com/vramguard/vramguard/internal/wire"
)

// UnloadReport says what UnloadModel did and saw.
type UnloadReport struct {
	Model     string
	WasLoaded bool  // the server listed the model at some point during the call
	Size      int64 // bytes, as last listed by the server
	SizeVRAM  int64 // Ollama's estimate of its VRAM share
	Attempts  int   // unload requests sent
	Polls     int   // /api/ps listings read (concurrent unloads of a client share them)
	// Elapsed is the time from the first request to verified absence.
	Elapsed time.Duration
	// Verified is true when the model was seen absent (and, with
	// VerifyVRAM, the device memory came back).
	Verified bool
	// HeldByOthers is true when the wait ended early because a request of
	// another client still runs on the model (a guard's cleanup does not
	// wait for it): the server unloads the model when that request ends.
	HeldByOthers bool
	// VRAMFreed is, with VerifyVRAM, this model's share of the rise in
	// free device memory (all devices together) that its unload saw,
	// counted from a reading taken before the unload was sent: one
	// reading for the unloads a call sends together (EnsureFree,
	// Phase.End and its hand-over, Budget.MakeRoom, UnloadAll, Cleanup),
	// so that several reports never count one byte twice. The share is
	// what the model's runner held on the device in that reading, where
	// the reader lists processes and names the runner (GPUProcess.Model,
	// or on a server on this machine its weights Blob); otherwise
	// Ollama's size_vram for the model, except that the last unload of
	// the call to see its memory back takes all of the rise the others
	// left. Either way it is bounded by the part of the rise the call's
	// other unloads have not counted, so the shares of one call add up to
	// no more than the rise (with the reader that names no runner, to the
	// rise itself when every unload of the call was verified). The call's
	// total is its own: EnsureReport's FreeBefore and FreeAfter. Zero
	// without VerifyVRAM, for a model that was not loaded, and when the
	// wait for the memory failed.
	VRAMFreed int64
	// Checked names the checks Verified rests on (none when not
	// Verified). CheckPS always; a
	// server on this machine adds CheckRunnerProcesses, and VerifyVRAM
	// with a model that was loaded adds CheckDeviceMemory. For a remote
	// server (or one whose processes cannot be seen) Verified means only
	// that /api/ps stopped listing the model: a load another program
	// started there just before the unload is not seen, and the model may
	// appear afterwards. Behind a vramgate that verified the unload with
	// its runner check, CheckRunnerProcesses is the gate's, and
	// RunnerCheckBy says so.
	Checked Checks
	// RunnerCheckBy names who made CheckRunnerProcesses when this client
	// did not: "vramgate at <address>" when the server at the client's
	// address is a vramgate (cmd/vramgate) whose answer to the unload
	// request said it verified the unload with the runner check of the
	// server behind it (the client cannot see those runners: nothing that
	// listens at its address is `ollama serve`); the last answer counts,
	// and this client then checked /api/ps itself. "" when the check was
	// this client's own, or none was made (NoRunnerCheck says why). A
	// gate's answer is read on the client's own HTTP client only: on a
	// caller's api.Client (Options.API) the reply keeps nothing of it.
	RunnerCheckBy string
	// NoRunnerCheck says why CheckRunnerProcesses is missing from Checked
	// ("remote server" and its address, or without one for a client on a
	// caller's api.Client; for a pool, a member's address;
	// no `ollama serve` this machine shows listens at
	// the client's port, as for the test double, a server in a container
	// or another PID namespace, or one whose open files cannot be read;
	// the failure to read procfs or to resolve the model's weights blob;
	// behind a vramgate, "vramgate at <address>" and what its answer said
	// instead of a runner check: "made no runner check: <the gate's
	// reason>", or that it did not verify the unload);
	// "" when the check was made. The check counts only runners of the
	// server that listens at the client's address (each member's, on a
	// pool): another `ollama serve` on this machine never passes for it.
	NoRunnerCheck string
	// Cause is the call that unloaded the model.
	Cause UnloadCause
	// Leased lists the leases that kept the model: it was left, nothing
	// was sent, and Verified is false (for ForceUnloadModel: the leases
	// it overrode). A guard's, a phase's or Close's cleanup that leaves a
	// leased model is no failure.
	Leased []LeaseInfo
	// Protected: UnloadAll left the model, which Options.Protected names.
	Protected bool
	// RunnerSeen is true when a runner process for the model's weights was
	// seen while /api/ps did not list the model: a load (another
	// program's, or one of this client) was in progress, and the wait went
	// on until it ended and the model was unloaded. Behind a vramgate
	// (RunnerCheckBy), the gate's answer says whether it saw one.
	RunnerSeen bool
	// CanceledLoads counts this client's generations on the model that
	// the unload cut because they had no chunk yet (they fail with
	// ErrUnloadedWhileLoading). Only the caller's own unloads cut them:
	// UnloadModel, UnloadAll, Cleanup, CleanupAsync and EnsureFree; a
	// guard's cleanup, Phase.End and Close wait for them instead.
	CanceledLoads int
}

// Checks is a set of the checks an unload was verified with.
type Checks uint8

// The checks.
const (
	// CheckPS: the server's /api/ps stopped listing the model.
	CheckPS Checks = 1 << iota
	// CheckRunnerProcesses: no runner process of a live Ollama server on
	// this machine serves the model's weights blob, across a settle window
	// after the last unload request and after the last runner seen went
	// (a runner appears some 20 ms after the request that loads it, or
	// after the runner a queued load waited for). Made by a vramgate at
	// the client's address when UnloadReport.RunnerCheckBy names one.
	CheckRunnerProcesses
	// CheckDeviceMemory: the GPU reported the model's memory back
	// (Options.VerifyVRAM).
	CheckDeviceMemory
	// CheckSettled: without the process check, /api/ps did not list the
	// model across Options.SettleWindow.
	CheckSettled
)

// String names the checks, joined with "+": "ps+runner-processes"; "none"
// for the empty set.
func (c Checks) String() string {
	var names []string
	for _, k := range []struct {
		c    Checks
		name string
	}{{CheckPS, "ps"}, {CheckRunnerProcesses, "runner-processes"}, {CheckDeviceMemory, "device-memory"}, {CheckSettled, "settled"}} {
		if c&k.c != 0 {
			names = append(names, k.name)
			c &^= k.c
		}
	}
	if c != 0 {
		names = append(names, fmt.Sprintf("Checks(%#x)", uint8(c)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

// UnloadModel unloads model and returns only once it is gone, or with an
// error. Gone means: the server no longer lists it (GET /api/ps) and, for a
// server on this machine (a loopback, "localhost" or unspecified host
// address, with procfs readable), no runner process of a live Ollama server
// serves the model's weights blob, across a settle window of at least
// 50 ms after the last unload request and after the last runner of the
// model it saw went (a load queued behind that runner in the server starts
// its own only then). UnloadReport.Checked names the
// checks made. On a local server whose /api/show fails (a restart, a
// reset), the process check is tried again at every poll for a second
// (or ten poll intervals): the unload is not verified without it until
// then, and after that by /api/ps alone (NoRunnerCheck says why).
//
// Ollama's "unload" reply comes before the runner stops, and an unload that
// arrives during a load is lost (Ollama 0.17 to 0.34): while the model is
// listed with an expiry in the future the unload is sent again. A model
// listed with an expiry in the past waits for in-flight requests, and so
// does UnloadModel, for this client's streaming generations too. With
// Options.VerifyVRAM it then waits for the GPU to report the memory free.
//
// Ollama lists nothing in /api/ps while a model loads. A load this client
// started (a generation with no chunk yet) is canceled, which aborts it on
// the server; the generation fails with KindCanceled wrapping
// ErrUnloadedWhileLoading (UnloadReport.CanceledLoads counts them). On a
// local server a load another program started shows as its runner
// process, and UnloadModel waits for the load to end and unloads the model
// then. On a remote server it cannot be seen: Verified then rests on
// /api/ps alone, and a model whose load another program started just
// before the unload may appear afterwards, unless Options.SettleWindow
// makes the unload watch /api/ps for longer than a load takes.
//
// A vramgate (cmd/vramgate) at the client's address answers the unload
// request only once it verified the unload itself: when its answer says it
// did, with the runner check of the server behind it, that check stands
// for the client's own, which cannot see the runners behind a proxy, and
// UnloadReport.RunnerCheckBy names the gate; when it says it did not (or
// made no runner check), the unload rests on /api/ps and NoRunnerCheck
// gives the gate's reason. Either way /api/ps is read through the gate
// before the unload is verified.
//
// A model a lease keeps (HoldModel, a phase of any vramguard client on the
// host) is refused with KindRefused wrapping a *LeasedError (ErrLeased),
// and nothing is sent; ForceUnloadModel overrides leases.
//
// The wait is bounded by ctx and Options.UnloadTimeout: on expiry the error
// is KindTimeout (wrapping ErrStillResident); when ctx is done,
// KindCanceled. A model the server does not know is KindNotFound. On a
// closed client it fails with ErrClosed and sends nothing.
func (c *OllamaClient) UnloadModel(ctx context.Context, model string) (*UnloadReport, error) {
	if err := validModelName("unload", model); err != nil {
		return nil, err
	}
	if err := c.checkOpen("unload", model); err != nil {
		return nil, err
	}
	return c.unloadModel(ctx, model, unloadMode{cause: CauseUnloadModel, refuseLeased: true})
}

// unloadMode says how an unload treats requests it did not send. The zero
// value is that of the caller's own unloads.
type unloadMode struct {
	// heldOK: a model another client's request holds (listed, expiry
	// past, no generation of ours on it) ends the wait early with
	// ErrHeldByOthers (a guard's after-use cleanup).
	heldOK bool
	// keepLoads: this client's generations still loading the model are
	// waited for, not canceled (the library's own cleanups: a guard's,
	// Phase.End, the CLI fallback's and Close's, which do not own them).
	keepLoads bool
	// cause is why the unload is sent, for the hooks and the report.
	cause UnloadCause
	// refuseLeased: a leased model fails the call with ErrLeased
	// (UnloadModel); otherwise it is left, and the report says so.
	refuseLeased bool
	// force: leases are ignored (ForceUnloadModel).
	force bool
	// keepInUse: room-making keeps the models this client's generations
	// run on (EnsureRequest.KeepInUse), as a budget's does.
	keepInUse bool
	// keepOwn: room-making keeps this client's own leased models
	// (EnsureRequest.KeepOwn), as its leases keep them from others.
	keepOwn bool
	// phase is the phase whose End (or guard) sends the unload: the
	// client's other live phases keep the models they use from it.
	phase *Phase
	// freed is the group of unloads sent together with this one
	// (unloadMany, with VerifyVRAM), among which the rise in free device
	// memory is shared; nil for an unload sent alone.
	freed *freedShares
}

// UnloadCause says which call of this client unloaded a model: it is
// UnloadReport.Cause and UnloadStart.Cause, so that
// a program can tell an eviction to make room from its own unloads.
type UnloadCause string

// The causes of an unload.
const (
	CauseUnloadModel UnloadCause = "unload"      // UnloadModel
	CauseUnloadAll   UnloadCause = "unload all"  // UnloadAll
	CauseCleanup     UnloadCause = "cleanup"     // Cleanup, CleanupAsync, the CLI fallback's own cleanup
	CauseGuard       UnloadCause = "guard"       // a Guard's cleanup after its last use
	CausePhaseEnd    UnloadCause = "phase end"   // Phase.End
	CauseEnsureFree  UnloadCause = "ensure free" // EnsureFree, and Phase.End's hand-over (NeedBytes)
	CauseBudget      UnloadCause = "budget"      // Budget.MakeRoom, to admit a load of another model
	CauseOffload     UnloadCause = "offload"     // FailOnOffload, or a split model with KeepAliveUnload
	CauseClose       UnloadCause = "close"       // Close and Shutdown
)

// heldGrace is how long a model must stay listed with its expiry in the
// past, with no generation of this client on it, before an unload that
// need not wait for other clients gives up waiting: Ollama removes a model
// nobody uses within milliseconds of the unload.
func (c *OllamaClient) heldGrace() time.Duration {
	return max(4*c.opts.PollInterval, 200*time.Millisecond)
}

// unloadModel unloads model, verified. With mode.heldOK, a model that
// another client's request keeps (listed, expired, no generation of ours
// on it) ends the wait early with ErrHeldByOthers (KindUnverified): the
// unload was sent and the server unloads the model when that request ends.
//
// It is the driver of the state machine in unload_state.go: it performs
// the actions the state asks for and feeds back what it saw.
func (c *OllamaClient) unloadModel(ctx context.Context, model string, mode unloadMode) (*UnloadReport, error) {
	h := &c.opts.Hooks
	if h.OnUnloadStart == nil && h.OnUnloadEnd == nil {
		return c.unloadVerified(ctx, model, mode)
	}
	us := UnloadStart{Model: model, Server: c.host, Cause: mode.cause, Start: time.Now()}
	hctx := hookStart(c, h.OnUnloadStart, ctx, us)
	rep, err := c.unloadVerified(hctx, model, mode)
	end := UnloadEnd{UnloadStart: us, Report: rep, Err: err}
	if rep == nil {
		end.Report = &UnloadReport{Model: model, Cause: mode.cause}
	}
	hookCtx(c, h.OnUnloadEnd, hctx, end)
	return rep, err
}

func (c *OllamaClient) unloadVerified(ctx context.Context, model string, mode unloadMode) (*UnloadReport, error) {
	if rep, err, kept := c.leftLeased(model, mode); kept {
		mode.freed.leave()
		return rep, err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeoutCause(ctx, c.opts.UnloadTimeout,
		fmt.Errorf("%w after %v", ErrStillResident, c.opts.UnloadTimeout))
	defer cancel()
	u := &unload{c: c, ctx: ctx, wctx: wctx, model: model, mode: mode, start: start,
		rep: &UnloadReport{Model: model, Cause: mode.cause}, rules: c.unloadRules(wctx, mode)}
	if c.opts.VerifyVRAM {
		if u.mode.freed == nil {
			u.mode.freed = &freedShares{members: 1}
		}
		defer func() {
			if !u.claimed {
				u.mode.freed.leave()
			}
		}()
		u.before = u.mode.freed.before
		if u.before == nil {
			u.before, _ = c.opts.VRAM.Snapshot(wctx) // best effort; checked when the model is gone
		}
	}
	todo := []unloadAction{{kind: actLook}}
	for len(todo) > 0 {
		a := todo[0]
		todo = todo[1:]
		var ev unloadEvent
		switch a.kind {
		case actLook:
			ev = u.look()
		case actSend:
			ev = u.send()
		case actSetup:
			ev = u.setup()
		case actPoll:
			ev = u.poll(a.wait)
		case actCount:
			ev = u.count()
		case actAwaitMemory:
			ev = u.awaitMemory()
		case actNoCheck:
			u.rep.NoRunnerCheck = a.why
			c.log.Debug("unload verified by /api/ps only", "model", model, "why", a.why, "settle", c.opts.SettleWindow)
			continue
		case actVerdict:
			continue
		}
		var more []unloadAction
		u.s, more = u.s.next(&u.rules, ev)
		if u.s.phase.done() {
			todo = todo[:0] // nothing scheduled before the end is done
		}
		todo = append(todo, more...)
	}
	return u.verdict()
}

// unloadRules gives one unload's fixed terms.
func (c *OllamaClient) unloadRules(wctx context.Context, mode unloadMode) unloadRules {
	deadline, _ := wctx.Deadline()
	return unloadRules{
		deadline:    deadline,
		poll:        c.opts.PollInterval,
		settle:      unloadSettle,
		window:      c.opts.SettleWindow,
		resendEvery: max(10*c.opts.PollInterval, 500*time.Millisecond),
		heldGrace:   c.heldGrace(),
		retryCheck:  max(time.Second, 10*c.opts.PollInterval),
		heldOK:      mode.heldOK,
		vram:        c.opts.VerifyVRAM,
	}
}

// unload is one unloadModel call as its driver sees it: the report, the
// contexts, and what the actions need between them.
type unload struct {
	c         *OllamaClient
	ctx, wctx context.Context
	model     string
	mode      unloadMode
	start     time.Time
	rep       *UnloadReport
	rules     unloadRules
	s         unloadState
	before    *VRAMSnapshot // VerifyVRAM: the device before the unload
	runners   *runnerWatch  // the process check, once set up
	begun     uint64        // this client's generations on the model, begun before the last count
	claimed   bool          // VerifyVRAM: the share of the freed memory was claimed (mode.freed)
	err       error         // the failure behind phFailed
	gate      gateAnswer    // what a vramgate at the client's address said of the last request it answered
}

// seen takes a listing into the report: what was there, as last listed.
func (u *unload) seen(ms *api.ProcessResponse) *api.ProcessModelResponse {
	entry := findRunning(ms.Models, u.model)
	if entry != nil {
		u.rep.WasLoaded = true
		u.rep.Size, u.rep.SizeVRAM = entry.Size, entry.SizeVRAM
	}
	return entry
}

// cut cancels this client's generations still loading the model, unless
// the mode waits for them: the server aborts a load whose request is gone,
// and drops an unload sent during one.
func (u *unload) cut() {
	if !u.mode.keepLoads {
		u.rep.CanceledLoads += u.c.book.cancelLoads(u.model)
	}
}

// look reads a listing of the last poll interval (the poller shares them
// among concurrent unloads), so the report says what was there even when
// the server removes the model before the first poll after the request;
// then our own loads are cut, before the unload goes out.
func (u *unload) look() unloadEvent {
	listed := false
	if l, err := u.c.ps.get(u.wctx, u.start.Add(-u.c.opts.PollInterval)); err == nil && l.err == nil {
		u.rep.Polls++
		listed = u.seen(l.resp) != nil
	}
	u.cut()
	return unloadEvent{kind: evLooked, at: time.Now(), listed: listed}
}

// send sends one unload request.
func (u *unload) send() unloadEvent {
	g, err := u.c.sendUnload(u.wctx, u.model, u.mode.cause)
	if err == nil {
		u.rep.Attempts++
		if g.said != gateNone {
			u.gate = g
		}
		return unloadEvent{kind: evSent, at: time.Now(), gate: g.said, why: g.why}
	}
	if u.wctx.Err() != nil {
		return u.stopped(err)
	}
	u.err = err
	u.c.log.Debug("unload request failed", "model", u.model, "attempts", u.rep.Attempts, "err", err)
	return unloadEvent{kind: evSendFailed, at: time.Now(), fail: classify(err)}
}

// setup prepares the process check: resolved after the unload went out,
// so a model the server does not know fails first.
func (u *unload) setup() unloadEvent {
	w, why, again := u.c.watchRunners(u.wctx, u.model)
	if u.wctx.Err() != nil {
		return u.stopped(context.Cause(u.wctx))
	}
	if w != nil {
		u.runners = w
		return unloadEvent{kind: evCheckReady, at: time.Now()}
	}
	return unloadEvent{kind: evCheckFailed, at: time.Now(), why: why, again: again}
}

// poll waits, then reads a listing. Our generations are counted before the
// listing's request goes out (it may be another unload's, sent later): one
// that ends after the count and makes the model resident is in both.
func (u *unload) poll(wait time.Duration) unloadEvent {
	if err := sleepCtx(u.wctx, wait); err != nil {
		return u.stopped(err)
	}
	u.cut() // a generation of ours that began since
	// Room-making beside this client's calls (KeepInUse: a pool's
	// placement) waits only for calls whose request went out: one that
	// waits for the placement turn its room-making holds cannot have
	// loaded the model, and would wait for this unload.
	ours, begun := u.c.book.inFlight(u.model, u.mode.keepInUse)
	u.begun = begun
	l, err := u.c.ps.get(u.wctx, time.Now())
	if err == nil {
		err = l.err
	}
	u.rep.Polls++
	if err != nil {
		if u.wctx.Err() != nil {
			return u.stopped(err)
		}
		u.c.log.Debug("poll failed", "model", u.model, "err", err)
		return unloadEvent{kind: evPollFailed, at: time.Now()}
	}
	ev := unloadEvent{kind: evNotListed, at: time.Now(), sent: l.sent, ours: ours}
	if entry := u.seen(l.resp); entry != nil {
		ev.kind = evListedExpired
		if entry.ExpiresAt.After(ev.at) {
			ev.kind = evListed
		}
	}
	return ev
}

// count counts the live runners of the model's weights.
// The count sees the process table as it was when it began (the PIDs are
// listed first), however long the scan takes on a loaded machine.
func (u *unload) count() unloadEvent {
	began := time.Now()
	n, err := u.runners.live()
	if err != nil {
		return unloadEvent{kind: evRunnersUnreadable, at: time.Now(), why: fmt.Sprintf("runner processes: %v", err)}
	}
	return unloadEvent{kind: evRunners, at: time.Now(), sent: began, runners: n}
}

// awaitMemory waits for the device to report the model's memory back,
// and claims the model's share of what came back (UnloadReport.VRAMFreed).
func (u *unload) awaitMemory() unloadEvent {
	blob := ""
	if u.runners != nil {
		blob = u.runners.blob
	}
	back, err := u.c.awaitRunnerGone(u.wctx, u.before, u.model, blob, u.rep.SizeVRAM)
	if err != nil {
		return u.stopped(err)
	}
	u.claimed = true
	u.rep.VRAMFreed = u.mode.freed.claim(back, u.rep.SizeVRAM)
	return unloadEvent{kind: evMemoryBack, at: time.Now()}
}

// stopped is the event of a failure that ends the unload: the caller's
// context, the unload timeout (saying so when the process check never
// started), or the failure's own kind.
func (u *unload) stopped(err error) unloadEvent {
	kind := classify(err)
	switch {
	case u.ctx.Err() != nil:
		kind, err = KindCanceled, context.Cause(u.ctx)
	case u.wctx.Err() != nil && u.s.check == checkPending:
		kind, err = KindTimeout, fmt.Errorf("%w (the process check could not start: %s)", context.Cause(u.wctx), u.s.why)
	case u.wctx.Err() != nil:
		kind, err = KindTimeout, context.Cause(u.wctx)
	}
	u.err = err
	return unloadEvent{kind: evStopped, at: time.Now(), fail: kind}
}

// verdict turns the end phase into the report and error.
func (u *unload) verdict() (*UnloadReport, error) {
	const op = "unload"
	c, rep, s := u.c, u.rep, u.s
	rep.Elapsed = time.Since(u.start)
	rep.RunnerSeen = s.runnerSeen
	switch s.phase {
	case phVerified:
	case phHeldByOthers:
		rep.HeldByOthers = true
		return rep, newError(op, u.model, s.kind, ErrHeldByOthers)
	case phFailed:
		if s.kind == KindInternal || u.err == nil {
			return rep, newError(op, u.model, KindInternal, errors.New(s.why))
		}
		return rep, newError(op, u.model, s.kind, u.err)
	default:
		return rep, newError(op, u.model, KindInternal, fmt.Errorf("unload: the driver stopped in phase %q", s.phase))
	}
	rep.Checked = s.checks
	rep.Verified = true
	if s.check == checkGate {
		// The runner check is the gate's: its answer said so.
		rep.RunnerCheckBy, rep.NoRunnerCheck = u.gate.by, ""
		rep.RunnerSeen = rep.RunnerSeen || u.gate.runnerSeen
	}
	c.book.forget(u.model, u.begun)
	if rep.WasLoaded {
		c.churn.unloaded(u.model, rep.Cause, time.Now())
	}
	c.log.Debug("eviction verified", "model", u.model, "was_loaded", rep.WasLoaded,
		"attempts", rep.Attempts, "elapsed", rep.Elapsed)
	return rep, nil
}

// sendUnload sends the unload request: an empty prompt with keep_alive 0,
// and returns what a vramgate at the client's address said of it (the
// zero value for Ollama itself, and on a caller's api.Client, whose
// replies keep no field of the gate's). Failures have the shapes of the
// api client's (api.StatusError for a status of 400 and up), so classify
// treats both paths alike.
func (c *OllamaClient) sendUnload(ctx context.Context, model string, cause UnloadCause) (gateAnswer, error) {
	stream := false
	req := &api.GenerateRequest{Model: model, KeepAlive: &api.Duration{Duration: 0}, Stream: &stream}
	if c.hc == nil {
		return gateAnswer{}, c.api.Generate(ctx, req, func(api.GenerateResponse) error { return nil })
	}
	resp, err := c.postJSON(ctx, "/api/generate", req, "application/json")
	if err != nil {
		return gateAnswer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return gateAnswer{}, err
	}
	addr := c.base.Host
	if resp.Request != nil && resp.Request.URL != nil && resp.Request.URL.Host != "" {
		addr = resp.Request.URL.Host // the server a routing transport chose
	}
	return readGateAnswer(wire.ReadGateUnload(resp.Header, resp.Trailer, body), model, addr), nil
}

// memoryBack is what awaitRunnerGone saw: the rise in free memory since
// the reading before the unload, and what the model's own runners held in
// that reading (measured: the reader named one and gave its memory).
type memoryBack struct {
	rise, held int64
	measured   bool
}

// awaitRunnerGone waits, after Ollama stopped listing model, for the
// device to show its memory back. Where the reading before names the
// model's runners (GPUProcess.Model, or blob, the weights on a server on
// this machine, for a runner the reader did not name), it waits until one
// of them is gone from the device: the unloads of other models sent
// beside it free memory too, which must not end this wait. Otherwise it
// waits until the device memory rose by at least 75% of the model's VRAM
// estimate (the margin Ollama's own scheduler uses) or an Ollama runner
// process that held memory before is gone.
func (c *OllamaClient) awaitRunnerGone(ctx context.Context, before *VRAMSnapshot, model, blob string, sizeVRAM int64) (memoryBack, error) {
	var back memoryBack
	late := before == nil
	if late {
		var err error
		if before, err = c.opts.VRAM.Snapshot(ctx); err != nil {
			return back, err
		}
	}
	key := NormalizeModelName(model)
	runners, own := map[uint32]bool{}, map[uint32]bool{}
	var freeBefore uint64
	for _, d := range before.Devices {
		freeBefore += d.Free
		for _, p := range d.Processes {
			if p.Role != RoleOllamaRunner {
				continue
			}
			runners[p.PID] = true
			if d.ProcessesKnown && isRunnerOf(p, key, blob) {
				own[p.PID] = true
				if p.UsedKnown { // a runner split across devices is listed on each, with its share there
					back.held += int64(p.UsedBytes)
					back.measured = true
				}
			}
		}
	}
	if late && len(runners) == 0 {
		// Taken after the model went, with no runner process in sight:
		// there is nothing left to wait for that the GPU could show.
		return back, nil
	}
	if len(own) > 0 {
		runners = own
	}
	want := sizeVRAM * 3 / 4
	for {
		now, err := c.opts.VRAM.Snapshot(ctx)
		if err == nil {
			var freeNow uint64
			still := map[uint32]bool{}
			for _, d := range now.Devices {
				freeNow += d.Free
				for _, p := range d.Processes {
					if runners[p.PID] {
						still[p.PID] = true
					}
				}
			}
			back.rise = int64(freeNow) - int64(freeBefore)
			switch {
			case len(own) > 0:
				if len(still) < len(own) {
					return back, nil
				}
			case (want > 0 && back.rise >= want) || len(still) < len(runners) || (want == 0 && len(runners) == 0):
				return back, nil
			}
		}
		if err := sleepCtx(ctx, c.opts.VRAMPollInterval); err != nil {
			return back, err
		}
	}
}

// isRunnerOf reports whether p is a runner of the model whose normalized
// name is key: by the name the reader gives it, or, for a runner it does
// not name, by its weights blob ("" matches none).
func isRunnerOf(p GPUProcess, key, blob string) bool {
	if p.Model != "" {
		return NormalizeModelName(p.Model) == key
	}
	return blob != "" && p.Blob == blob
}

// freedShares shares the rise in free device memory among the unloads
// that saw it: those one unloadMany call sends together (each waits for
// its own model's memory, and each sees the others' come back too), or a
// lone unload, a group of one. They count from one reading taken before
// any of them was sent. Each member claims its share once, as its wait for
// the memory ends, before its Hooks.OnUnloadEnd, so that the hooks and the
// reports agree; a member that ends without claiming leaves. It is safe
// for concurrent use; a nil *freedShares claims nothing.
type freedShares struct {
	before  *VRAMSnapshot // the devices before the group's unloads; nil when the reading failed
	members int           // the unloads of the group

	mu      sync.Mutex
	ended   int   // members that claimed or left
	claimed int64 // the bytes claimed so far
}

// claim is one member's share of the rise back.rise, in bytes: what its
// runners held (back.held) when measured, else sizeVRAM (Ollama's
// estimate), or all that is left when it is the last member to end;
// never more than the part of the rise the others have not claimed.
func (f *freedShares) claim(back memoryBack, sizeVRAM int64) int64 {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended++
	left := max(back.rise-f.claimed, 0)
	var share int64
	switch {
	case back.measured:
		share = min(back.held, left)
	case f.ended == f.members:
		share = left
	default:
		share = min(max(sizeVRAM, 0), left)
	}
	f.claimed += share
	return share
}

// leave ends a member that claimed nothing (its unload failed, was left
// for a lease, or the model was not loaded).
func (f *freedShares) leave() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended++
}

// UnloadAll unloads, concurrently and verified, every model the server
// lists and every model a generation of this client is loading (which the
// server does not list yet; the generation is canceled, as by
// UnloadModel). It leaves the models Options.Protected names (their
// reports say Protected, nothing is sent) and the leased ones (Leased).
// Reports are sorted by model name; the error joins every failure.
// On a closed client it fails with ErrClosed and sends nothing.
func (c *OllamaClient) UnloadAll(ctx context.Context) ([]UnloadReport, error) {
	if err := c.checkOpen("unload all", ""); err != nil {
		return nil, err
	}
	ms, err := c.running(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ms))
	var left []UnloadReport
	for _, m := range ms {
		if c.isProtected(m.Model) {
			left = append(left, UnloadReport{Model: m.Model, WasLoaded: true, Size: m.Size, SizeVRAM: m.SizeVRAM, Cause: CauseUnloadAll, Protected: true})
			continue
		}
		names = append(names, m.Model)
	}
	// Models this client is loading are not listed yet.
	for _, m := range c.book.loadingModels() {
		if findRunning(ms, m) == nil && !c.isProtected(m) {
			names = append(names, m)
		}
	}
	reps, err := c.unloadMany(ctx, names, unloadMode{cause: CauseUnloadAll})
	reps = append(reps, left...)
	slices.SortFunc(reps, func(a, b UnloadReport) int { return strings.Compare(a.Model, b.Model) })
	return reps, err
}

// unloadMany unloads models concurrently, each once however often it is
// named, and joins every failure (mode as for unloadModel).
func (c *OllamaClient) unloadMany(ctx context.Context, models []string, mode unloadMode) ([]UnloadReport, error) {
	var (
		mu      sync.Mutex
		reports []UnloadReport
		errs    []error
		g       errgroup.Group
	)
	seen := make(map[string]bool, len(models))
	var distinct []string
	for _, m := range models {
		// One unload per model, however often it is named: an unload of
		// "tiny" and one of "TINY:latest" would wait for each other.
		key := NormalizeModelName(m)
		if !seen[key] {
			seen[key] = true
			distinct = append(distinct, m)
		}
	}
	if c.opts.VerifyVRAM && len(distinct) > 1 {
		// The unloads share what comes back: one reading before all of
		// them, so that no byte is counted in two reports.
		fs := &freedShares{members: len(distinct)}
		sctx, cancel := context.WithTimeout(ctx, c.opts.UnloadTimeout)
		fs.before, _ = c.opts.VRAM.Snapshot(sctx) // best effort, as an unload's own
		cancel()
		mode.freed = fs
	}
	for _, m := range distinct {
		g.Go(func() error {
			rep, err := c.unloadModel(ctx, m, mode)
			mu.Lock()
			defer mu.Unlock()
			if rep != nil {
				reports = append(reports, *rep)
			}
			// A model deleted since it was listed is already gone.
			if err != nil && !errors.Is(err, KindNotFound) {
				errs = append(errs, err)
			}
			return nil
		})
	}
	_ = g.Wait() // the goroutines return nil; failures are in errs
	slices.SortFunc(reports, func(a, b UnloadReport) int { return strings.Compare(a.Model, b.Model) })
	return reports, errors.Join(errs...)
}
