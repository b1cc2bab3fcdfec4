package oracle

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// Violation is a broken guarantee found in a trace.
type Violation struct {
	Rule   string
	Detail string
	// Known, when set, says why the violation is the server's doing and
	// out of the library's reach: it is counted and shown, not failed.
	Known string
}

func (v Violation) String() string { return v.Rule + ": " + v.Detail }

// The rules.
const (
	RuleGoneNotGone     = "verified-but-resident"  // a verified model was listed or had a runner, and no load since explains it
	RuleNoProcessCheck  = "verified-without-procs" // verified on a local server without the process check
	RuleUntyped         = "untyped-error"          // an error without a kind, or of a kind the oracle never causes
	RuleCancelKind      = "cancel-kind"            // the oracle's cancel came back as another kind, or without its cause
	RuleRetryable       = "retryable-oom"          // an out-of-memory load reported as retryable
	RuleCompleteFailed  = "complete-but-failed"    // the stream reached done:true and the call failed
	RuleOverBound       = "over-bound"             // a call took longer than its timeouts and the margin
	RuleHung            = "hung"                   // a call had not returned a minute past its bound
	RuleChildCrashed    = "child-crashed"          // the second process printed no result or exited non-zero
	RuleCloseLeftWarm   = "close-left-resident"    // Close returned nil and left a model it kept warm
	RuleLeftResident    = "left-resident"          // resident after every party finished and cleaned up
	RuleGaveUp          = "gave-up-on-idle-model"  // an unload timed out on a model no other call used meanwhile
	RuleGoroutines      = "goroutine-leak"         // goroutines left after the schedule
	RuleHarness         = "harness"                // the oracle itself failed
	RuleBehaviourDiffer = "behaviour-differs"      // the server behaved otherwise than the README's table says
)

