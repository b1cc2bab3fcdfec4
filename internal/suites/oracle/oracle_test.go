package oracle_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/suites/oracle"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"go.uber.org/goleak"
)

var (
	flagSeed    = flag.Uint64("oracle.seed", 0, "replay this seed only (with -oracle.n 1), or start the sweep here; 0 draws a fresh base seed (printed)")
	flagN       = flag.Int("oracle.n", 0, "schedules per version; 0: as many as -oracle.budget allows")
	flagBudget  = flag.Duration("oracle.budget", 25*time.Second, "wall time per version for the sweep (versions run side by side)")
	flagSim     = flag.Bool("oracle.sim", true, "also play every schedule on the simulator configured as the version, and compare")
	flagServers = flag.Int("oracle.servers", 1, "servers per version, each with its own sweep and seeds (the long run)")
	flagFirst   = flag.Bool("oracle.failfast", false, "end a version's sweep at its first violation (the mutation check)")
	flagReport  = flag.String("oracle.report", "", "append one JSON line per version with the sweep's figures to this file")
)

// envChild makes the test binary a child process: a second program using
// vramguard (OpChild). Its value is host|model|tokens.
const envChild = "VRAMGUARD_ORACLE_CHILD"

func TestMain(m *testing.M) {
	if v := os.Getenv(envChild); v != "" {
		os.Exit(child(v))
	}
	goleak.VerifyTestMain(m)
}

// child runs one guarded generation and prints its verdicts and outcome.
func child(arg string) int {
	parts := strings.Split(arg, "|")
	if len(parts) != 3 {
		fmt.Fprintf(os.Stderr, "oracle child: bad %s=%q\n", envChild, arg)
		return 2
	}
	tokens, _ := strconv.Atoi(parts[2])
	var mu sync.Mutex
	var line oracle.ChildLine
	rt, sends := oracle.ChildTransport(http.DefaultTransport.(*http.Transport).Clone())
	c, err := vramguard.NewClient(vramguard.Options{
		Host:          parts[0],
		PollInterval:  25 * time.Millisecond,
		UnloadTimeout: 10 * time.Second,
		Timeouts:      vramguard.Timeouts{FirstChunk: 15 * time.Second, Total: 20 * time.Second},
		HTTPClient:    &http.Client{Transport: rt},
		Hooks: vramguard.Hooks{OnUnloadEnd: func(_ context.Context, e vramguard.UnloadEnd) {
			r := e.Report
			if e.Err != nil || !r.Verified {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			line.Verdicts = append(line.Verdicts, oracle.Verdict{T: time.Now(), Model: oracle.Group(r.Model), Checked: r.Checked, NoRunnerCheck: r.NoRunnerCheck,
				Elapsed: r.Elapsed, Attempts: r.Attempts})
		}},
	})
	if err == nil {
		g := vramguard.Guard{Client: c}
		_, err = g.Generate(context.Background(), &vramguard.GenerateRequest{Model: parts[1], Prompt: "a castle at dawn",
			Options: map[string]any{"num_predict": tokens, "seed": 1}}, nil)
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		line.Err, line.Kind = err.Error(), vramguard.KindOf(err).String()
	}
	mu.Lock()
	line.Sends = sends()
	b, _ := json.Marshal(line)
	mu.Unlock()
	fmt.Printf("oracle-child: %s\n", b)
	return 0
}

func childCmd(ctx context.Context, host, model string, tokens int) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=http://%s|%s|%d", envChild, host, model, tokens))
	return cmd
}

// sweep is the figures of one version's run.
type sweep struct {
	Version    string         `json:"version"`
	Seeds      []uint64       `json:"-"`
	Schedules  int            `json:"schedules"`
	Steps      int            `json:"steps"`
	Checks     int            `json:"checks"`
	Violations map[string]int `json:"violations"`
	Known      map[string]int `json:"known_server_behaviour"`
	SimViol    map[string]int `json:"sim_violations"`
	SimDiffs   map[string]int `json:"sim_differences"`
	Crashes    int            `json:"server_crashes"`
	Wedged     int            `json:"server_wedged"`
	Elapsed    string         `json:"elapsed"`
	BaseSeed   uint64         `json:"base_seed"`
}

// TestOracle plays random schedules against every server version (side
// by side, a server each) and the simulator configured as it, and holds
// every trace to the guarantees (oracle.Check). A violation fails the test
// with its seed and schedule; replay it with
// `make oracle SEED=<seed> VERSIONS=<version>`.
func TestOracle(t *testing.T) {
	base, fresh := *flagSeed, *flagSeed == 0
	if fresh {
		base = rand.Uint64() >> 16
	}
	t.Logf("oracle: base seed %d (replay one schedule with make oracle SEED=<seed> VERSIONS=<version>)", base)
	for _, v := range ollamatest.Versions() {
		for k := range max(*flagServers, 1) {
			name := "ollama-" + v
			if *flagServers > 1 {
				name += fmt.Sprintf("/server-%d", k)
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := ollamatest.Require(t, v)
				tgt, err := oracle.NewReal(t.Context(), s)
				if err != nil {
					t.Fatal(err)
				}
				// Fresh seeds differ per version, so that a sweep covers
				// more; a given seed is played as it is on each. Each
				// server of a version starts a million seeds further.
				vbase := base + uint64(k)*1_000_000
				if fresh {
					for _, c := range v {
						vbase = vbase*31 + uint64(c)
					}
					vbase = vbase&(1<<48-1) + uint64(k)*1_000_000
				}
				sw := runSweep(t, tgt, v, vbase)
				if *flagReport != "" {
					b, _ := json.Marshal(sw)
					f, err := os.OpenFile(*flagReport, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
					if err == nil {
						fmt.Fprintf(f, "%s\n", b)
						f.Close()
					}
				}
			})
		}
	}
}

