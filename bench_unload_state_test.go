package vramguard

import (
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/procs"
)

// BenchmarkRunnerCheck is one procfs pass of the process check on this
// machine's /proc (no runner serves the blob).
func BenchmarkRunnerCheck(b *testing.B) {
	w := &runnerWatch{blob: "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	for b.Loop() {
		if _, err := w.live(); err != nil {
			b.Fatal(err)
		}
	}
	rs, _ := procs.Runners("")
	b.ReportMetric(float64(len(rs)), "runners")
}

// BenchmarkUnloadDecisions is the state machine's share of one verified
// unload of a loaded model on a local server: the eight events of a
// typical run (look, request, process check, the model listed, then
// absent, the runners counted twice across the settle window), with no
// I/O.
func BenchmarkUnloadDecisions(b *testing.B) {
	r := unloadRules{deadline: ms(30_000), poll: 50 * time.Millisecond, settle: unloadSettle,
		resendEvery: 500 * time.Millisecond, heldGrace: 200 * time.Millisecond, retryCheck: time.Second}
	evs := []unloadEvent{
		{kind: evLooked, listed: true}, {kind: evSent, at: ms(1)}, {kind: evCheckReady, at: ms(2)},
		{kind: evListedExpired, at: ms(50)}, {kind: evNotListed, at: ms(60)}, {kind: evRunners, at: ms(60), sent: ms(60)},
		{kind: evNotListed, at: ms(100)}, {kind: evRunners, at: ms(100), sent: ms(100)},
	}
	for b.Loop() {
		var s unloadState
		for _, ev := range evs {
			s, _ = s.next(&r, ev)
		}
		if s.phase != phVerified {
			b.Fatalf("ended in %v", s.phase)
		}
	}
}
