package oracle

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Op is what one action of a schedule does.
type Op string

// The actions. "Own" ones go through the vramguard client under test;
// "foreign" ones are other programs sharing the server.
const (
	OpGenerate     Op = "generate"      // own: GenerateStreaming, no guard
	OpGuard        Op = "guard"         // own: Guard.Generate, cleanup after use
	OpGuardAsync   Op = "guard-async"   // own: Guard{Async}.Generate, joined by Wait
	OpGuardChat    Op = "guard-chat"    // own: Guard.Chat
	OpPhase        Op = "phase"         // own: StartPhase, Steps guarded steps, End
	OpUnload       Op = "unload"        // own: UnloadModel
	OpUnloadAll    Op = "unload-all"    // own: UnloadAll
	OpEnsureFree   Op = "ensure-free"   // own: EnsureFree{AllModels}
	OpCleanup      Op = "cleanup"       // own: Cleanup{Models}
	OpCleanupAsync Op = "cleanup-async" // own: CleanupAsync{AllModels}, then Wait
	OpClose        Op = "close"         // own: Close (or Shutdown); later rounds use a new client
	OpForeign      Op = "foreign"       // foreign: a raw api client generation
	OpForeignStop  Op = "foreign-stop"  // foreign: a raw unload, as `ollama stop` sends it
	OpCLI          Op = "cli"           // foreign: `ollama run` (a raw generation on the simulator)
	OpChild        Op = "child"         // foreign: a second process using vramguard (a guarded generation)
	OpKillRunner   Op = "kill-runner"   // chaos: SIGKILL the model's runner
	OpFault        Op = "fault"         // chaos: the stand-in's knobs (or a simulator fault) for this round
	OpRestart      Op = "restart"       // chaos: the server restarts (stopped with its runners, started again)
)

// loads reports whether op sends requests that can load a model.
func (op Op) loads() bool {
	switch op {
	case OpGenerate, OpGuard, OpGuardAsync, OpGuardChat, OpPhase, OpForeign, OpCLI, OpChild:
		return true
	}
	return false
}

// own reports whether op is a call of the client under test.
func (op Op) own() bool {
	switch op {
	case OpForeign, OpForeignStop, OpCLI, OpChild, OpKillRunner, OpFault, OpRestart:
		return false
	}
	return true
}

// Fault is what an OpFault sets for the rest of its round.
type Fault string

// The faults: the stand-in's knobs on a server that runs it, the
// simulator's equivalent faults on the simulator.
const (
	FaultSlowLoad   Fault = "slow-load"   // loads take 600 ms (stand-in only)
	FaultCrashAfter Fault = "crash-after" // the runner dies after 3 tokens
	FaultOOM        Fault = "oom-at-load" // loads fail out of memory
	FaultHangLoad   Fault = "hang-load"   // loads never finish; calls carry a 1.5 s first-chunk timeout
)

// KeepAlive values a generation may send.
const (
	KAUnload  = "0s"      // unload when the request ends
	KAHour    = "1h"      // a keep-alive writer
	KAForever = "-1"      // keep forever
	KADefault = "default" // send none: the server's setting (5 m on a new load)
)

// Action is one call of a schedule.
type Action struct {
	Op    Op
	Model string        // the model it concerns ("" for all-model calls)
	At    time.Duration // start, from the round's start
	// KeepAlive is the keep-alive a generation sends (KA*).
	KeepAlive string
	// Tokens asks for that many tokens (num_predict).
	Tokens int
	// CancelAt, when positive, cancels the call's context that long
	// after it started.
	CancelAt time.Duration
	Steps    int   // OpPhase: guarded steps before End
	Shutdown bool  // OpClose: Shutdown instead of Close
	Fault    Fault // OpFault
}

func (a Action) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%v %s", a.At, a.Op)
	if a.Model != "" {
		fmt.Fprintf(&b, " %s", a.Model)
	}
	if a.KeepAlive != "" {
		fmt.Fprintf(&b, " ka=%s", a.KeepAlive)
	}
	if a.Tokens > 0 {
		fmt.Fprintf(&b, " n=%d", a.Tokens)
	}
	if a.CancelAt > 0 {
		fmt.Fprintf(&b, " cancel@%v", a.CancelAt)
	}
	if a.Steps > 0 {
		fmt.Fprintf(&b, " steps=%d", a.Steps)
	}
	if a.Shutdown {
		b.WriteString(" shutdown")
	}
	if a.Fault != "" {
		fmt.Fprintf(&b, " %s", a.Fault)
	}
	return b.String()
}

