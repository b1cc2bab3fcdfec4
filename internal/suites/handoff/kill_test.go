//go:build linux

package handoff_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

var (
	seedFlag  = flag.Int64("handoff.seed", 0, "replay the kill test's schedule of this seed (0: a fresh one, printed)")
	stepsFlag = flag.Int("handoff.steps", 300, "steps of the kill test's schedule")
)

const gib = 1 << 30

// The device is 24 GiB. The orchestrator's phase uses "phase" and hands
// 10 to 14 GiB over; the second program and the chat client load a, b
// and c. Loads that the schedule kills mid-flight use ka and kb alone: a
// request of a killed program may reach the server after the kill, and
// after a hand-over (a load admitted before the reservation was taken,
// which the reservation does not cover: OllamaClient.Reserve); such a
// load is told apart by its model.
var models = []vramguardtest.ModelConfig{
	{Name: "phase", SizeVRAM: 10 * gib, LoadLatency: 30 * time.Millisecond},
	{Name: "a", SizeVRAM: 4 * gib, LoadLatency: 30 * time.Millisecond},
	{Name: "b", SizeVRAM: 6 * gib, LoadLatency: 30 * time.Millisecond},
	{Name: "c", SizeVRAM: 8 * gib, LoadLatency: 30 * time.Millisecond},
	{Name: "ka", SizeVRAM: 4 * gib, LoadLatency: 60 * time.Millisecond},
	{Name: "kb", SizeVRAM: 6 * gib, LoadLatency: 60 * time.Millisecond},
}

// proc is a program the test started: the orchestrator, the second
// program or the gate, in a process group of its own (the gate's fake
// nvidia-smi runs die with it). Lines "@ ..." on its stdout are answers;
// the others are kept as its log.
type proc struct {
	name    string
	cmd     *exec.Cmd
	in      io.WriteCloser // nil for the gate
	answers chan string    // closed when its output ends
	first   chan string    // the gate's first line
	done    chan struct{}  // its output ended
	mu      sync.Mutex
	log     []string
	reaped  bool
}

func startProc(t *testing.T, name string, cmd *exec.Cmd, protocol bool) *proc {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{name: name, cmd: cmd, answers: make(chan string, 64), first: make(chan string, 1), done: make(chan struct{})}
	if protocol {
		if p.in, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	go func() {
		defer close(p.done)
		defer r.Close()
		defer close(p.answers)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		firstSent := false
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, "@ "); ok && protocol {
				p.answers <- a
				continue
			}
			if !firstSent && strings.HasPrefix(line, "vramgate: http") {
				p.first <- line
				firstSent = true
			}
			p.mu.Lock()
			p.log = append(p.log, line)
			if len(p.log) > 400 {
				p.log = p.log[1:]
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		p.kill()
		if l := p.logText(); strings.Contains(l, "DATA RACE") || strings.Contains(l, "panic:") {
			t.Errorf("%s (pid %d) reported:\n%s", name, cmd.Process.Pid, l)
		} else if t.Failed() {
			t.Logf("%s (pid %d) log:\n%s", name, cmd.Process.Pid, l)
		}
	})
	return p
}

// kill sends SIGKILL to the program's process group and reaps it; it
// returns once the program is gone and its output closed.
func (p *proc) kill() {
	if p.reaped {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	_ = p.cmd.Wait()
	p.reaped = true
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log, "\n")
}

// ask sends a command and returns its answer; "" when the program died
// first. It may run on a goroutine of its own.
func (p *proc) ask(t *testing.T, cmd string) string {
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		return ""
	}
	select {
	case a, ok := <-p.answers:
		if !ok {
			return ""
		}
		return a
	case <-time.After(2 * time.Minute): // a hang guard, not a figure
		t.Errorf("%s did not answer %q in 2 minutes:\n%s", p.name, cmd, p.logText())
		return "hung"
	}
}

// figures are what a run did, reported at its end.
type figures struct {
	steps, reservations, handoverRefused, renders, probes, excused, released int
	kills                                                                    map[string]int
	admitted, refused, refusedNaming, other                                  map[string]int
}

// world is one run: the simulator and its device, the lease directory,
// the three programs and the conductor's own client.
type world struct {
	t                    *testing.T
	seed                 int64
	rng                  *rand.Rand
	s                    *vramguardtest.Server
	gpuURL, dir, gateBin string
	smiDir               string
	observer             *vramguard.OllamaClient
	hc                   *http.Client
	orch, second, gate   *proc
	gateURL              string
	resv                 uint64    // the orchestrator's reservation, 0 when none stands
	resvH0               time.Time // when the hand-over that took it was asked for
	f                    figures
	tags                 int
}