func runSweep(t *testing.T, tgt *oracle.Real, version string, base uint64) sweep {
	start := time.Now()
	sw := sweep{Version: version, BaseSeed: base, Violations: map[string]int{}, Known: map[string]int{}, SimViol: map[string]int{}, SimDiffs: map[string]int{}}
	var simT *oracle.Sim
	if *flagSim {
		simT = oracle.NewSim(version, tgt.LoadTime(), tgt.Profile())
		defer simT.S.Close()
	}
	for i := 0; ; i++ {
		if *flagN > 0 && i >= *flagN || *flagN == 0 && time.Since(start) > *flagBudget {
			break
		}
		seed := base + uint64(i)
		sched := oracle.Generate(seed, tgt.Profile())
		var realTr, simTr *oracle.Trace
		var realV, simV []oracle.Violation
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			realTr, realV = play(t, tgt, sched, fmt.Sprintf("%s/%d", version, seed))
		}()
		if simT != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				simTr, simV = play(t, simT, sched, fmt.Sprintf("sim-%s/%d", version, seed))
			}()
		}
		wg.Wait()
		if !tgt.Alive() {
			// The server died under the oracle's polling: its known
			// /api/ps race, not the library's doing.
			sw.Crashes++
			t.Logf("oracle: ollama %s crashed during seed %d (its /api/ps race, README); schedule discarded, server restarted; log:\n%s",
				version, seed, tgt.S.LogTail(1500))
			if err := tgt.S.Restart(t.Context()); err != nil {
				t.Fatalf("restart after the crash: %v", err)
			}
			continue
		}
		if wedged(realV) {
			// The server stopped answering (v0.6.5 after canceled loads):
			// counted as the server's, and the server restarted so that
			// the sweep goes on. A schedule that found it so at its start
			// is discarded.
			sw.Wedged++
			t.Logf("oracle: ollama %s stopped answering during seed %d; server restarted", version, seed)
			if err := tgt.S.Restart(t.Context()); err != nil {
				t.Fatalf("restart the wedged server: %v", err)
			}
			if slices.ContainsFunc(realV, func(v oracle.Violation) bool { return v.Rule == oracle.RuleHarness }) {
				continue
			}
		}
		sw.Seeds = append(sw.Seeds, seed)
		sw.Schedules++
		for _, r := range sched.Rounds {
			sw.Steps += len(r)
		}
		sw.Checks += checksOf(realTr)
		var failed []oracle.Violation
		for _, v := range realV {
			if v.Known != "" {
				sw.Known[v.Rule]++
				t.Logf("oracle: ollama %s, seed %d: %s (known, the server's: %s)", version, seed, v, v.Known)
				continue
			}
			sw.Violations[v.Rule]++
			failed = append(failed, v)
		}
		realV = failed
		if len(realV) > 0 {
			t.Errorf("oracle: %d violations on ollama %s, seed %d, schedule %d of the sweep (replay: make oracle SEED=%d VERSIONS=%s)\n%s\n%s\ntrace:\n%s",
				len(realV), version, seed, i+1, seed, version, sched, violations(realV), oracle.Describe(realTr))
			if *flagFirst {
				break
			}
		}
		if simTr != nil {
			for _, v := range simV {
				sw.SimViol[v.Rule]++
				t.Logf("simulator as %s, seed %d: %s", version, seed, v)
			}
			for _, d := range oracle.Compare(realTr, simTr) {
				sw.SimDiffs[d]++
			}
		}
		if realTr != nil && realTr.Hung != "" || simTr != nil && simTr.Hung != "" {
			t.Errorf("oracle: seed %d hung on ollama %s or its simulator: the sweep ends here (a hung schedule leaves the server in an unknown state)", seed, version)
			break
		}
	}
	sw.Elapsed = time.Since(start).Round(time.Second).String()
	t.Logf("oracle %s: %d schedules, %d steps, %d checks in %s; seeds from %d; violations %v; known server behaviour %v; server crashes %d, wedged %d; simulator: violations %v, differences %s",
		version, sw.Schedules, sw.Steps, sw.Checks, sw.Elapsed, base, sw.Violations, sw.Known, sw.Crashes, sw.Wedged, sw.SimViol, mapString(sw.SimDiffs))
	return sw
}