// Schedule is what one seed plays: rounds of actions that start at their
// offsets and run concurrently; a round ends when all its actions have.
type Schedule struct {
	Seed    uint64
	Profile Profile
	Rounds  [][]Action
}

func (s *Schedule) String() string {
	var b strings.Builder
	p := s.Profile
	fmt.Fprintf(&b, "seed %d (%s; cli %v, child %v, kill %v, faults %v)", s.Seed, p.Name, p.CLI, p.Child, p.Kill, p.Faults)
	for i, r := range s.Rounds {
		fmt.Fprintf(&b, "\n  round %d:", i+1)
		for _, a := range r {
			fmt.Fprintf(&b, "\n    %s", a)
		}
	}
	return b.String()
}

// Profile says what a target can do, so that the generator draws only
// actions it can play.
type Profile struct {
	Name string
	// CLI: the server's own `ollama run` binary is there.
	CLI bool
	// Child: a second process can be started (the test binary again).
	Child bool
	// Kill: runners can be killed and the server restarted (a real
	// server's processes, or the simulator's runners).
	Kill bool
	// Faults the target can inject.
	Faults []Fault
}

// The models every target has: ModelA and ModelB of different sizes, and
// ModelAShort, another name for ModelA's weights (so it shares ModelA's
// runner) with a token limit baked in for `ollama run`, which has no flag
// for one.
const (
	ModelA      = "tiny-a"
	ModelB      = "tiny-b"
	ModelAShort = "tiny-a-short"
)

// Generate draws the schedule of seed for a target with profile p. The
// same seed and profile give the same schedule.
func Generate(seed uint64, p Profile) *Schedule {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &Schedule{Seed: seed, Profile: p}
	type weighted struct {
		op Op
		w  int
	}
	ops := []weighted{
		{OpGenerate, 6}, {OpGuard, 10}, {OpGuardAsync, 4}, {OpGuardChat, 4}, {OpPhase, 6},
		{OpUnload, 10}, {OpUnloadAll, 4}, {OpEnsureFree, 3}, {OpCleanup, 3}, {OpCleanupAsync, 3}, {OpClose, 2},
		{OpForeign, 12}, {OpForeignStop, 4},
	}
	if p.CLI {
		ops = append(ops, weighted{OpCLI, 3})
	}
	if p.Child {
		ops = append(ops, weighted{OpChild, 3})
	}
	if p.Kill {
		ops = append(ops, weighted{OpKillRunner, 2}, weighted{OpRestart, 1})
	}
	if len(p.Faults) > 0 {
		ops = append(ops, weighted{OpFault, 3})
	}
	total := 0
	for _, o := range ops {
		total += o.w
	}
	pick := func() Op {
		n := r.IntN(total)
		for _, o := range ops {
			if n < o.w {
				return o.op
			}
			n -= o.w
		}
		panic("unreachable")
	}
	models := []string{ModelA, ModelA, ModelB}
	kas := []string{KAUnload, KAHour, KADefault, KADefault, KAForever}
	rounds := 2 + r.IntN(3)
	for range rounds {
		n := 1 + r.IntN(3)
		var round []Action
		faulted := false
		for range n {
			a := Action{Op: pick(), Model: models[r.IntN(len(models))]}
			// Offsets cluster in the first 400 ms, where a load (about
			// 300 ms on the real runners) races the others.
			a.At = time.Duration(r.IntN(400)) * time.Millisecond
			switch a.Op {
			case OpGenerate, OpForeign:
				a.KeepAlive = kas[r.IntN(len(kas))]
			case OpCLI:
				a.Model = ModelAShort
			case OpPhase:
				a.Steps = 1 + r.IntN(2)
			case OpUnloadAll, OpEnsureFree, OpCleanupAsync, OpClose, OpRestart:
				a.Model = ""
				a.Shutdown = a.Op == OpClose && r.IntN(2) == 0
			case OpFault:
				if faulted {
					a.Op, a.KeepAlive = OpForeign, KADefault
					break
				}
				faulted = true
				a.At = 0 // before the round's loads
				a.Model = ""
				a.Fault = p.Faults[r.IntN(len(p.Faults))]
			}
			if a.Op.loads() && a.Op != OpCLI {
				a.Tokens = 2 + r.IntN(12)
				if a.Op != OpPhase && a.Op != OpChild && r.IntN(4) == 0 {
					a.CancelAt = time.Duration(1+r.IntN(500)) * time.Millisecond
				}
			}
			round = append(round, a)
		}
		s.Rounds = append(s.Rounds, round)
	}
	return s
}