// Three processes on one simulated GPU, SIGKILLed at random points
// (issue 45): an orchestrator whose phases hand rooms over for a render,
// reserved; a second vramguard program whose budget loads models; the real
// vramgate binary, reading the same device, with a chat client loading
// through it. A seeded schedule of steps hands over, renders, releases,
// loads (one at a time while a reservation stands; two programs at once
// otherwise), and kills one program (idle or mid-request), then restarts
// it. After every step:
//
//   - the reservation: while its holder lives and has not released it,
//     the conductor's client (and the gate, when it lives) sees it whole;
//     once the holder is killed and reaped, or has released it, nobody
//     sees it at the next reading (no wait);
//   - the render: while the reservation stands, after every step (and as
//     a step of its own, the render's) its whole room is allocated on the
//     simulator (Server.Reserve, whose ledger is the device) and freed.
//     With loads one at a time after the reservation was taken, each
//     admission (the second program's budget, the gate's) saw it and
//     admitted the load only if it fits beside what is reserved, and
//     unloads only free memory, so the allocation must succeed. The one
//     allowed exception (a load admitted before the reservation was
//     taken, landing after: OllamaClient.Reserve's doc) can only be a
//     request of a program killed mid-load, which the schedule sends for
//     ka and kb alone: a failed allocation is excused when one of them
//     arrived or loaded after the hand-over began, and is a violation
//     otherwise;
//   - refusals: one for want of memory while the reservation stands names
//     it (the second program's *RoomError, the gate's 503).
//
// Every failure names the seed; -v prints the figures.
// -handoff.seed replays a schedule (the interleaving of the processes
// varies; the steps do not).
func TestKillAtRandomPoints(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (replay: go test -race -run TestKillAtRandomPoints ./internal/suites/handoff -handoff.seed %d)", seed, seed)
	start := time.Now()
	w := newWorld(t, seed)
	for w.f.steps = 0; w.f.steps < *stepsFlag && !t.Failed(); w.f.steps++ {
		w.step()
		w.checkReservation("after the step")
		if w.resv != 0 {
			w.allocate(false) // the render's room is there at every step
		}
	}
	w.t.Logf("seed %d: %d steps in %v: %d reservations taken (%d hand-overs refused), %d renders and %d probes allocated the room whole, %d excused, %d released; kills %v; admitted %v, refused %v (naming the reservation %v), other answers %v",
		seed, w.f.steps, time.Since(start).Round(time.Millisecond), w.f.reservations, w.f.handoverRefused, w.f.renders, w.f.probes, w.f.excused, w.f.released,
		w.f.kills, w.f.admitted, w.f.refused, w.f.refusedNaming, w.f.other)
	if w.f.reservations == 0 || w.f.renders == 0 {
		t.Errorf("seed %d: the schedule took %d reservations and allocated %d renders: it tested nothing", seed, w.f.reservations, w.f.renders)
	}
}