// Check holds the trace of one schedule to every guarantee. w is the watch
// window (Window); local says the server runs on this machine, so every
// verdict must rest on the process check too.
func Check(tr *Trace, w time.Duration, local bool) []Violation {
	var vs []Violation
	add := func(rule, format string, args ...any) {
		vs = append(vs, Violation{Rule: rule, Detail: fmt.Sprintf(format, args...)})
	}
	if tr.Hung != "" {
		add(RuleHung, "%s", tr.Hung)
	}
	sends := slices.Clone(tr.Sends)
	slices.SortStableFunc(sends, func(a, b *Send) int { return a.T.Compare(b.T) })

	for _, v := range tr.Verdicts {
		if local && v.Checked&vramguard.CheckRunnerProcesses == 0 {
			add(RuleNoProcessCheck, "%s verdict on %s at %s: checked %v (%s)", v.Party, v.Model, stamp(v.T), v.Checked, v.NoRunnerCheck)
			if restarted(tr, v.T.Add(-v.Elapsed), v.T) {
				vs[len(vs)-1].Known = knownRestartListener
			}
		}
		cut := lastUnload(sends, v)
		for _, o := range tr.Obs {
			if !o.T0.After(v.T) || o.T0.After(v.T.Add(w)) || !o.present(v.Model) {
				continue
			}
			explained := slices.ContainsFunc(sends, func(s *Send) bool {
				return !s.Unload && s.Model == v.Model && s.T.After(cut) && !s.T.After(o.T1)
			})
			if !explained {
				add(RuleGoneNotGone, "%s verdict on %s at %s (last unload sent %s): %s later it was listed %v, runners %d, and no load was sent since the last unload",
					v.Party, v.Model, stamp(v.T), stamp(cut), o.T0.Sub(v.T).Round(time.Millisecond), o.Listed[v.Model], o.Runners[v.Model])
				switch {
				case late(tr, sends, v, cut, o):
					vs[len(vs)-1].Known = knownLate
				case o.Listed[v.Model] && o.Runners[v.Model] == 0 && o.Err == "":
					vs[len(vs)-1].Known = knownStale
				}
				break
			}
		}
	}

	for _, r := range tr.Results {
		if d := r.End.Sub(r.Start); r.Bound > 0 && d > r.Bound {
			add(RuleOverBound, "#%d %s took %v, bound %v", r.ID, r.Action, d.Round(time.Millisecond), r.Bound)
		}
		if !r.Action.Op.own() {
			if ce, ok := r.Err.(*childError); ok {
				switch ce.kind {
				case childCrashed:
					add(RuleChildCrashed, "#%d %s: %s", r.ID, r.Action, ce.msg)
				case "", vramguard.KindUnknown.String(), vramguard.KindInternal.String():
					add(RuleUntyped, "#%d %s: the child's error has kind %q: %s", r.ID, r.Action, ce.kind, ce.msg)
				}
			}
			continue
		}
		if r.Err == nil {
			continue
		}
		kinds := leafKinds(r.Err)
		for _, k := range kinds {
			switch {
			case k == vramguard.KindUnknown, k == vramguard.KindInternal:
				add(RuleUntyped, "#%d %s: %v (kind %v)", r.ID, r.Action, r.Err, k)
			case k == vramguard.KindInvalidInput && !errors.Is(r.Err, vramguard.ErrPhaseEnded) && !errors.Is(r.Err, vramguard.ErrSessionEnded):
				add(RuleUntyped, "#%d %s: the oracle sends valid input, got %v", r.ID, r.Action, r.Err)
			case r.Canceled && k == vramguard.KindTimeout:
				add(RuleCancelKind, "#%d %s: canceled at %v, reported %v", r.ID, r.Action, r.Action.CancelAt, r.Err)
			case r.Canceled && k == vramguard.KindCanceled && !errors.Is(r.Err, errOracleCancel) && !errors.Is(r.Err, vramguard.ErrUnloadedWhileLoading) &&
				!errors.Is(r.Err, vramguard.ErrClosed):
				add(RuleCancelKind, "#%d %s: canceled, but the error does not carry the cause: %v", r.ID, r.Action, r.Err)
			case r.Fault == FaultOOM && k.Retryable() && r.Action.Op.loads() && r.Action.Op != OpPhase && !disrupted(tr, r):
				add(RuleRetryable, "#%d %s under %s: %v (kind %v, retryable)", r.ID, r.Action, r.Fault, r.Err, k)
			}
		}
		if errors.Is(r.Err, vramguard.ErrStillResident) && !busy(tr, r) {
			add(RuleGaveUp, "#%d %s: %v, and no other call used the model in the last %v", r.ID, r.Action, r.Err, unloadTimeout/2)
		}
		if r.Action.Op.loads() && r.Action.Op != OpPhase && genFailed(r.Err) {
			for _, s := range sends {
				if s.Action != r.ID || s.Unload || !s.Done {
					continue
				}
				cancelAt := r.Start.Add(r.Action.CancelAt)
				if r.Canceled && cancelAt.After(s.DoneAt.Add(-5*time.Millisecond)) && cancelAt.Before(s.DoneAt.Add(50*time.Millisecond)) {
					continue // the oracle canceled right as the done line came
				}
				add(RuleCompleteFailed, "#%d %s: the reply reached done:true at %s, the call failed: %v", r.ID, r.Action, stamp(s.DoneAt), r.Err)
			}
		}
	}

	// Close returned nil, each time: every model it kept warm is gone.
	closeFailed := tr.CloseErr != nil || slices.ContainsFunc(tr.Results, func(r Result) bool { return r.Action.Op == OpClose && r.Err != nil })
	if !closeFailed {
		for _, g := range []string{ModelA, ModelB} {
			var warm, verdict time.Time
			for _, s := range sends {
				// A request that never went out (its dial failed: a
				// restart) kept nothing warm, and the client rightly
				// takes it back (seed 78228196797586: the model was a
				// foreign 1h load's after it).
				if s.Party == PartyOwn && s.Model == g && !s.Unload && s.Written && s.KeepAlive != "0" && s.KeepAlive != "0s" {
					warm = s.T
				}
			}
			for _, v := range tr.Verdicts {
				if v.Party == PartyOwn && v.Model == g {
					verdict = maxTime(verdict, v.T)
				}
			}
			if !warm.IsZero() && warm.After(verdict) && tr.AfterClose.present(g) {
				add(RuleCloseLeftWarm, "%s: kept warm by a request at %s, listed %v and runners %d after Close returned nil",
					g, stamp(warm), tr.AfterClose.Listed[g], tr.AfterClose.Runners[g])
			}
		}
	}
	for _, r := range tr.Results {
		if r.Note == "final foreign cleanup" && r.Err != nil {
			add(RuleLeftResident, "%v", r.Err)
			if wedged(tr, r.Start, r.End) {
				vs[len(vs)-1].Known = knownWedged
			}
		}
	}
	return vs
}

