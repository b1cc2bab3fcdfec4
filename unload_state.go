package vramguard

import (
	"fmt"
	"time"
)

// The unload as a state machine. One unloadModel call is a state
// (unloadState) and a driver (unload.go): the driver performs the actions
// the state asks for (look, send, set up the process check, wait and poll,
// count runners, wait for the device memory) and feeds what it saw back
// as an event. next is the whole of the decision, with no I/O: every
// timestamp it compares comes in an event, so the table in
// unload_state_test.go can walk every phase × event pair and the fuzz
// target can drive any sequence of facts.
//
// The phases, in the order an unload of a listed model goes through them:
//
//	looking → sending → setup → sent → { lost, held, in use, loading, counting, rechecking, settling } … → freeing → verified
//
// (sending → sent, with no set-up, when a vramgate at the client's address
// answered the request: its verified answer is the process check),
// and the ends: verified, held by others (a guard's cleanup), failed. An
// event no rule of the phase expects is a fault of the driver: the unload
// fails with KindInternal rather than wait for an answer that never comes.

// unloadPhase is where one unload stands.
type unloadPhase uint8

const (
	phLooking      unloadPhase = iota // the first look at /api/ps is due
	phSending                         // the first unload request is due
	phSetup                           // the process check of a local server is being set up
	phSent                            // the unload went out; the first poll is due
	phLost                            // listed with a future expiry: the unload was lost in a load (or a later request set a keep-alive), and sent again
	phHeld                            // listed with its expiry past and no generation of this client on it: another client's request holds it
	phInUse                           // listed with its expiry past while a generation of this client runs on it
	phLoading                         // not listed, but a load may be in progress: a generation of this client, a runner of the weights, or a process check still to be made
	phCounting                        // not listed, none of ours: the runner processes are being counted
	phRechecking                      // a poll came while the process check could not start: its set-up is tried again before the poll is judged
	phSettling                        // absent, and the settle window is not over
	phFreeing                         // gone from the listing and the processes: the device memory is awaited (Options.VerifyVRAM)
	phVerified                        // the end: gone, with the checks in unloadState.checks
	phHeldByOthers                    // the end: another client's request keeps the model (unloadRules.heldOK)
	phFailed                          // the end: unloadState.kind says why
	numPhases
)

var phaseNames = [numPhases]string{
	"looking", "sending", "setup", "sent", "lost", "held", "in use", "loading",
	"counting", "rechecking", "settling", "freeing", "verified", "held by others", "failed",
}