func newWorld(t *testing.T, seed int64) *world {
	w := &world{t: t, seed: seed, rng: rand.New(rand.NewSource(seed))}
	w.f.kills = map[string]int{}
	w.f.admitted, w.f.refused, w.f.refusedNaming, w.f.other = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	w.s = vramguardtest.New(vramguardtest.Config{Models: models, StrictVRAM: true, UnloadDelay: -1})
	t.Cleanup(w.s.Close)
	dev := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		snap, err := w.s.GPU().Snapshot(r.Context())
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(rw).Encode(snap)
	}))
	t.Cleanup(dev.Close)
	w.gpuURL = dev.URL
	w.dir = filepath.Join(t.TempDir(), "leases")
	if err := os.Mkdir(w.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// Without cgo the gate has no NVML: its reader is the nvidia-smi it
	// finds first on its PATH, testdata/fakesmi.
	w.gateBin = filepath.Join(tmp, "vramgate")
	w.smiDir = filepath.Join(tmp, "bin")
	for _, b := range []struct{ out, pkg string }{
		{w.gateBin, "github.com/vramguard/vramguard/cmd/vramgate"},
		{filepath.Join(w.smiDir, "nvidia-smi"), "./testdata/fakesmi"},
	} {
		build := exec.CommandContext(t.Context(), "go", "build", "-o", b.out, b.pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	w.hc = &http.Client{Transport: tr}
	var err error
	w.observer, err = vramguard.NewClient(vramguard.Options{Host: w.s.URL().String(), VRAM: w.s.GPU(), Leases: vramguard.LeaseOptions{Dir: w.dir},
		HTTPClient: w.hc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.observer.Close() })
	w.orch = w.startChild("orchestrator")
	w.second = w.startChild("second")
	w.startGate()
	return w
}

func (w *world) startChild(role string) *proc {
	// Each run of the second program draws its budget's MakeRoom.
	spec, _ := json.Marshal(childSpec{Host: w.s.URL().String(), GPU: w.gpuURL, Dir: w.dir, MakeRoom: role == "second" && w.rng.Intn(2) == 0})
	self, err := os.Executable()
	if err != nil {
		w.t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+role, specEnv+"="+string(spec))
	p := startProc(w.t, role, cmd, true)
	select {
	case a := <-p.answers:
		if a != "ready" {
			w.t.Fatalf("%s: %q\n%s", role, a, p.logText())
		}
	case <-time.After(2 * time.Minute): // a hang guard
		w.t.Fatalf("%s did not start in 2 minutes:\n%s", role, p.logText())
	}
	return p
}

var gateLine = regexp.MustCompile(`^vramgate: (http://127\.0\.0\.1:\d+) -> `)

func (w *world) startGate() {
	cmd := exec.Command(w.gateBin, "-listen", "127.0.0.1:0", "-ollama", w.s.URL().String(), "-lease-dir", w.dir, "-retry-after", "1s")
	cmd.Env = append(os.Environ(), "PATH="+w.smiDir+string(os.PathListSeparator)+os.Getenv("PATH"), smiEnv+"="+w.gpuURL)
	p := startProc(w.t, "vramgate", cmd, false)
	var line string
	select {
	case line = <-p.first:
	case <-p.done:
		w.t.Fatalf("vramgate exited before it listened:\n%s", p.logText())
	case <-time.After(2 * time.Minute): // a hang guard
		w.t.Fatalf("vramgate printed no line in 2 minutes:\n%s", p.logText())
	}
	m := gateLine.FindStringSubmatch(line)
	if m == nil {
		w.t.Fatalf("vramgate's first line %q", line)
	}
	if l := p.logText(); strings.Contains(l, "no GPU reader") {
		w.t.Fatalf("vramgate has no GPU reader: the fake nvidia-smi failed:\n%s", l)
	}
	w.gate, w.gateURL = p, m[1]
}

// tag names one request: its prompt.
func (w *world) tag() string {
	w.tags++
	return fmt.Sprintf("op-%d", w.tags)
}

// op is one load through the second program or the gate; its prompt is
// its tag.
type op struct {
	who, model, tag string
	keepMS          int
}

// run runs o and returns its answer. It may run on a goroutine of its
// own: it changes nothing of w.
func (w *world) run(o op) string {
	if o.who == "second" {
		return w.second.ask(w.t, fmt.Sprintf("load %s %s %d", o.model, o.tag, o.keepMS))
	}
	return w.chat(o.model, o.tag, o.keepMS)
}

func (w *world) count(who, ans string) {
	switch {
	case ans == "admitted":
		w.f.admitted[who]++
	case strings.HasPrefix(ans, "refused"):
		w.f.refused[who]++
		naming := who == "second" && ans != "refused 0" || who == "vramgate" && strings.Contains(ans, " for render, until ")
		if naming {
			w.f.refusedNaming[who]++
		}
		// A refusal for want of memory while the reservation stands names
		// it: the second program's *RoomError in Reserved, the gate's 503
		// as a blocker.
		if w.resv != 0 && !naming && (who == "second" || strings.Contains(ans, `"reason":"no room"`)) {
			w.t.Errorf("seed %d step %d: %s refused a load without naming the reservation that stands: %s", w.seed, w.f.steps, who, ans)
		}
	case strings.HasPrefix(ans, "hung"):
		w.t.Errorf("seed %d step %d: %s %s", w.seed, w.f.steps, who, ans)
	default:
		w.f.other[who]++
		w.t.Logf("seed %d step %d: %s answered %q", w.seed, w.f.steps, who, ans)
	}
}

// chat sends one generate through the gate, as a chat UI would, and says
// how it went: admitted, refused BODY (503), or what else came back.
func (w *world) chat(model, tag string, keepMS int) string {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":false,"keep_alive":"%dms"}`, model, tag, keepMS)
	ctx, cancel := context.WithTimeout(w.t.Context(), time.Minute) // a hang guard, not a figure
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, "POST", w.gateURL+"/api/generate", strings.NewReader(body))
	if err != nil {
		return "gone " + err.Error()
	}
	resp, err := w.hc.Do(r)
	if ctx.Err() != nil {
		return fmt.Sprintf("hung: no answer in a minute; runners %+v; the gate's goroutines:\n%s", w.s.Running(), w.dumpGate())
	}
	if err != nil {
		return "gone " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		return "admitted"
	case http.StatusServiceUnavailable:
		return "refused " + string(b)
	}
	return fmt.Sprintf("status %d %s", resp.StatusCode, b)
}

// step runs one step of the schedule.
func (w *world) step() {
	r := w.rng.Intn(100)
	switch {
	case w.resv == 0 && r < 25:
		w.handover()
	case w.resv != 0 && r < 20:
		w.render()
	case w.resv != 0 && r < 27:
		w.release()
	case r < 40:
		w.killIdle([]string{"orchestrator", "second", "vramgate"}[w.rng.Intn(3)])
	case r < 55:
		w.killMidLoad([]string{"second", "vramgate"}[w.rng.Intn(2)])
	case w.resv == 0 && r < 70:
		// Two programs at once: only while nothing is reserved.
		ops := []op{w.randomOp("second"), w.randomOp("vramgate")}
		ans := make([]string, len(ops))
		var wg sync.WaitGroup
		for i, o := range ops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ans[i] = w.run(o)
			}()
		}
		wg.Wait()
		for i, o := range ops {
			w.count(o.who, ans[i])
		}
	default:
		o := w.randomOp([]string{"second", "vramgate"}[w.rng.Intn(2)])
		w.count(o.who, w.run(o))
	}
}

