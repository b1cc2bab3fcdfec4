package vramguard

import (
	"fmt"
	"strings"

	"github.com/vramguard/vramguard/internal/wire"
)

// An unload sent to a vramgate (cmd/vramgate), the proxy that listens at
// Ollama's address in front of it: the gate answers the unload request
// only once it verified the unload itself, with the runner check of the
// server behind it, and says so in a "vramgate" object of its reply and an
// X-Vramgate-Unload header. The client cannot see those runners (nothing
// that listens at its address is `ollama serve`), so the gate's answer is
// what its own runner check would have been; without it the verdict rests
// on /api/ps, and the report says the gate made no runner check.

// gateSaid is what a vramgate said of one unload request.
type gateSaid uint8

const (
	gateNone      gateSaid = iota // no vramgate answered: Ollama itself, or a caller's api.Client (whose replies keep nothing of the gate's)
	gateRunners                   // verified, with the gate's runner check
	gateNoRunners                 // a vramgate answered, but without a runner check it made (why says what it said)
)

// gateAnswer is a vramgate's answer to one unload request, as the report
// needs it.
type gateAnswer struct {
	said       gateSaid
	by         string // "vramgate at <address>", and where the gate's own runner check came from when not from itself
	why        string // gateNoRunners: UnloadReport.NoRunnerCheck
	runnerSeen bool   // gateRunners: the gate saw a runner while /api/ps did not list the model
}

// readGateAnswer judges what a vramgate at addr said of the unload of
// model: its runner check counts only from a well-formed answer that names
// this model, says verified, and lists the runner check among its checks.
func readGateAnswer(g wire.GateUnload, model, addr string) gateAnswer {
	if !g.Said {
		return gateAnswer{}
	}
	a := gateAnswer{said: gateNoRunners, by: "vramgate at " + addr}
	switch {
	case !g.Object:
		a.why = fmt.Sprintf("%s answered the unload without a readable vramgate object (%s: %q)", a.by, wire.GateHeader, g.Header)
	case g.Model != "" && NormalizeModelName(g.Model) != NormalizeModelName(model):
		a.why = fmt.Sprintf("%s answered the unload of %q for model %q", a.by, model, g.Model)
	case !g.Verified:
		a.why = fmt.Sprintf("%s did not verify the unload (%s: %q)", a.by, wire.GateHeader, g.Header)
	case parseChecks(g.Checked)&CheckRunnerProcesses == 0:
		why := g.NoRunnerCheck
		if why == "" {
			why = fmt.Sprintf("its answer names none (checked %q)", g.Checked)
		}
		a.why = a.by + " made no runner check: " + why
	default:
		a.said, a.runnerSeen = gateRunners, g.RunnerSeen
		if g.RunnerCheckBy != "" {
			a.by += ", which took it from " + g.RunnerCheckBy
		}
	}
	return a
}

// parseChecks reads Checks.String's form back; names it does not know
// add nothing.
func parseChecks(s string) Checks {
	var c Checks
	for name := range strings.SplitSeq(s, "+") {
		switch strings.TrimSpace(name) {
		case "ps":
			c |= CheckPS
		case "runner-processes":
			c |= CheckRunnerProcesses
		case "device-memory":
			c |= CheckDeviceMemory
		case "settled":
			c |= CheckSettled
		}
	}
	return c
}
