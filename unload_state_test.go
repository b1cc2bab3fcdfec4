package vramguard

import (
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// testRules are the terms of an unload with the default PollInterval.
func testRules() unloadRules {
	return unloadRules{
		deadline:    ms(30_000),
		poll:        50 * time.Millisecond,
		settle:      unloadSettle,
		resendEvery: 500 * time.Millisecond,
		heldGrace:   200 * time.Millisecond,
		retryCheck:  time.Second,
	}
}

type stateRow struct {
	name  string
	s     unloadState
	rules func(*unloadRules)
	ev    unloadEvent
	want  unloadPhase
	acts  []unloadActionKind
	then  func(t *testing.T, s unloadState, acts []unloadAction)
}

func kinds(acts []unloadAction) []unloadActionKind {
	var ks []unloadActionKind
	for _, a := range acts {
		ks = append(ks, a.kind)
	}
	return ks
}

func wantWait(d time.Duration) func(*testing.T, unloadState, []unloadAction) {
	return func(t *testing.T, _ unloadState, acts []unloadAction) {
		t.Helper()
		if a := acts[len(acts)-1]; a.kind != actPoll || a.wait != d {
			t.Errorf("next poll %+v, want one in %v", a, d)
		}
	}
}

func wantVerified(c Checks) func(*testing.T, unloadState, []unloadAction) {
	return func(t *testing.T, s unloadState, _ []unloadAction) {
		t.Helper()
		if s.checks != c {
			t.Errorf("checks %v, want %v", s.checks, c)
		}
	}
}

// stateRows are the rules of unloadState.next, one row (at least) per
// phase × event pair that has a rule.
func stateRows() []stateRow {
	sent := unloadState{phase: phSent, check: checkRunners, lastSent: ms(0)}
	listing := sent
	listing.check = checkListing
	pending := sent
	pending.check, pending.checkSince, pending.why = checkPending, ms(0), "model blob: 500"
	rows := []stateRow{
		{name: "first look lists the model", s: unloadState{}, ev: unloadEvent{kind: evLooked, listed: true}, want: phSending, acts: []unloadActionKind{actSend},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if !s.loaded {
					t.Error("a listed model is not recorded as loaded")
				}
			}},
		{name: "first look", s: unloadState{}, ev: unloadEvent{kind: evLooked}, want: phSending, acts: []unloadActionKind{actSend}},
		{name: "first request accepted", s: unloadState{phase: phSending}, ev: unloadEvent{kind: evSent, at: ms(3)}, want: phSetup, acts: []unloadActionKind{actSetup},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if !s.lastSent.Equal(ms(3)) {
					t.Errorf("lastSent %v", s.lastSent)
				}
			}},
		{name: "first request answered by a vramgate that made the runner check: no set-up, poll now",
			s: unloadState{phase: phSending, loaded: true}, ev: unloadEvent{kind: evSent, at: ms(300), gate: gateRunners},
			want: phSent, acts: []unloadActionKind{actPoll},
			then: func(t *testing.T, s unloadState, acts []unloadAction) {
				if s.check != checkGate || !s.lastSent.Equal(ms(300)) || acts[0].wait != 0 {
					t.Errorf("check %v lastSent %v wait %v", s.check, s.lastSent, acts[0].wait)
				}
			}},
		{name: "first request answered by a vramgate without a runner check: by /api/ps, the gate's reason noted",
			s: unloadState{phase: phSending}, ev: unloadEvent{kind: evSent, at: ms(300), gate: gateNoRunners, why: "vramgate at 127.0.0.1:11434 made no runner check: remote server"},
			want: phSent, acts: []unloadActionKind{actNoCheck, actPoll},
			then: func(t *testing.T, s unloadState, acts []unloadAction) {
				if s.check != checkListing || acts[0].why != "vramgate at 127.0.0.1:11434 made no runner check: remote server" {
					t.Errorf("check %v, note %q", s.check, acts[0].why)
				}
			}},
		{name: "first request reset: go on", s: unloadState{phase: phSending}, ev: unloadEvent{kind: evSendFailed, fail: KindTransient}, want: phSetup, acts: []unloadActionKind{actSetup}},
		{name: "first request refused: final", s: unloadState{phase: phSending}, ev: unloadEvent{kind: evSendFailed, fail: KindNotFound}, want: phFailed, acts: []unloadActionKind{actVerdict},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.kind != KindNotFound {
					t.Errorf("kind %v", s.kind)
				}
			}},
		{name: "check ready, model was listed: first poll a poll interval after the request",
			s: unloadState{phase: phSetup, loaded: true, lastSent: ms(0)}, ev: unloadEvent{kind: evCheckReady, at: ms(10)},
			want: phSent, acts: []unloadActionKind{actPoll}, then: wantWait(40 * time.Millisecond)},
		{name: "check ready, nothing listed: poll now",
			s: unloadState{phase: phSetup, lastSent: ms(0)}, ev: unloadEvent{kind: evCheckReady, at: ms(10)},
			want: phSent, acts: []unloadActionKind{actPoll}, then: wantWait(0)},
		{name: "check failed, worth retrying: pending",
			s: unloadState{phase: phSetup, lastSent: ms(0)}, ev: unloadEvent{kind: evCheckFailed, at: ms(10), again: true, why: "model blob: reset"},
			want: phSent, acts: []unloadActionKind{actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.check != checkPending || !s.checkSince.Equal(ms(10)) || s.why != "model blob: reset" {
					t.Errorf("check %v since %v why %q", s.check, s.checkSince, s.why)
				}
			}},
		{name: "no process check (remote server): by /api/ps",
			s: unloadState{phase: phSetup, lastSent: ms(0)}, ev: unloadEvent{kind: evCheckFailed, at: ms(10), why: "remote server"},
			want: phSent, acts: []unloadActionKind{actNoCheck, actPoll},
			then: func(t *testing.T, s unloadState, acts []unloadAction) {
				if s.check != checkListing || acts[0].why != "remote server" {
					t.Errorf("check %v, note %q", s.check, acts[0].why)
				}
			}},

		// Listings, judged the same in every waiting phase (the loop below
		// adds one row per phase); these rows pin the details.
		{name: "listed with a future expiry: lost, resend at once", s: sent, ev: unloadEvent{kind: evListed, at: ms(60)}, want: phLost, acts: []unloadActionKind{actSend, actPoll}},
		{name: "listed, expired, no generation of ours: held", s: sent, ev: unloadEvent{kind: evListedExpired, at: ms(60)}, want: phHeld, acts: []unloadActionKind{actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if !s.heldSince.Equal(ms(60)) || !s.loaded {
					t.Errorf("heldSince %v loaded %v", s.heldSince, s.loaded)
				}
			}},
		{name: "held past the grace with heldOK: held by others", s: unloadState{phase: phHeld, check: checkRunners, lastSent: ms(0), heldSince: ms(60)},
			rules: func(r *unloadRules) { r.heldOK = true }, ev: unloadEvent{kind: evListedExpired, at: ms(260)}, want: phHeldByOthers, acts: []unloadActionKind{actVerdict},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.kind != KindUnverified {
					t.Errorf("kind %v", s.kind)
				}
			}},
		{name: "held past the grace without heldOK: wait, resend every resendEvery", s: unloadState{phase: phHeld, check: checkRunners, lastSent: ms(0), heldSince: ms(60)},
			ev: unloadEvent{kind: evListedExpired, at: ms(600)}, want: phHeld, acts: []unloadActionKind{actSend, actPoll}},
		{name: "held inside the grace with heldOK: wait", s: unloadState{phase: phHeld, check: checkRunners, lastSent: ms(0), heldSince: ms(60)},
			rules: func(r *unloadRules) { r.heldOK = true }, ev: unloadEvent{kind: evListedExpired, at: ms(259)}, want: phHeld, acts: []unloadActionKind{actPoll}},
		{name: "listed, expired, ours on it: in use, the hold clock stops", s: unloadState{phase: phHeld, check: checkRunners, lastSent: ms(0), heldSince: ms(60)},
			rules: func(r *unloadRules) { r.heldOK = true }, ev: unloadEvent{kind: evListedExpired, at: ms(400), ours: 1}, want: phInUse, acts: []unloadActionKind{actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if !s.heldSince.IsZero() {
					t.Error("heldSince kept while our own generation holds the model")
				}
			}},
		{name: "not listed, ours running: loading, no resend (it would be lost)", s: sent, ev: unloadEvent{kind: evNotListed, at: ms(900), ours: 1}, want: phLoading, acts: []unloadActionKind{actPoll}},
		{name: "not listed, none of ours, process check: count the runners", s: sent, ev: unloadEvent{kind: evNotListed, at: ms(60)}, want: phCounting, acts: []unloadActionKind{actCount}},
		{name: "not listed, by /api/ps, no settle window: verified", s: listing, ev: unloadEvent{kind: evNotListed, at: ms(60), sent: ms(59)}, want: phVerified, acts: []unloadActionKind{actVerdict}, then: wantVerified(CheckPS)},
		{name: "not listed, by /api/ps, settle window: settling", s: listing, rules: func(r *unloadRules) { r.window = 100 * time.Millisecond },
			ev: unloadEvent{kind: evNotListed, at: ms(60), sent: ms(59)}, want: phSettling, acts: []unloadActionKind{actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if !s.absentSince.Equal(ms(59)) {
					t.Errorf("absentSince %v, want the listing's send time", s.absentSince)
				}
			}},
		{name: "absent across the settle window: verified, settled", s: func() unloadState { s := listing; s.phase, s.absentSince = phSettling, ms(59); return s }(),
			rules: func(r *unloadRules) { r.window = 100 * time.Millisecond }, ev: unloadEvent{kind: evNotListed, at: ms(160), sent: ms(159)},
			want: phVerified, acts: []unloadActionKind{actVerdict}, then: wantVerified(CheckPS | CheckSettled)},
		{name: "listed again inside the settle window: the window starts over", s: func() unloadState { s := listing; s.phase, s.absentSince = phSettling, ms(59); return s }(),
			rules: func(r *unloadRules) { r.window = 100 * time.Millisecond }, ev: unloadEvent{kind: evListed, at: ms(120), sent: ms(119)},
			want: phLost, acts: []unloadActionKind{actSend, actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if !s.absentSince.IsZero() {
					t.Error("absentSince kept across a listing")
				}
			}},
		{name: "not listed, the gate's runner check: verified, the runner check the gate's",
			s: unloadState{phase: phSent, check: checkGate, lastSent: ms(0)}, ev: unloadEvent{kind: evNotListed, at: ms(5), sent: ms(4)},
			want: phVerified, acts: []unloadActionKind{actVerdict}, then: wantVerified(CheckPS | CheckRunnerProcesses)},
		{name: "listed after the gate's answer: lost, resent (the gate verifies again)",
			s: unloadState{phase: phSent, check: checkGate, lastSent: ms(0)}, ev: unloadEvent{kind: evListed, at: ms(5)},
			want: phLost, acts: []unloadActionKind{actSend, actPoll}},
		{name: "a resend the gate answers without a runner check: by /api/ps from then on",
			s: unloadState{phase: phLost, check: checkGate, lastSent: ms(0)}, ev: unloadEvent{kind: evSent, at: ms(70), gate: gateNoRunners, why: "vramgate at x did not verify the unload"},
			want: phLost, acts: []unloadActionKind{actNoCheck},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.check != checkListing || !s.lastSent.Equal(ms(70)) {
					t.Errorf("check %v lastSent %v", s.check, s.lastSent)
				}
			}},
		{name: "a resend the gate answers with its runner check: the pending check is the gate's",
			s: func() unloadState { s := pending; s.phase = phLoading; return s }(), ev: unloadEvent{kind: evSent, at: ms(70), gate: gateRunners},
			want: phLoading,
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.check != checkGate || s.why != "" {
					t.Errorf("check %v why %q", s.check, s.why)
				}
			}},
		{name: "a gate's answer does not replace the client's own runner check",
			s: sent, ev: unloadEvent{kind: evSent, at: ms(70), gate: gateNoRunners, why: "vramgate at x made no runner check"},
			want: phSent,
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.check != checkRunners {
					t.Errorf("check %v", s.check)
				}
			}},
		{name: "pending process check: a listing waits for another set-up", s: pending, ev: unloadEvent{kind: evNotListed, at: ms(60)}, want: phRechecking, acts: []unloadActionKind{actSetup}},
		{name: "verified and loaded with VerifyVRAM: await the memory", s: func() unloadState { s := listing; s.loaded = true; return s }(),
			rules: func(r *unloadRules) { r.vram = true }, ev: unloadEvent{kind: evNotListed, at: ms(60)}, want: phFreeing, acts: []unloadActionKind{actAwaitMemory}},
		{name: "VerifyVRAM, never loaded: verified at once", s: listing, rules: func(r *unloadRules) { r.vram = true },
			ev: unloadEvent{kind: evNotListed, at: ms(60)}, want: phVerified, acts: []unloadActionKind{actVerdict}, then: wantVerified(CheckPS)},

		// Rechecking: the set-up's outcome, then the poll it was for.
		{name: "recheck ready: the poll is judged with the runners", s: func() unloadState {
			s := pending
			s.phase, s.poll = phRechecking, unloadEvent{kind: evNotListed, at: ms(60)}
			return s
		}(),
			ev: unloadEvent{kind: evCheckReady, at: ms(70)}, want: phCounting, acts: []unloadActionKind{actCount}},
		{name: "recheck failed again inside the retry: loading, resend every resendEvery",
			s: func() unloadState {
				s := pending
				s.phase, s.poll = phRechecking, unloadEvent{kind: evNotListed, at: ms(600)}
				return s
			}(),
			ev: unloadEvent{kind: evCheckFailed, at: ms(610), again: true, why: "model blob: 500 again"}, want: phLoading, acts: []unloadActionKind{actSend, actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.check != checkPending || s.why != "model blob: 500 again" || !s.checkSince.Equal(ms(0)) {
					t.Errorf("check %v why %q since %v", s.check, s.why, s.checkSince)
				}
			}},
		{name: "recheck failed for the whole retry: by /api/ps, then judged",
			s: func() unloadState {
				s := pending
				s.phase, s.poll = phRechecking, unloadEvent{kind: evNotListed, at: ms(1000)}
				return s
			}(),
			ev: unloadEvent{kind: evCheckFailed, at: ms(1001), again: true, why: "model blob: 500"}, want: phVerified, acts: []unloadActionKind{actNoCheck, actVerdict}, then: wantVerified(CheckPS)},

		// Counting the runners of an absent model.
		{name: "a runner with no listing: loading, resent every resendEvery", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), poll: unloadEvent{kind: evNotListed, at: ms(600)}},
			ev: unloadEvent{kind: evRunners, at: ms(601), sent: ms(601), runners: 1}, want: phLoading, acts: []unloadActionKind{actSend, actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if !s.runnerSeen || !s.goneAt.IsZero() {
					t.Errorf("runnerSeen %v goneAt %v", s.runnerSeen, s.goneAt)
				}
			}},
		{name: "no runner, settle window over: verified by the processes", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), poll: unloadEvent{kind: evNotListed, at: ms(50)}},
			ev: unloadEvent{kind: evRunners, at: ms(50), sent: ms(50)}, want: phVerified, acts: []unloadActionKind{actVerdict}, then: wantVerified(CheckPS | CheckRunnerProcesses)},
		{name: "the runner went: the settle window starts again", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), runnerSeen: true, poll: unloadEvent{kind: evNotListed, at: ms(700)}},
			ev: unloadEvent{kind: evRunners, at: ms(700), sent: ms(700)}, want: phSettling, acts: []unloadActionKind{actPoll}, then: wantWait(50 * time.Millisecond)},
		{name: "absent a settle window after the runner went: verified", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), runnerSeen: true, runnerGone: ms(700), goneAt: ms(700), poll: unloadEvent{kind: evNotListed, at: ms(750)}},
			ev: unloadEvent{kind: evRunners, at: ms(750), sent: ms(750)}, want: phVerified, acts: []unloadActionKind{actVerdict}, then: wantVerified(CheckPS | CheckRunnerProcesses)},
		{name: "absent inside the window after the runner went: wait for its end", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), runnerSeen: true, runnerGone: ms(700), goneAt: ms(700), poll: unloadEvent{kind: evNotListed, at: ms(730)}},
			ev: unloadEvent{kind: evRunners, at: ms(730), sent: ms(730)}, want: phSettling, acts: []unloadActionKind{actPoll}, then: wantWait(20 * time.Millisecond)},
		{name: "no runner at a count begun inside the settle window and ended after it: count again at once", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), poll: unloadEvent{kind: evNotListed, at: ms(20)}},
			ev: unloadEvent{kind: evRunners, at: ms(90), sent: ms(25)}, want: phSettling, acts: []unloadActionKind{actPoll}, then: wantWait(0)},
		{name: "no runner inside the settle window: poll at its end", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), poll: unloadEvent{kind: evNotListed, at: ms(20)}},
			ev: unloadEvent{kind: evRunners, at: ms(20), sent: ms(20)}, want: phSettling, acts: []unloadActionKind{actPoll}, then: wantWait(30 * time.Millisecond)},
		{name: "process table unreadable, no settle window: verified by /api/ps", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), poll: unloadEvent{kind: evNotListed, at: ms(60)}},
			ev: unloadEvent{kind: evRunnersUnreadable, at: ms(60), why: "runner processes: no procfs"}, want: phVerified, acts: []unloadActionKind{actNoCheck, actVerdict}, then: wantVerified(CheckPS)},
		{name: "process table unreadable, settle window: by /api/ps, settling", s: unloadState{phase: phCounting, check: checkRunners, lastSent: ms(0), poll: unloadEvent{kind: evNotListed, at: ms(60)}},
			rules: func(r *unloadRules) { r.window = 100 * time.Millisecond },
			ev:    unloadEvent{kind: evRunnersUnreadable, at: ms(60), why: "runner processes: no procfs"}, want: phSettling, acts: []unloadActionKind{actNoCheck, actPoll},
			then: func(t *testing.T, s unloadState, _ []unloadAction) {
				if s.check != checkListing {
					t.Errorf("check %v", s.check)
				}
			}},
		{name: "the device memory came back", s: unloadState{phase: phFreeing, check: checkRunners, checks: CheckPS | CheckRunnerProcesses, loaded: true},
			ev: unloadEvent{kind: evMemoryBack, at: ms(300)}, want: phVerified, acts: []unloadActionKind{actVerdict}, then: wantVerified(CheckPS | CheckRunnerProcesses | CheckDeviceMemory)},
		{name: "no wait past the deadline", s: sent, ev: unloadEvent{kind: evListed, at: ms(29_980)}, want: phLost, acts: []unloadActionKind{actSend, actPoll}, then: wantWait(20 * time.Millisecond)},
		{name: "a poll at the deadline: wait nothing (the driver's context ends it)", s: sent, ev: unloadEvent{kind: evPollFailed, at: ms(30_010)}, want: phSent, acts: []unloadActionKind{actPoll}, then: wantWait(0)},
	}
	// Every waiting phase takes requests, failed polls and listings alike.
	for p := phSent; p <= phSettling; p++ {
		if !p.waiting() {
			continue
		}
		s := unloadState{phase: p, check: checkRunners, lastSent: ms(0)}
		rows = append(rows,
			stateRow{name: p.String() + ": resend accepted", s: s, ev: unloadEvent{kind: evSent, at: ms(70)}, want: p,
				then: func(t *testing.T, s unloadState, _ []unloadAction) {
					if !s.lastSent.Equal(ms(70)) {
						t.Errorf("lastSent %v", s.lastSent)
					}
				}},
			stateRow{name: p.String() + ": resend failed: the polls resend", s: s, ev: unloadEvent{kind: evSendFailed, at: ms(70), fail: KindTransient}, want: p},
			stateRow{name: p.String() + ": poll failed: poll again", s: s, ev: unloadEvent{kind: evPollFailed, at: ms(70)}, want: p, acts: []unloadActionKind{actPoll}, then: wantWait(50 * time.Millisecond)},
			stateRow{name: p.String() + ": listed", s: s, ev: unloadEvent{kind: evListed, at: ms(70)}, want: phLost, acts: []unloadActionKind{actSend, actPoll}},
			stateRow{name: p.String() + ": listed, expired", s: s, ev: unloadEvent{kind: evListedExpired, at: ms(70), ours: 2}, want: phInUse, acts: []unloadActionKind{actPoll}},
			stateRow{name: p.String() + ": not listed", s: s, ev: unloadEvent{kind: evNotListed, at: ms(70)}, want: phCounting, acts: []unloadActionKind{actCount}},
		)
	}
	// The context ends every phase that is not an end.
	for p := range numPhases {
		if !p.done() {
			rows = append(rows, stateRow{name: p.String() + ": stopped", s: unloadState{phase: p}, ev: unloadEvent{kind: evStopped, fail: KindTimeout}, want: phFailed, acts: []unloadActionKind{actVerdict}})
		}
	}
	return rows
}