func (w *world) randomOp(who string) op {
	return op{who: who, model: []string{"a", "b", "c"}[w.rng.Intn(3)], tag: w.tag(), keepMS: []int{0, 500, 60000, 60000}[w.rng.Intn(4)]}
}

// handover asks the orchestrator for a hand-over of 10 to 14 GiB; one in
// six is killed mid-way.
func (w *world) handover() {
	n := uint64(10+2*w.rng.Intn(3)) * gib
	h0 := time.Now()
	if w.rng.Intn(6) == 0 {
		delay := time.Duration(w.rng.Intn(150)) * time.Millisecond
		ans := make(chan string, 1)
		go func() { ans <- w.orch.ask(w.t, fmt.Sprintf("handover %d", n)) }()
		time.Sleep(delay)
		w.orch.kill()
		<-ans
		w.f.kills["orchestrator mid-hand-over"]++
		w.checkReservation("after the orchestrator was killed mid-hand-over")
		w.orch = w.startChild("orchestrator")
		return
	}
	ans := w.orch.ask(w.t, fmt.Sprintf("handover %d", n))
	switch {
	case ans == fmt.Sprintf("reserved %d", n):
		w.resv, w.resvH0 = n, h0
		w.f.reservations++
	case strings.HasPrefix(ans, "refused"):
		w.f.handoverRefused++
	default:
		w.t.Errorf("seed %d step %d: hand-over of %d GiB: %q", w.seed, w.f.steps, n/gib, ans)
	}
}

// render allocates the reservation's whole room, as the render would;
// half the time the orchestrator then releases the reservation.
func (w *world) render() {
	w.allocate(true)
	if w.rng.Intn(2) == 0 {
		w.release()
	}
}

// allocate takes the reservation's whole room on the simulator (whose
// ledger is the device), as the render would, and frees it again; render
// says whether it is the render's step or the probe after a step.
func (w *world) allocate(render bool) {
	err := w.s.Reserve("render", w.resv)
	switch {
	case err == nil:
		w.s.Release("render")
		if render {
			w.f.renders++
		} else {
			w.f.probes++
		}
	case w.excused():
		w.f.excused++
		w.t.Logf("seed %d step %d: the render's %d GiB did not fit (%v), excused: a load of a program killed mid-load reached the server after the hand-over began",
			w.seed, w.f.steps, w.resv/gib, err)
	default:
		w.t.Errorf("seed %d step %d: VIOLATION: the render could not allocate the %d GiB reserved for it while its holder lives: %v; runners %+v, holders %+v",
			w.seed, w.f.steps, w.resv/gib, err, w.s.Running(), w.s.Holders())
	}
}

// excused says whether a request of a killed program (ka, kb) reached the
// server, or its load ended, after the current reservation's hand-over
// began.
func (w *world) excused() bool {
	for _, m := range []string{"ka", "kb"} {
		for _, e := range w.s.Events(m) {
			if (e.Kind == vramguardtest.EventRequest || e.Kind == vramguardtest.EventLoaded) && e.At.After(w.resvH0) {
				return true
			}
		}
	}
	return false
}