// play runs one schedule on one target and checks it, goroutines
// included.
func play(t *testing.T, tgt oracle.Target, sched *oracle.Schedule, name string) (*oracle.Trace, []oracle.Violation) {
	var tr *oracle.Trace
	var err error
	oracle.Labeled(t.Context(), name, func(ctx context.Context) {
		tr, err = oracle.Play(ctx, tgt, sched, oracle.Config{Child: childCmd})
	})
	if err != nil {
		return tr, []oracle.Violation{{Rule: oracle.RuleHarness, Detail: err.Error()}}
	}
	_, local := tgt.(*oracle.Real)
	vs := oracle.Check(tr, oracle.Window(tgt, tr), local)
	if left := oracle.Leaked(name, 5*time.Second); left != "" {
		vs = append(vs, oracle.Violation{Rule: oracle.RuleGoroutines, Detail: left})
	}
	return tr, vs
}

// wedged reports whether vs say the server stopped answering: a model left
// by a server that no longer answered unloads, or a schedule that found
// the last one's models still there.
func wedged(vs []oracle.Violation) bool {
	return slices.ContainsFunc(vs, func(v oracle.Violation) bool {
		return v.Rule == oracle.RuleLeftResident && v.Known != "" ||
			v.Rule == oracle.RuleHarness && strings.Contains(v.Detail, "not empty at the start")
	})
}

func checksOf(tr *oracle.Trace) int {
	if tr == nil {
		return 0
	}
	// Each verdict is held against every look in its window; each result
	// to its kind, bound and completeness rules; the end to two.
	return len(tr.Verdicts)*(1+len(tr.Obs)) + 3*len(tr.Results) + 2
}

func violations(vs []oracle.Violation) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	return b.String()
}

func mapString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n    %4d  %s", m[k], k)
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// TestServerBehaviour measures, with a raw client, what each server does on
// its own in the races the library works around, and holds it to the
// README's compatibility table (the rows named below); the simulator
// configured as the version is measured too, and where it differs the
// test says so (RELIABILITY.md lists the known differences).
func TestServerBehaviour(t *testing.T) {
	table := readmeTable(t)
	rows := []struct {
		name string
		get  func(oracle.Behaviour) string
	}{
		{"bare unload sent during a load", func(b oracle.Behaviour) string { return b.UnloadDuringLoad }},
		{"`/api/ps` while a model loads", func(b oracle.Behaviour) string { return b.PSWhileLoading }},
		{"load whose request is canceled", func(b oracle.Behaviour) string { return b.CanceledLoad }},
	}
	for _, v := range ollamatest.Versions() {
		t.Run("ollama-"+v, func(t *testing.T) {
			t.Parallel()
			tgt, err := oracle.NewReal(t.Context(), ollamatest.Require(t, v))
			if err != nil {
				t.Fatal(err)
			}
			st := oracle.NewSim(v, tgt.LoadTime(), tgt.Profile())
			defer st.S.Close()
			// Each probe three times: a race's outcome can depend on
			// where in the load it lands.
			const tries = 3
			var real, simB []oracle.Behaviour
			for range tries {
				b, err := oracle.Probe(t.Context(), tgt)
				if err != nil {
					t.Fatal(err)
				}
				real = append(real, b)
				if b, err = oracle.Probe(t.Context(), st); err != nil {
					t.Fatal(err)
				}
				simB = append(simB, b)
			}
			for _, r := range rows {
				want, ok := table[r.name]["v"+v]
				got, sims := tally(real, r.get), tally(simB, r.get)
				switch {
				case !ok:
					t.Errorf("README's compatibility table has no %q cell for v%s (measured %v)", r.name, v, got)
				case got[want] == 0:
					t.Errorf("%s: %s on v%s: measured %v, README says %q", oracle.RuleBehaviourDiffer, r.name, v, got, want)
				case len(got) > 1:
					t.Logf("%s on v%s: mixed, %v (README: %q)", r.name, v, got, want)
				}
				if fmt.Sprint(sims) != fmt.Sprint(got) {
					t.Logf("simulator as v%s differs: %s: %v, the server: %v", v, r.name, sims, got)
				}
			}
			t.Logf("v%s: %+v; simulator: %+v", v, real, simB)
		})
	}
}

// tally counts the values get takes in bs.
func tally(bs []oracle.Behaviour, get func(oracle.Behaviour) string) map[string]int {
	m := map[string]int{}
	for _, b := range bs {
		m[get(b)]++
	}
	return m
}

// readmeTable reads the README's per-version compatibility table: row
// label -> "v0.6.5" -> cell.
func readmeTable(t *testing.T) map[string]map[string]string {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	var cols []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "|") {
			cols = nil
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if cols == nil {
			if len(cells) > 1 && strings.HasPrefix(cells[1], "v0.") {
				cols = cells
			}
			continue
		}
		row := map[string]string{}
		for i := 1; i < len(cells) && i < len(cols); i++ {
			row[cols[i]] = cells[i]
		}
		out[cells[0]] = row
	}
	return out
}