// lastUnload returns the last unload request of v's call: a load begun
// before it must be caught, one begun after it (or after the verdict)
// explains a later appearance. The call is known by its span (the
// report's Elapsed, up to the verdict) and its Attempts; when calls of
// the same party overlap there, its last request is no earlier than the
// Attempts-th of theirs, which is taken (the cut the call can least be
// blamed for). A call that sent none cuts at its start.
func lastUnload(sends []*Send, v Verdict) time.Time {
	from := v.T.Add(-v.Elapsed)
	var in []time.Time
	for _, s := range sends {
		if s.Unload && s.Party == v.Party && s.Model == v.Model && !s.T.Before(from) && !s.T.After(v.T) {
			in = append(in, s.T)
		}
	}
	switch {
	case v.Attempts <= 0 || len(in) == 0:
		return from
	case v.Attempts > len(in):
		return in[len(in)-1]
	}
	return in[v.Attempts-1]
}

// settle is the library's settle window: a verified unload on a local
// server promises no runner of the model across at least this long after
// its last unload request (UnloadModel's doc), on the ground that a load
// begun before that request shows its runner by then.
const settle = 50 * time.Millisecond

// knownLate is why a late load is the server's: see late.
const knownLate = "a load sent before the unload had no runner and no listing until after the settle window " +
	"(queued in Ollama's scheduler behind another load, or a runner start slower than 50 ms on a loaded machine): " +
	"while so it is in neither /api/ps nor the process table, which is all a verdict can look at (README, known server issues)"

// knownRestartListener is why a verdict without the process check is the
// server's when a restart overlapped the unload.
const knownRestartListener = "the server restarted during the unload: the socket at its port belonged to no `ollama serve` " +
	"the process table showed yet, so the check could not be tied to the server, and the report names it not made"

// restarted reports whether a restart of the server overlapped [from, to].
func restarted(tr *Trace, from, to time.Time) bool {
	return slices.ContainsFunc(tr.Results, func(o Result) bool {
		return o.Action.Op == OpRestart && !o.Start.After(to) && !o.End.Before(from)
	})
}

// knownStale is why a listing with no runner after a verdict is the
// server's.
const knownStale = "/api/ps listed the model with no runner process left (a runner that had just ended; " +
	"Ollama up to v0.32.3 reads its scheduler's map without the lock): nothing was resident"

// late reports whether the appearance o after verdict v is a load that
// showed nothing within the library's settle window: o's presence began
// after a look that found the model gone (no listing, no runner) and
// ended after the window (a look reads the process table last, so its
// end is when it saw no runner), and a load of the model sent before the
// verdict's cut was still unanswered then. Nothing the client can query
// shows such a load before it does; a runner the library overlooked
// would have been seen by that look.
func late(tr *Trace, sends []*Send, v Verdict, cut time.Time, o Obs) bool {
	var gone *Obs // the last look before o's presence began that saw the model gone
	for i := range tr.Obs {
		p := &tr.Obs[i]
		if !p.T0.Before(o.T0) {
			break
		}
		switch {
		case p.Err != "":
		case p.present(v.Model):
			gone = nil
		default:
			gone = p
		}
	}
	if gone == nil || gone.T1.Before(cut.Add(settle)) {
		return false
	}
	return slices.ContainsFunc(sends, func(s *Send) bool {
		return !s.Unload && s.Model == v.Model && s.T.Before(cut) && (s.Answered.IsZero() || s.Answered.After(gone.T1))
	})
}

