package oracle

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Compare returns where the simulator's run of a schedule differs from the
// real server's in what a caller can observe: each action's outcome
// (Outcome), and what was resident once the client was closed. Each
// difference is a short key ("guard: real=ok sim=canceled"), so that a
// sweep can count them.
func Compare(real, sim *Trace) []string {
	if real == nil || sim == nil {
		return nil
	}
	byID := func(tr *Trace) map[int]Result {
		m := map[int]Result{}
		for _, r := range tr.Results {
			m[r.ID] = r
		}
		return m
	}
	rs, ss := byID(real), byID(sim)
	var out []string
	ids := make([]int, 0, len(rs))
	for id := range rs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		r, s := rs[id], ss[id]
		if a, b := Outcome(r), Outcome(s); a != b {
			op := string(r.Action.Op)
			if r.Action.CancelAt > 0 {
				op += " (canceled)"
			}
			if r.Fault != "" {
				op += " under " + string(r.Fault)
			}
			out = append(out, fmt.Sprintf("%s: real=%s sim=%s", op, a, b))
		}
	}
	if a, b := resident(real.AfterClose), resident(sim.AfterClose); a != b {
		out = append(out, fmt.Sprintf("resident after close: real=%s sim=%s", a, b))
	}
	return out
}

func resident(o Obs) string {
	var gs []string
	for _, g := range []string{ModelA, ModelB} {
		if o.present(g) {
			gs = append(gs, g)
		}
	}
	if len(gs) == 0 {
		return "none"
	}
	return strings.Join(gs, ",")
}

// Describe writes a trace as a timeline: sends, verdicts, results and the
// changes in what the server showed, each relative to the first event.
func Describe(tr *Trace) string {
	if tr == nil {
		return "(no trace)"
	}
	type line struct {
		t time.Time
		s string
	}
	var ls []line
	for _, s := range tr.Sends {
		kind := "load"
		if s.Unload {
			kind = "unload"
		}
		ls = append(ls, line{s.T, fmt.Sprintf("%-7s sends %s %s (%s, ka %q, action #%d, done %v)", s.Party, kind, s.Model, s.Path, s.KeepAlive, s.Action, s.Done)})
	}
	for _, v := range tr.Verdicts {
		ls = append(ls, line{v.T, fmt.Sprintf("%-7s verified %s gone (%v)", v.Party, v.Model, v.Checked)})
	}
	for _, r := range tr.Results {
		ls = append(ls, line{r.Start, fmt.Sprintf("#%d start %s", r.ID, r.Action)})
		ls = append(ls, line{r.End, fmt.Sprintf("#%d end %s: %s %v %s", r.ID, r.Action.Op, Outcome(r), r.Err, r.Note)})
	}
	prev := ""
	for _, o := range tr.Obs {
		s := fmt.Sprintf("server: listed %v runners %v %s", keys(o.Listed), o.Runners, o.Err)
		if s != prev {
			ls = append(ls, line{o.T0, s})
			prev = s
		}
	}
	slices.SortStableFunc(ls, func(a, b line) int { return a.t.Compare(b.t) })
	var b strings.Builder
	if len(ls) == 0 {
		return ""
	}
	t0 := ls[0].t
	for _, l := range ls {
		fmt.Fprintf(&b, "  %8.3fs %s\n", l.t.Sub(t0).Seconds(), l.s)
	}
	return b.String()
}

func keys(m map[string]bool) []string {
	var ks []string
	for k, v := range m {
		if v {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}