func (p unloadPhase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// done reports whether p is an end: no event changes it.
func (p unloadPhase) done() bool { return p >= phVerified && p < numPhases }

// waiting reports whether p has a poll due (the phases a listing lands in).
func (p unloadPhase) waiting() bool {
	return p >= phSent && p <= phSettling && p != phCounting && p != phRechecking
}

// unloadCheck is what an absence is checked with.
type unloadCheck uint8

const (
	checkUnset   unloadCheck = iota // before the set-up
	checkRunners                    // the runner processes of the model's weights (a local server)
	checkListing                    // /api/ps alone (a remote server, or no weights file to look for)
	checkPending                    // a local server whose /api/show failed: the process check is still to be made
	checkGate                       // a vramgate at the client's address verified the unload with its runner check (its last answer said so)
)

// unloadEventKind names a fact the driver saw.
type unloadEventKind uint8

const (
	evLooked            unloadEventKind = iota // the first look: listed says whether the model was
	evSent                                     // an unload request was accepted
	evSendFailed                               // an unload request failed (fail: its kind); the wait goes on
	evCheckReady                               // the process check is set up
	evCheckFailed                              // the process check could not be set up (why; again: worth retrying)
	evPollFailed                               // a listing failed; the wait goes on
	evListed                                   // listed with an expiry in the future (ours: our generations on it)
	evListedExpired                            // listed with its expiry past
	evNotListed                                // not listed (sent: when the listing's request went out)
	evRunners                                  // the live runners of the model's weights (runners)
	evRunnersUnreadable                        // the process table could not be read (why)
	evMemoryBack                               // the device memory came back
	evStopped                                  // the context ended, or a failure that ends the unload (fail)
	numEvents
)

var eventNames = [numEvents]string{
	"looked", "sent", "send failed", "check ready", "check failed", "poll failed", "listed",
	"listed expired", "not listed", "runners", "runners unreadable", "memory back", "stopped",
}

func (k unloadEventKind) String() string {
	if k < numEvents {
		return eventNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// unloadEvent is one fact, with the time it was seen.
type unloadEvent struct {
	kind    unloadEventKind
	at      time.Time // when the driver saw it
	sent    time.Time // a listing: when its request went out; evRunners: when the scan began
	ours    int       // a listing: this client's generations on the model, counted before it
	runners int       // evRunners
	listed  bool      // evLooked
	again   bool      // evCheckFailed
	why     string    // evCheckFailed, evRunnersUnreadable; evSent: what a vramgate said without a runner check
	fail    Kind      // evSendFailed, evStopped
	gate    gateSaid  // evSent: what a vramgate at the client's address said of the request
}

// unloadActionKind names what the state asks the driver to do.
type unloadActionKind uint8

const (
	actLook        unloadActionKind = iota // read a listing of the last poll interval, cut our loads → evLooked
	actSend                                // send an unload request → evSent, evSendFailed, evStopped
	actSetup                               // set up the process check → evCheckReady, evCheckFailed, evStopped
	actPoll                                // wait, cut our loads, count ours, read a listing → a listing, evPollFailed, evStopped
	actCount                               // count the live runners → evRunners, evRunnersUnreadable
	actAwaitMemory                         // wait for the device memory → evMemoryBack, evStopped
	actNoCheck                             // the verdict rests on /api/ps alone (why): report and log it
	actVerdict                             // the unload ended; the phase says how
)

// unloadAction is one thing to do.
type unloadAction struct {
	kind unloadActionKind
	wait time.Duration // actPoll: how long to wait before the listing
	why  string        // actNoCheck
}

// unloadRules are the fixed terms of one unload.
type unloadRules struct {
	deadline    time.Time     // no wait goes past it
	poll        time.Duration // Options.PollInterval
	settle      time.Duration // unloadSettle: how long after the last request a runner must stay absent
	window      time.Duration // Options.SettleWindow, for a check by /api/ps alone
	resendEvery time.Duration // a listed or loading model gets a request this often
	heldGrace   time.Duration // how long another client's hold lasts before heldOK gives up
	retryCheck  time.Duration // how long a failing process check set-up is retried
	heldOK      bool          // another client's hold ends the unload (phHeldByOthers)
	vram        bool          // Options.VerifyVRAM: a model that was loaded ends in phFreeing first
}

// unloadState is one unload's whole memory: the driver keeps no other.
type unloadState struct {
	phase       unloadPhase
	check       unloadCheck
	loaded      bool        // the model was listed at some point
	lastSent    time.Time   // the last accepted unload request (zero: none yet)
	checkSince  time.Time   // checkPending: when the set-up first failed
	heldSince   time.Time   // phHeld: since when
	goneAt      time.Time   // checkRunners: absent at a poll before the settle window ended
	runnerGone  time.Time   // checkRunners: the first count with no runner after one with a runner
	absentSince time.Time   // checkListing: the first absent listing of the current run
	checks      Checks      // what the verdict rests on
	runnerSeen  bool        // a runner served the weights while nothing listed them
	why         string      // checkPending or phFailed with KindInternal: why
	kind        Kind        // phFailed, phHeldByOthers: the verdict's kind
	poll        unloadEvent // phRechecking, phCounting: the listing being judged
}

// next is the transition function: the state after ev and what to do
// about it. It does no I/O and reads no clock.
func (s unloadState) next(r *unloadRules, ev unloadEvent) (unloadState, []unloadAction) {
	switch {
	case s.phase.done():
		return s, nil
	case ev.kind == evStopped:
		return s.end(phFailed, ev.fail)
	}
	switch {
	case s.phase == phLooking && ev.kind == evLooked:
		s.loaded, s.phase = ev.listed, phSending
		return s, []unloadAction{{kind: actSend}}
	case s.phase == phSending && ev.kind == evSent && ev.gate == gateNone:
		s.lastSent, s.phase = ev.at, phSetup
		return s, []unloadAction{{kind: actSetup}}
	case s.phase == phSending && ev.kind == evSent:
		// A vramgate answered once it had verified the unload (or said
		// why not): nothing to set up, and nothing to wait for before
		// the first poll.
		s.lastSent, s.phase = ev.at, phSent
		s, acts := s.takeGate(ev)
		return s, append(acts, s.pollIn(r, ev.at, 0))
	case s.phase == phSending && ev.kind == evSendFailed:
		// A reset or a busy server: the polls resend as soon as they see
		// the model listed. Anything else is final.
		if ev.fail != KindTransient {
			return s.end(phFailed, ev.fail)
		}
		s.phase = phSetup
		return s, []unloadAction{{kind: actSetup}}
	case s.phase == phSetup && (ev.kind == evCheckReady || ev.kind == evCheckFailed):
		s, acts := s.setCheck(r, ev)
		s.phase = phSent
		wait := time.Duration(0)
		if s.loaded {
			// Ollama stops the runner after it replied: a poll right now
			// would still list the model (and land in the window where
			// /api/ps can crash the server; see the README). The set-up's
			// time counts.
			wait = r.poll - ev.at.Sub(s.lastSent)
		}
		return s, append(acts, s.pollIn(r, ev.at, wait))
	case s.phase.waiting() && ev.kind == evSent && ev.gate == gateNone:
		s.lastSent = ev.at
		return s, nil
	case s.phase.waiting() && ev.kind == evSent:
		s.lastSent = ev.at
		return s.takeGate(ev)
	case s.phase.waiting() && ev.kind == evSendFailed:
		return s, nil // the polls resend
	case s.phase.waiting() && ev.kind == evPollFailed:
		return s, []unloadAction{s.pollIn(r, ev.at, r.poll)} // the unload itself was accepted
	case s.phase.waiting() && isListing(ev.kind):
		if s.check == checkPending {
			s.poll, s.phase = ev, phRechecking
			return s, []unloadAction{{kind: actSetup}}
		}
		return s.judge(r, ev)
	case s.phase == phRechecking && (ev.kind == evCheckReady || ev.kind == evCheckFailed):
		s, acts := s.setCheck(r, ev)
		s, more := s.judge(r, s.poll)
		return s, append(acts, more...)
	case s.phase == phCounting && (ev.kind == evRunners || ev.kind == evRunnersUnreadable):
		return s.counted(r, ev)
	case s.phase == phFreeing && ev.kind == evMemoryBack:
		s.checks |= CheckDeviceMemory
		return s.end(phVerified, KindUnknown)
	}
	s.why = fmt.Sprintf("unload: no rule for %q in phase %q", ev.kind, s.phase)
	return s.end(phFailed, KindInternal)
}

func isListing(k unloadEventKind) bool {
	return k == evListed || k == evListedExpired || k == evNotListed
}

// end moves to an end phase, with the verdict.
func (s unloadState) end(p unloadPhase, kind Kind) (unloadState, []unloadAction) {
	s.phase, s.kind = p, kind
	return s, []unloadAction{{kind: actVerdict}}
}

// gone is an absence that the check in force accepts: the device memory
// is awaited next when the model was loaded and VerifyVRAM is set.
func (s unloadState) gone(r *unloadRules, checks Checks) (unloadState, []unloadAction) {
	s.checks |= CheckPS | checks
	if r.vram && s.loaded {
		s.phase = phFreeing
		return s, []unloadAction{{kind: actAwaitMemory}}
	}
	return s.end(phVerified, KindUnknown)
}

// setCheck takes in the outcome of the process check's set-up. A failure
// worth retrying leaves it pending for r.retryCheck; after that, or a
// failure that is final, the verdict rests on /api/ps alone.
func (s unloadState) setCheck(r *unloadRules, ev unloadEvent) (unloadState, []unloadAction) {
	switch {
	case ev.kind == evCheckReady:
		s.check, s.why = checkRunners, ""
		return s, nil
	case ev.again && s.check != checkPending:
		s.check, s.checkSince, s.why = checkPending, ev.at, ev.why
		return s, nil
	case ev.again && ev.at.Sub(s.checkSince) < r.retryCheck:
		s.why = ev.why
		return s, nil
	}
	s.check, s.why = checkListing, ""
	return s, []unloadAction{{kind: actNoCheck, why: ev.why}}
}

// takeGate takes in a vramgate's answer to an unload request (the last one
// counts): its runner check stands for the client's own, which cannot see
// the runners behind the gate; without one the verdict rests on /api/ps,
// and the gate's reason is the note. A client that counts the server's
// runners itself keeps its own check.
func (s unloadState) takeGate(ev unloadEvent) (unloadState, []unloadAction) {
	switch {
	case s.check == checkRunners:
		return s, nil
	case ev.gate == gateRunners:
		s.check, s.why, s.absentSince = checkGate, "", time.Time{}
		return s, nil
	}
	s.check, s.why = checkListing, ""
	return s, []unloadAction{{kind: actNoCheck, why: ev.why}}
}

// judge decides on a listing (the process check set up or given up on).
func (s unloadState) judge(r *unloadRules, ev unloadEvent) (unloadState, []unloadAction) {
	absent := ev.kind == evNotListed && ev.ours == 0
	loading := false
	switch {
	case s.check == checkPending:
		loading = ev.kind == evNotListed // as for a runner no listing names
	case absent && s.check == checkGate:
		return s.gone(r, CheckRunnerProcesses)
	case absent && s.check == checkRunners:
		s.poll, s.phase = ev, phCounting
		return s, []unloadAction{{kind: actCount}}
	case absent:
		// Absent across the window, resent whenever it appeared: a load
		// that began before the last unload would have shown by now. Both
		// ends are listings' send times.
		if r.window <= 0 {
			return s.gone(r, 0)
		}
		if s.absentSince.IsZero() {
			s.absentSince = ev.sent
		}
		if ev.sent.Sub(s.absentSince) >= r.window {
			return s.gone(r, CheckSettled)
		}
	default:
		s.goneAt, s.absentSince = time.Time{}, time.Time{}
	}
	return s.tail(r, ev, loading)
}

// counted decides on an absent listing once the runners are counted.
func (s unloadState) counted(r *unloadRules, ev unloadEvent) (unloadState, []unloadAction) {
	var acts []unloadAction
	loading := false
	switch {
	case ev.kind == evRunnersUnreadable:
		// procfs went away (or was never there): /api/ps alone, with the
		// settle window if one is set.
		s.check, s.goneAt = checkListing, time.Time{}
		acts = append(acts, unloadAction{kind: actNoCheck, why: ev.why})
		if r.window <= 0 {
			s, more := s.gone(r, 0)
			return s, append(acts, more...)
		}
	case ev.runners > 0:
		s.runnerSeen, loading, s.goneAt, s.runnerGone = true, true, time.Time{}, time.Time{}
	case s.runnerSeen && s.runnerGone.IsZero():
		// The runner just went. A load queued behind it in the server's
		// scheduler (another request, sent before the unload) starts its
		// own runner only now: the settle window starts again.
		s.runnerGone, s.goneAt = ev.at, ev.at
	case !ev.sent.Before(s.settleEnd(r)):
		// Gone at a count begun late enough after the last unload (and
		// after the last runner went) that a load begun before it would
		// have its runner by now. The count's start is what it saw: a
		// runner started during a slow scan is not in it (race oracle
		// seed 60653702908002).
		return s.gone(r, CheckRunnerProcesses)
	default:
		s.goneAt = ev.at // poll again when the window ends
	}
	poll := s.poll
	poll.at = ev.at
	s, more := s.tail(r, poll, loading)
	return s, append(acts, more...)
}

// tail ends the judging of a listing that did not end the unload: it
// names the phase, tracks another client's hold, resends where the last
// request may have been lost, and schedules the next poll.
func (s unloadState) tail(r *unloadRules, ev unloadEvent, loading bool) (unloadState, []unloadAction) {
	listed := ev.kind == evListed || ev.kind == evListedExpired
	s.loaded = s.loaded || listed
	switch {
	case ev.kind == evListed:
		s.phase = phLost
	case ev.kind == evListedExpired && ev.ours > 0:
		s.phase = phInUse
	case ev.kind == evListedExpired:
		s.phase = phHeld
	case loading || ev.ours > 0:
		s.phase = phLoading
	default:
		s.phase = phSettling
	}
	if s.phase == phHeld {
		// Unloading, but another client's request holds it.
		if s.heldSince.IsZero() {
			s.heldSince = ev.at
		}
		if r.heldOK && ev.at.Sub(s.heldSince) >= r.heldGrace {
			return s.end(phHeldByOthers, KindUnverified)
		}
	} else {
		s.heldSince = time.Time{}
	}
	// Listed with a future expiry: the unload was lost (it came during a
	// load) or a later request set a keep-alive again. Not listed but one
	// of our generations runs: it may be loading, and an unload now would
	// be lost; resend when it shows up. A runner no listing names: a load
	// in progress, which drops an unload, or a model listed under another
	// name that shares the weights (Ollama keys runners by weights file):
	// resend now and then, as for a listed model.
	var acts []unloadAction
	if ev.kind == evListed || ((listed || loading) && ev.at.Sub(s.lastSent) >= r.resendEvery) {
		acts = append(acts, unloadAction{kind: actSend})
	}
	return s, append(acts, s.pollIn(r, ev.at, r.poll))
}

// pollIn schedules the next poll after wait, or at the end of the settle
// window when only that is left, and never past the deadline.
func (s unloadState) pollIn(r *unloadRules, now time.Time, wait time.Duration) unloadAction {
	if !s.goneAt.IsZero() {
		wait = min(wait, s.settleEnd(r).Sub(now))
	}
	wait = max(min(wait, r.deadline.Sub(now)), 0)
	return unloadAction{kind: actPoll, wait: wait}
}

// settleEnd is when the settle window of the process check ends: unloadSettle
// after the last unload request, and after the last runner of the model
// was seen gone.
func (s unloadState) settleEnd(r *unloadRules) time.Time {
	from := s.lastSent
	if s.runnerGone.After(from) {
		from = s.runnerGone
	}
	return from.Add(r.settle)
}