// busy reports whether, in the second half of an unload's timeout before r
// ended, another call that loads (this party's or another's) ran on r's
// model, the server was restarted or a runner killed, or the server did
// not answer a look: only then may an unload wait in vain.
// disrupted reports whether a restart or a runner's kill overlapped r:
// a connection it cut is a transient failure, whatever the fault.
func disrupted(tr *Trace, r Result) bool {
	return slices.ContainsFunc(tr.Results, func(o Result) bool {
		chaos := o.Action.Op == OpRestart || o.Action.Op == OpKillRunner
		return chaos && o.Start.Before(r.End) && o.End.After(r.Start)
	})
}

func busy(tr *Trace, r Result) bool {
	from := r.End.Add(-unloadTimeout / 2)
	if slices.ContainsFunc(tr.Obs, func(o Obs) bool { return o.Err != "" && o.T0.After(from) && o.T0.Before(r.End) }) {
		return true // the server did not answer: restarting, or gone
	}
	if wedged(tr, from, r.End) {
		return true
	}
	return slices.ContainsFunc(tr.Results, func(o Result) bool {
		same := r.Action.Model == "" || o.Action.Model == "" || Group(o.Action.Model) == Group(r.Action.Model)
		chaos := o.Action.Op == OpRestart || o.Action.Op == OpKillRunner
		return o.ID != r.ID && (o.Action.Op.loads() && same || chaos) && o.Start.Before(r.End) && o.End.After(from)
	})
}

// wedged reports whether the server left an unload request unanswered
// for two seconds or more during [from, to]: it had stopped serving (seen
// on v0.6.5 after canceled loads), which no client can change.
func wedged(tr *Trace, from, to time.Time) bool {
	return slices.ContainsFunc(tr.Sends, func(s *Send) bool {
		if !s.Unload || s.T.After(to) {
			return false
		}
		end := s.Answered
		if end.IsZero() {
			end = to // never answered: unanswered up to the window's end
		}
		return end.Sub(s.T) >= 2*time.Second && end.After(from)
	})
}

// knownWedged is why a model left by a server that stopped answering is
// the server's.
const knownWedged = "the server stopped answering unload requests (two seconds and more): no client can unload then"

// leafKinds returns the kinds of the errors joined in err (one per branch
// of errors.Join; an unjoined error is one branch).
func leafKinds(err error) []vramguard.Kind {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var ks []vramguard.Kind
		for _, e := range j.Unwrap() {
			ks = append(ks, leafKinds(e)...)
		}
		return ks
	}
	return []vramguard.Kind{vramguard.KindOf(err)}
}

// genFailed reports whether err holds a failure of the work itself, not
// only of the cleanup after it (KindUnverified).
func genFailed(err error) bool {
	return slices.ContainsFunc(leafKinds(err), func(k vramguard.Kind) bool { return k != vramguard.KindUnverified })
}

// Outcome names how an action ended, for comparing two targets: "ok", or
// the kinds of its failures joined with "+".
func Outcome(r Result) string {
	if r.Err == nil {
		return "ok"
	}
	if ce, ok := r.Err.(*childError); ok {
		return "child:" + ce.kind
	}
	if !r.Action.Op.own() {
		return "error"
	}
	var names []string
	for _, k := range leafKinds(r.Err) {
		names = append(names, k.String())
	}
	slices.Sort(names)
	return strings.Join(slices.Compact(names), "+")
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }
