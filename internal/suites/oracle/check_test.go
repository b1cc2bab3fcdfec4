package oracle

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
)

// The checker is the oracle's judge: each rule must fire on a trace that
// breaks it and stay quiet on the same trace made lawful.
func TestCheckRules(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	obs := func(ms int, listed bool, runners int) Obs {
		o := Obs{T0: at(ms), T1: at(ms + 1), Listed: map[string]bool{}, Runners: map[string]int{}}
		if listed {
			o.Listed[ModelA] = true
		}
		if runners > 0 {
			o.Runners[ModelA] = runners
		}
		return o
	}
	unload := &Send{T: at(0), Party: PartyOwn, Model: ModelA, Unload: true, KeepAlive: "0s", Action: 1}
	verdict := Verdict{T: at(100), Party: PartyOwn, Model: ModelA, Checked: vramguard.CheckPS | vramguard.CheckRunnerProcesses, Elapsed: 100 * time.Millisecond, Attempts: 1}
	ownErr := func(k vramguard.Kind, cause error) error {
		return &vramguard.Error{Op: "generate", Model: ModelA, Kind: k, Err: cause}
	}

	tests := []struct {
		name string
		tr   *Trace
		want string // the rule that must fire; "" for none
	}{
		{"gone and staying gone", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(150, false, 0), obs(600, false, 0)}}, ""},
		{"a runner after the verdict, no load since", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(150, false, 1)}}, RuleGoneNotGone},
		{"listed after the verdict, no load since", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(400, true, 1)}}, RuleGoneNotGone},
		{"listed after the verdict with no runner left", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(101, true, 0)}}, "known"},
		{"a load sent before the last unload does not explain it",
			&Trace{Sends: []*Send{{T: at(-50), Party: PartyForeign, Model: ModelA}, unload}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(300, true, 1)}}, RuleGoneNotGone},
		{"a load sent after the last unload explains it",
			&Trace{Sends: []*Send{unload, {T: at(60), Party: PartyForeign, Model: ModelA}}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(300, true, 1)}}, ""},
		{"a load that showed nothing until after the settle window is the server's",
			&Trace{Sends: []*Send{{T: at(-50), Party: PartyCLI, Model: ModelA, Action: -1}, unload}, Verdicts: []Verdict{verdict},
				Obs: []Obs{obs(60, false, 0), obs(150, false, 0), obs(300, false, 1)}}, "known"},
		{"the same, but the runner was there after the window",
			&Trace{Sends: []*Send{{T: at(-50), Party: PartyCLI, Model: ModelA, Action: -1}, unload}, Verdicts: []Verdict{verdict},
				Obs: []Obs{obs(20, false, 1), obs(60, false, 1), obs(110, false, 1), obs(300, false, 1)}}, RuleGoneNotGone},
		{"the same, but the only empty look was inside the window",
			&Trace{Sends: []*Send{{T: at(-50), Party: PartyCLI, Model: ModelA, Action: -1}, unload}, Verdicts: []Verdict{verdict},
				Obs: []Obs{obs(30, false, 0), obs(110, false, 1), obs(300, false, 1)}}, RuleGoneNotGone},
		{"the same, the runner coming just after a look that ended past the window",
			&Trace{Sends: []*Send{{T: at(-50), Party: PartyCLI, Model: ModelA, Action: -1}, unload}, Verdicts: []Verdict{verdict},
				Obs: []Obs{{T0: at(40), T1: at(55), Listed: map[string]bool{}, Runners: map[string]int{}}, obs(110, false, 1)}}, "known"},
		{"the same, but the request had its answer before the empty look",
			&Trace{Sends: []*Send{{T: at(-50), Party: PartyCLI, Model: ModelA, Action: -1, Answered: at(40)}, unload}, Verdicts: []Verdict{verdict},
				Obs: []Obs{obs(60, false, 0), obs(150, false, 0), obs(300, false, 1)}}, RuleGoneNotGone},
		{"the same, but the empty look failed",
			&Trace{Sends: []*Send{{T: at(-50), Party: PartyCLI, Model: ModelA, Action: -1}, unload}, Verdicts: []Verdict{verdict},
				Obs: []Obs{{T0: at(60), T1: at(61), Err: "refused"}, obs(300, false, 1)}}, RuleGoneNotGone},
		{"another call's later unload does not move this verdict's cut",
			&Trace{Sends: []*Send{unload, {T: at(30), Party: PartyForeign, Model: ModelA}, {T: at(35), Party: PartyOwn, Model: ModelA, Unload: true}},
				Verdicts: []Verdict{verdict}, Obs: []Obs{obs(300, true, 1)}}, ""},
		{"a load sent after the look does not explain it",
			&Trace{Sends: []*Send{unload, {T: at(400), Party: PartyForeign, Model: ModelA}}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(300, true, 1)}}, RuleGoneNotGone},
		{"outside the window", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{verdict}, Obs: []Obs{obs(100+1500, true, 1)}}, ""},
		{"another model's look", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{{T: at(100), Party: PartyOwn, Model: ModelB, Checked: verdict.Checked}}, Obs: []Obs{obs(150, true, 1)}}, ""},
		{"verified by ps alone on a local server", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{{T: at(100), Party: PartyOwn, Model: ModelA, Checked: vramguard.CheckPS}}}, RuleNoProcessCheck},
		{"verified by ps alone while the server restarted", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{{T: at(100), Elapsed: 100 * time.Millisecond, Party: PartyOwn, Model: ModelA, Checked: vramguard.CheckPS}},
			Results: []Result{{ID: 2, Action: Action{Op: OpRestart}, Start: at(50), End: at(100)}}}, "known"},
		{"verified by ps alone, a restart long before", &Trace{Sends: []*Send{unload}, Verdicts: []Verdict{{T: at(1000), Elapsed: 100 * time.Millisecond, Party: PartyOwn, Model: ModelA, Checked: vramguard.CheckPS}},
			Results: []Result{{ID: 2, Action: Action{Op: OpRestart}, Start: at(50), End: at(100)}}}, RuleNoProcessCheck},
		{"an untyped error", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpGuard}, Err: errors.New("boom")}}}, RuleUntyped},
		{"a typed error", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpGuard}, Err: ownErr(vramguard.KindTransient, nil)}}}, ""},
		{"a cancel reported as a timeout", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpGuard, CancelAt: time.Millisecond}, Canceled: true, Err: ownErr(vramguard.KindTimeout, nil)}}}, RuleCancelKind},
		{"a cancel without its cause", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpGuard, CancelAt: time.Millisecond}, Canceled: true, Err: ownErr(vramguard.KindCanceled, errors.New("other"))}}}, RuleCancelKind},
		{"a cancel with its cause", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpGuard, CancelAt: time.Millisecond}, Canceled: true, Err: ownErr(vramguard.KindCanceled, fmt.Errorf("x: %w", errOracleCancel))}}}, ""},
		{"out of memory as retryable", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpGuard}, Fault: FaultOOM, Err: ownErr(vramguard.KindTransient, nil)}}}, RuleRetryable},
		{"out of memory, cut by a restart: transient", &Trace{Results: []Result{
			{ID: 1, Action: Action{Op: OpGuard}, Start: at(0), End: at(300), Fault: FaultOOM, Err: ownErr(vramguard.KindTransient, nil)},
			{ID: 2, Action: Action{Op: OpRestart}, Start: at(100), End: at(2000)}}}, ""},
		{"out of memory as retryable, a restart after it", &Trace{Results: []Result{
			{ID: 1, Action: Action{Op: OpGuard}, Start: at(0), End: at(300), Fault: FaultOOM, Err: ownErr(vramguard.KindTransient, nil)},
			{ID: 2, Action: Action{Op: OpRestart}, Start: at(400), End: at(2000)}}}, RuleRetryable},
		{"out of memory as such", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpGuard}, Fault: FaultOOM, Err: ownErr(vramguard.KindOutOfMemory, nil)}}}, ""},
		{"done and failed", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, Action: 1, Done: true, DoneAt: at(10)}},
			Results: []Result{{ID: 1, Action: Action{Op: OpGuard}, Err: ownErr(vramguard.KindTransient, nil)}}}, RuleCompleteFailed},
		{"done, then canceled long after, and failed", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, Action: 1, Done: true, DoneAt: at(10)}},
			Results: []Result{{ID: 1, Action: Action{Op: OpGuard, CancelAt: 200 * time.Millisecond}, Start: at(0), End: at(300), Canceled: true,
				Err: ownErr(vramguard.KindCanceled, errOracleCancel)}}}, RuleCompleteFailed},
		{"done as the cancel came", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, Action: 1, Done: true, DoneAt: at(200)}},
			Results: []Result{{ID: 1, Action: Action{Op: OpGuard, CancelAt: 200 * time.Millisecond}, Start: at(0), End: at(300), Canceled: true,
				Err: ownErr(vramguard.KindCanceled, errOracleCancel)}}}, ""},
		{"a child that crashed", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpChild}, Err: &childError{kind: childCrashed, msg: "exit status 66"}}}}, RuleChildCrashed},
		{"done and only the cleanup failed", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, Action: 1, Done: true, DoneAt: at(10)}},
			Results: []Result{{ID: 1, Action: Action{Op: OpGuard}, Err: ownErr(vramguard.KindUnverified, vramguard.ErrHeldByOthers)}}}, ""},
		{"over its bound", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpUnload}, Start: at(0), End: at(5000), Bound: time.Second}}}, RuleOverBound},
		{"Close left a warm model", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, KeepAlive: "1h0m0s", Written: true}}, AfterClose: obs(10, true, 1)}, RuleCloseLeftWarm},
		{"Close, the warm request never went out (a dial refused in a restart)", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, KeepAlive: "1h0m0s"}}, AfterClose: obs(10, true, 1)}, ""},
		{"a Close in a round failed, the final one returned nil", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, KeepAlive: "1h0m0s", Written: true}},
			Results: []Result{{ID: 3, Action: Action{Op: OpClose}, Err: ownErr(vramguard.KindUnavailable, nil)}}, AfterClose: obs(10, true, 1)}, ""},
		{"Close, the model unloaded since", &Trace{Sends: []*Send{{T: at(0), Party: PartyOwn, Model: ModelA, KeepAlive: "1h0m0s", Written: true}},
			Verdicts: []Verdict{{T: at(5), Party: PartyOwn, Model: ModelA, Checked: verdict.Checked}}, AfterClose: obs(10, true, 1)}, ""},
		{"an unload gave up on an idle model", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpUnload, Model: ModelA}, Start: at(0), End: at(10000),
			Err: &vramguard.Error{Op: "unload", Kind: vramguard.KindTimeout, Err: vramguard.ErrStillResident}}}}, RuleGaveUp},
		{"an unload waited through a restart", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpUnload, Model: ModelA}, Start: at(0), End: at(10000),
			Err: &vramguard.Error{Op: "unload", Kind: vramguard.KindTimeout, Err: vramguard.ErrStillResident}},
			{ID: 2, Action: Action{Op: OpRestart}, Start: at(0), End: at(9000)}}}, ""},
		{"an unload waited for another program's request", &Trace{Results: []Result{{ID: 1, Action: Action{Op: OpUnload, Model: ModelA}, Start: at(0), End: at(10000),
			Err: &vramguard.Error{Op: "unload", Kind: vramguard.KindTimeout, Err: vramguard.ErrStillResident}},
			{ID: 2, Action: Action{Op: OpForeign, Model: ModelA}, Start: at(0), End: at(9000)}}}, ""},
		{"an unload gave up on a server that stopped answering", &Trace{Sends: []*Send{{T: at(6000), Party: PartyForeign, Model: ModelA, Unload: true}},
			Results: []Result{{ID: 1, Action: Action{Op: OpUnload, Model: ModelA}, Start: at(0), End: at(10000),
				Err: &vramguard.Error{Op: "unload", Kind: vramguard.KindTimeout, Err: vramguard.ErrStillResident}}}}, ""},
		{"an unload gave up on a server that stopped answering before the window", &Trace{Sends: []*Send{{T: at(100), Party: PartyOwn, Model: ModelA, Unload: true}},
			Results: []Result{{ID: 1, Action: Action{Op: OpUnload, Model: ModelA}, Start: at(0), End: at(10000),
				Err: &vramguard.Error{Op: "unload", Kind: vramguard.KindTimeout, Err: vramguard.ErrStillResident}}}}, ""},
		{"left resident by a server that stopped answering", &Trace{Sends: []*Send{{T: at(0), Party: PartyForeign, Model: ModelA, Unload: true, Answered: at(5000)}},
			Results: []Result{{ID: 9, Action: Action{Op: OpForeignStop}, Start: at(0), End: at(20000), Note: "final foreign cleanup", Err: errors.New("listed")}}}, "known"},
		{"left resident at the end", &Trace{Results: []Result{{ID: 9, Action: Action{Op: OpForeignStop}, Note: "final foreign cleanup", Err: errors.New("listed")}}}, RuleLeftResident},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := tt.tr
			if tr.AfterClose.Listed == nil {
				tr.AfterClose = Obs{Listed: map[string]bool{}, Runners: map[string]int{}}
			}
			vs := Check(tr, time.Second, true)
			got := ""
			for _, v := range vs {
				rule := v.Rule
				if v.Known != "" {
					rule = "known"
				}
				if tt.want == "" || rule == tt.want {
					got = rule
					break
				}
			}
			if got != tt.want {
				t.Errorf("violations %v, want rule %q", vs, tt.want)
			}
		})
	}
}

// A seed gives one schedule, and the generator draws only what the
// target can play.
func TestGenerateReplays(t *testing.T) {
	p := Profile{Name: "x", CLI: true, Child: true, Kill: true, Faults: []Fault{FaultOOM}}
	a, b := Generate(42, p), Generate(42, p)
	if a.String() != b.String() {
		t.Fatalf("seed 42 gave two schedules:\n%s\n%s", a, b)
	}
	if Generate(43, p).String() == a.String() {
		t.Errorf("seeds 42 and 43 gave the same schedule")
	}
	seen := map[Op]bool{}
	for seed := range uint64(2000) {
		for _, r := range Generate(seed, Profile{}).Rounds {
			for _, a := range r {
				seen[a.Op] = true
				if a.Op == OpCLI || a.Op == OpChild || a.Op == OpKillRunner || a.Op == OpFault || a.Op == OpRestart {
					t.Fatalf("seed %d: %s for a target that cannot play it", seed, a)
				}
			}
		}
		for _, r := range Generate(seed, p).Rounds {
			for _, a := range r {
				seen[a.Op] = true
			}
		}
	}
	for _, op := range []Op{OpGenerate, OpGuard, OpGuardAsync, OpGuardChat, OpPhase, OpUnload, OpUnloadAll, OpEnsureFree,
		OpCleanup, OpCleanupAsync, OpClose, OpForeign, OpForeignStop, OpCLI, OpChild, OpKillRunner, OpFault, OpRestart} {
		if !seen[op] {
			t.Errorf("2000 seeds never drew %s", op)
		}
	}
}