func (w *world) release() {
	if ans := w.orch.ask(w.t, "release"); ans != "released" {
		w.t.Errorf("seed %d step %d: release: %q", w.seed, w.f.steps, ans)
	}
	w.resv = 0
	w.f.released++
	w.checkReservation("after its release")
}

// killIdle kills an idle program and starts it again; the orchestrator's
// reservation, when it holds one, must end at once.
func (w *world) killIdle(who string) {
	w.f.kills[who]++
	switch who {
	case "orchestrator":
		w.orch.kill()
		held := w.resv != 0
		w.resv = 0
		w.checkReservation(fmt.Sprintf("after its holder was killed (it held one: %v)", held))
		w.orch = w.startChild("orchestrator")
	case "second":
		w.second.kill()
		w.checkReservation("after the second program was killed")
		w.second = w.startChild("second")
	case "vramgate":
		w.gate.kill()
		w.checkReservation("after the gate was killed")
		w.startGate()
	}
}

// killMidLoad starts a load of ka or kb through who and kills who 0 to
// 100 ms later, then starts it again.
func (w *world) killMidLoad(who string) {
	o := op{who: who, model: []string{"ka", "kb"}[w.rng.Intn(2)], tag: w.tag(), keepMS: []int{200, 60000}[w.rng.Intn(2)]}
	delay := time.Duration(w.rng.Intn(100)) * time.Millisecond
	ans := make(chan string, 1)
	p := w.second
	if who == "vramgate" {
		p = w.gate
	}
	go func() { ans <- w.run(o) }()
	time.Sleep(delay)
	p.kill()
	if a := <-ans; a == "admitted" || strings.HasPrefix(a, "refused") {
		w.count(who, a) // answered before the kill
	}
	w.f.kills[who+" mid-load"]++
	w.checkReservation("after " + who + " was killed mid-load")
	if who == "second" {
		w.second = w.startChild("second")
	} else {
		w.startGate()
	}
}

// dumpGate ends a hung gate with SIGQUIT and returns its log, which ends
// with its goroutines.
func (w *world) dumpGate() string {
	_ = syscall.Kill(w.gate.cmd.Process.Pid, syscall.SIGQUIT)
	select {
	case <-w.gate.done:
	case <-time.After(10 * time.Second):
	}
	w.gate.kill()
	return w.gate.logText()
}

// checkReservation reads the device as every vramguard client on the host
// sees it (the conductor's client; the gate's listing): the orchestrator's
// reservation whole while it stands, none once it ended.
func (w *world) checkReservation(when string) {
	w.t.Helper()
	var reserved []vramguard.LeaseInfo
	rep, err := w.observer.EnsureFree(w.t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true})
	var re *vramguard.RoomError
	switch {
	case err == nil:
		reserved = rep.Snapshot.Device(0).Reserved
	case errors.As(err, &re):
		reserved = re.Reserved
	default:
		w.t.Fatalf("seed %d step %d: reading the device: %v", w.seed, w.f.steps, err)
	}
	want := 0
	if w.resv != 0 {
		want = 1
	}
	if len(reserved) != want || want == 1 && (reserved[0].Bytes != w.resv || reserved[0].Taken != 0 || reserved[0].For != "render") {
		w.t.Errorf("seed %d step %d, %s: the device shows reservations %+v; want %d of %d GiB for the render", w.seed, w.f.steps, when, reserved, want, w.resv/gib)
	}
	if w.gate == nil || w.gate.reaped {
		return
	}
	ctx, cancel := context.WithTimeout(w.t.Context(), time.Minute) // a hang guard, not a figure
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, "GET", w.gateURL+"/vramgate/reservations", nil)
	if err != nil {
		w.t.Fatal(err)
	}
	resp, err := w.hc.Do(r)
	if ctx.Err() != nil {
		w.t.Errorf("seed %d step %d: GET /vramgate/reservations: no answer in a minute; the gate's goroutines:\n%s", w.seed, w.f.steps, w.dumpGate())
		return
	}
	if err != nil {
		w.t.Errorf("seed %d step %d: GET /vramgate/reservations: %v", w.seed, w.f.steps, err)
		return
	}
	defer resp.Body.Close()
	var list struct {
		Reservations []struct {
			Bytes uint64 `json:"bytes"`
			For   string `json:"for"`
		} `json:"reservations"`
		NotChecked []string `json:"not_checked"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.NotChecked) != 0 ||
		len(list.Reservations) != want || want == 1 && list.Reservations[0].Bytes != w.resv {
		w.t.Errorf("seed %d step %d, %s: the gate lists %+v (err %v); want %d of %d GiB for the render", w.seed, w.f.steps, when, list, err, want, w.resv/gib)
	}
}