// TestUnloadStateTable checks every rule of the unload's state machine, and
// that every phase × event pair without one is refused (a driver fault:
// KindInternal) or, at an end, changes nothing.
func TestUnloadStateTable(t *testing.T) {
	ruled := make(map[[2]int]bool)
	for _, row := range stateRows() {
		t.Run(row.name, func(t *testing.T) {
			ruled[[2]int{int(row.s.phase), int(row.ev.kind)}] = true
			r := testRules()
			if row.rules != nil {
				row.rules(&r)
			}
			s, acts := row.s.next(&r, row.ev)
			if s.phase != row.want || !slices.Equal(kinds(acts), row.acts) {
				t.Fatalf("%v + %v → %v %v, want %v %v", row.s.phase, row.ev.kind, s.phase, kinds(acts), row.want, row.acts)
			}
			if s.phase == phFailed && s.kind == KindInternal {
				t.Fatalf("a rule's row ends in a driver fault: %s", s.why)
			}
			if row.then != nil {
				row.then(t, s, acts)
			}
		})
	}
	var nRuled, nRefused, nEnded int
	r := testRules()
	for p := range numPhases {
		for k := range numEvents {
			in := unloadState{phase: p, check: checkRunners, lastSent: ms(0)}
			s, acts := in.next(&r, unloadEvent{kind: k, at: ms(100)})
			switch {
			case p.done():
				nEnded++
				if s != in || acts != nil {
					t.Errorf("%v + %v: an end changed: %v %v", p, k, s.phase, kinds(acts))
				}
			case ruled[[2]int{int(p), int(k)}]:
				nRuled++
			default:
				nRefused++
				if s.phase != phFailed || s.kind != KindInternal || !slices.Equal(kinds(acts), []unloadActionKind{actVerdict}) || s.why == "" {
					t.Errorf("%v + %v has no row but gives %v (%v) %v: add its rule to the table", p, k, s.phase, s.kind, kinds(acts))
				}
			}
		}
	}
	total := int(numPhases) * int(numEvents)
	t.Logf("%d phases × %d events = %d pairs: %d with a rule (a row each), %d refused as driver faults, %d at an end",
		numPhases, numEvents, total, nRuled, nRefused, nEnded)
	if nRuled+nRefused+nEnded != total {
		t.Fatalf("counted %d pairs of %d", nRuled+nRefused+nEnded, total)
	}
}

// FuzzUnloadState drives the state machine as the driver does, with the
// facts drawn from the input: each action answered by one of the events it
// can produce. It checks the invariants of every unload: never verified
// while a listing or a runner of the model is the latest fact, no wait past
// the deadline, one verdict and a typed one at every end, never stuck
// (an action is always due until the end), and an end that nothing
// changes.
func FuzzUnloadState(f *testing.F) {
	f.Add([]byte{1, 0, 0, 2, 2, 0, 2, 0, 0}, false, false, uint8(0))
	f.Add([]byte{1, 0, 1, 1, 0, 5, 2, 1, 2, 2, 0, 9, 2, 0, 0}, true, true, uint8(1))
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, true, false, uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, heldOK, vram bool, window uint8) {
		r := testRules()
		r.heldOK, r.vram = heldOK, vram
		r.window = time.Duration(window%4) * 50 * time.Millisecond
		next := func() int { // the next input byte; past the end, the context ends
			if len(data) == 0 {
				return -1
			}
			b := int(data[0])
			data = data[1:]
			return b
		}
		now := t0
		var s unloadState
		type due struct {
			unloadAction
			at time.Time // when the state asked for it
		}
		todo := []due{{unloadAction: unloadAction{kind: actLook}, at: now}}
		var last unloadEvent // the latest listing (and the count made for it, in counted)
		counted, verdicts := -1, 0
		var sawRunner bool
		lastGate := gateNone     // the last answer a vramgate gave
		var zeroSince time.Time  // the first count with no runner since the last with one
		var countBegan time.Time // when the last count's scan began
		for steps := 0; len(todo) > 0; steps++ {
			if steps > 100_000 {
				t.Fatal("no end after 100,000 steps")
			}
			a := todo[0]
			todo = todo[1:]
			b := next()
			ev := unloadEvent{kind: evStopped, fail: KindTimeout}
			switch a.kind {
			case actNoCheck:
				if a.why == "" {
					t.Fatal("no process check, and no reason")
				}
				continue
			case actVerdict:
				verdicts++
				continue
			case actPoll:
				if a.wait < 0 || a.wait > max(r.deadline.Sub(a.at), 0) {
					t.Fatalf("a wait of %v asked at %v passes the deadline %v", a.wait, a.at.Sub(t0), r.deadline.Sub(t0))
				}
				now = now.Add(a.wait)
				if b >= 0 && now.Before(r.deadline) {
					ev = unloadEvent{kind: [...]unloadEventKind{evNotListed, evListed, evListedExpired, evPollFailed}[b%4], sent: now, ours: (b / 4) % 3 / 2}
				}
			case actLook:
				if b >= 0 {
					ev = unloadEvent{kind: evLooked, listed: b%2 == 1}
				}
			case actSend:
				if b >= 0 {
					// One answer in three is a vramgate's (a few bits
					// beyond the ones that pick the kind).
					ev = [...]unloadEvent{{kind: evSent}, {kind: evSent, gate: gateRunners}, {kind: evSent, gate: gateNoRunners, why: "vramgate at x made no runner check"}}[(b/8)%3]
					if b%4 == 3 {
						ev = unloadEvent{kind: evSendFailed, fail: [...]Kind{KindTransient, KindServer}[(b/4)%2]}
					}
				}
			case actSetup:
				if b >= 0 {
					ev = [...]unloadEvent{{kind: evCheckReady}, {kind: evCheckFailed, again: true, why: "model blob: 500"}, {kind: evCheckFailed, why: "remote server"}}[b%3]
				}
			case actCount:
				if b >= 0 {
					ev = unloadEvent{kind: evRunners, runners: b % 3 / 2}
					if b%7 == 6 {
						ev = unloadEvent{kind: evRunnersUnreadable, why: "runner processes: gone"}
					}
				}
			case actAwaitMemory:
				if b >= 0 {
					ev = unloadEvent{kind: evMemoryBack}
				}
			}
			began := now
			if b >= 0 {
				now = now.Add(time.Duration(b%17) * time.Millisecond) // the action's own time
			}
			ev.at = now
			if ev.kind == evRunners {
				ev.sent, countBegan = began, began // a scan sees the table as it began
			}
			switch {
			case ev.kind == evSent && ev.gate != gateNone:
				lastGate = ev.gate
			case isListing(ev.kind):
				last, counted = ev, -1
			case ev.kind == evRunners:
				counted = ev.runners
				switch {
				case ev.runners > 0:
					sawRunner, zeroSince = true, time.Time{}
				case sawRunner && zeroSince.IsZero():
					zeroSince = ev.at
				}
			}
			prev := s
			var more []unloadAction
			s, more = s.next(&r, ev)
			if s.phase == phFailed && s.kind == KindInternal {
				t.Fatalf("the driver's facts refused: %s", s.why)
			}
			if (s.phase == phVerified || s.phase == phFreeing) && prev.phase != phFreeing {
				if last.kind != evNotListed || last.ours != 0 || counted > 0 {
					t.Fatalf("verified while the latest fact is %v (ours %d, runners %d)", last.kind, last.ours, counted)
				}
				if s.check == checkPending {
					t.Fatal("verified while the process check is still to be made")
				}
				byGate := s.check == checkGate
				if byGate && (s.checks&CheckRunnerProcesses == 0 || lastGate != gateRunners) {
					t.Fatalf("verified on the gate's check with checks %v, its last answer %v", s.checks, lastGate)
				}
				if s.checks&CheckRunnerProcesses != 0 && !byGate && (s.check != checkRunners || counted != 0 || countBegan.Sub(s.lastSent) < r.settle) {
					t.Fatalf("verified by the processes with check %v, count %d begun %v after the last request", s.check, counted, countBegan.Sub(s.lastSent))
				}
				if s.checks&CheckRunnerProcesses != 0 && !byGate && sawRunner && (zeroSince.IsZero() || countBegan.Sub(zeroSince) < r.settle) {
					t.Fatalf("verified by the processes by a count begun %v after the runner was first seen gone", countBegan.Sub(zeroSince))
				}
			}
			if s.phase.done() {
				// The verdict comes last; only a note that the process
				// check was given up may come before it.
				ks := kinds(more)
				if len(ks) == 0 || ks[len(ks)-1] != actVerdict || slices.ContainsFunc(ks[:len(ks)-1], func(k unloadActionKind) bool { return k != actNoCheck }) {
					t.Fatalf("end %v with actions %v", s.phase, ks)
				}
				if s.phase != phVerified && s.kind == KindUnknown {
					t.Fatalf("end %v without a kind", s.phase)
				}
				if s.phase == phHeldByOthers && !heldOK {
					t.Fatal("held by others without heldOK")
				}
				if s.phase == phVerified && s.checks&CheckPS == 0 {
					t.Fatalf("verified on %v", s.checks)
				}
				todo = todo[:0]
			}
			for _, m := range more {
				todo = append(todo, due{unloadAction: m, at: now})
			}
			if !s.phase.done() && len(todo) == 0 {
				t.Fatalf("stuck in %v after %v: nothing to do", s.phase, ev.kind)
			}
		}
		if !s.phase.done() || verdicts != 1 {
			t.Fatalf("ended in %v with %d verdicts", s.phase, verdicts)
		}
		for k := range numEvents {
			if after, acts := s.next(&r, unloadEvent{kind: k, at: now}); after != s || acts != nil {
				t.Fatalf("the end %v changed on %v", s.phase, k)
			}
		}
	})
}
