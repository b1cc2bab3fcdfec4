package oracle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/procs"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Target is a server the oracle plays schedules against: a real Ollama
// (Real) or the simulator configured as one (Sim).
type Target interface {
	Name() string
	URL() *url.URL
	Profile() Profile
	// Observe looks at the server: /api/ps and the runners.
	Observe(ctx context.Context) Obs
	// KillRunner kills group's runner, if one runs; false if none did.
	KillRunner(group string) (bool, error)
	// Restart restarts the server: requests in flight fail, runners
	// end, the address stays.
	Restart(ctx context.Context) error
	// SetFault sets f for the next requests; ClearFault undoes it.
	SetFault(f Fault) error
	ClearFault() error
	// CLI runs `ollama run model` against host, reading prompt from
	// stdin, and returns its error. Targets without a CLI send the
	// same request a raw client would (the CLI uses /api/generate with
	// the server's default keep-alive).
	CLI(ctx context.Context, host, model string) error
	// LoadTime is how long a load takes on this target, measured once:
	// the watch windows are longer than the slowest load.
	LoadTime() time.Duration
}

// Real is a real Ollama server from ollamatest.
type Real struct {
	S     *ollamatest.Server
	blobs map[string]string // weights group -> "sha256:<hex>"
	bin   string            // the server's own binary, for the CLI
	load  time.Duration
	hc    *http.Client
}

// NewReal prepares s (models registered, ModelAShort created) as a
// target.
func NewReal(ctx context.Context, s *ollamatest.Server) (*Real, error) {
	if err := ollamatest.RegisterModels(ctx, s); err != nil {
		return nil, err
	}
	c := s.Client()
	if err := c.Create(ctx, &api.CreateRequest{Model: ModelAShort, From: ModelA,
		Parameters: map[string]any{"num_predict": 6, "seed": 7}}, func(api.ProgressResponse) error { return nil }); err != nil {
		return nil, fmt.Errorf("create %s: %w", ModelAShort, err)
	}
	r := &Real{S: s, blobs: map[string]string{}, hc: noKeepAlive()}
	for _, m := range []string{ModelA, ModelB} {
		blob, err := blobOf(ctx, s, m)
		if err != nil {
			return nil, err
		}
		r.blobs[m] = blob
	}
	if !s.External() {
		bin, _, err := ollamatest.Binary(ctx, s.Version(), nil)
		if err == nil {
			r.bin = bin
		}
	}
	// One load of each model, measured, then nothing resident.
	for _, m := range []string{ModelA, ModelB} {
		var load time.Duration
		stream := false
		err := c.Generate(ctx, &api.GenerateRequest{Model: m, Prompt: "x", Stream: &stream,
			KeepAlive: &api.Duration{Duration: 0}, Options: map[string]any{"num_predict": 1}},
			func(g api.GenerateResponse) error { load = max(load, g.LoadDuration); return nil })
		if err != nil {
			return nil, fmt.Errorf("first load of %s: %w", m, err)
		}
		r.load = max(r.load, load)
	}
	return r, waitEmpty(ctx, r, 20*time.Second)
}

// blobOf returns the weights blob of model as the library resolves it
// (OllamaClient.ModelBlob: the modelfile's FROM line).
func blobOf(ctx context.Context, s *ollamatest.Server, model string) (string, error) {
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), KeepModelsOnClose: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	blob, err := c.ModelBlob(ctx, model)
	if err == nil && blob == "" {
		err = fmt.Errorf("no weights blob in %s's modelfile", model)
	}
	return blob, err
}

func (r *Real) Name() string            { return "ollama-" + r.S.Version() }
func (r *Real) URL() *url.URL           { return r.S.URL() }
func (r *Real) LoadTime() time.Duration { return r.load }

func (r *Real) Profile() Profile {
	p := Profile{Name: r.Name(), CLI: r.bin != "", Child: true, Kill: !r.S.External()}
	if r.S.UsesStandin() {
		p.Faults = []Fault{FaultSlowLoad, FaultCrashAfter, FaultOOM, FaultHangLoad}
	}
	return p
}

func (r *Real) Observe(ctx context.Context) Obs {
	o := Obs{T0: time.Now(), Listed: map[string]bool{}, Runners: map[string]int{}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := api.NewClient(r.S.URL(), r.hc).ListRunning(ctx)
	if err != nil {
		o.Err = err.Error()
	} else {
		for _, m := range resp.Models {
			o.Listed[Group(m.Model)] = true
		}
	}
	// One scan of the process table for both models.
	rs, err := procs.Runners("")
	if err != nil {
		o.Err += "; runners: " + err.Error()
	}
	for _, p := range rs {
		if p.PPID != r.S.PID() {
			continue
		}
		for g, blob := range r.blobs {
			if p.Blob == blob {
				o.Runners[g]++
			}
		}
	}
	o.T1 = time.Now()
	return o
}

func (r *Real) KillRunner(group string) (bool, error) {
	rs, err := procs.RunnersFor("", r.blobs[group])
	if err != nil {
		return false, err
	}
	for _, p := range rs {
		if p.PPID == r.S.PID() {
			if err := r.S.KillRunner(p.PID); err != nil {
				// Gone by itself meanwhile (unloaded): nothing to kill.
				if !alive(p.PID) {
					return false, nil
				}
				return false, err
			}
			return true, nil
		}
	}
	return false, nil
}

// Alive reports whether the server process still runs: Ollama up to
// v0.32.3 can crash when /api/ps is read while a model is loaded or
// removed (README, known server issues), and the oracle reads it often.
func (r *Real) Alive() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.S.PID()))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func alive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// Restart restarts the server from a goroutine without the schedule's
// profiler label: the new serve process, and the harness goroutine that
// waits for it, belong to the sweep, not to the schedule that restarted it.
func (r *Real) Restart(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() {
		pprof.SetGoroutineLabels(context.Background())
		errc <- r.S.Restart(ctx)
	}()
	return <-errc
}

func (r *Real) SetFault(f Fault) error {
	var k standin.Knobs
	switch f {
	case FaultSlowLoad:
		k.LoadMS = 600
	case FaultCrashAfter:
		k.CrashAfterTokens = 3
	case FaultOOM:
		k.OOMAtLoad = true
	case FaultHangLoad:
		k.Hang = standin.HangLoad
	default:
		return fmt.Errorf("oracle: fault %q", f)
	}
	return r.S.SetRunnerKnobs(k)
}

func (r *Real) ClearFault() error { return r.S.SetRunnerKnobs(standin.Knobs{}) }

func (r *Real) CLI(ctx context.Context, host, model string) error {
	if r.bin == "" {
		return errors.New("oracle: no CLI binary")
	}
	cmd := exec.CommandContext(ctx, r.bin, "run", model, "--nowordwrap")
	cmd.Stdin = strings.NewReader("a castle at dawn\n")
	cmd.Env = append(os.Environ(), "OLLAMA_HOST="+host)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ollama run: %w: %s", err, tailOf(out, 300))
	}
	return nil
}

func tailOf(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// Sim is the simulator, configured as the server version it stands for.
type Sim struct {
	S       *vramguardtest.Server
	version string
	load    time.Duration
	profile Profile
}

// NewSim starts a simulator that behaves as Ollama version (an unload
// during a load is honoured on 0.6.5, lost from 0.17 on), with loads of
// load and the same models as a real target.
func NewSim(version string, load time.Duration, p Profile) *Sim {
	blobA := "sha256:" + strings.Repeat("a", 64)
	s := vramguardtest.New(vramguardtest.Config{
		Version:               version,
		HonorUnloadDuringLoad: version == "0.6.5",
		Models: []vramguardtest.ModelConfig{
			{Name: ModelA, Size: 115 << 10, LoadLatency: load, TokenLatency: 2 * time.Millisecond, Blob: blobA},
			{Name: ModelAShort, Size: 115 << 10, LoadLatency: load, TokenLatency: 2 * time.Millisecond, Blob: blobA, Chunks: 6},
			{Name: ModelB, Size: 470 << 10, LoadLatency: load, TokenLatency: 2 * time.Millisecond},
		},
	})
	p.Name = "sim-" + version
	p.CLI = true // played as the CLI's request
	return &Sim{S: s, version: version, load: load, profile: p}
}

func (s *Sim) Name() string            { return s.profile.Name }
func (s *Sim) URL() *url.URL           { return s.S.URL() }
func (s *Sim) Profile() Profile        { return s.profile }
func (s *Sim) LoadTime() time.Duration { return s.load }

func (s *Sim) Observe(ctx context.Context) Obs {
	o := Obs{T0: time.Now(), Listed: map[string]bool{}, Runners: map[string]int{}}
	for _, r := range s.S.Running() {
		g := Group(r.Model)
		if !r.Loading {
			o.Listed[g] = true
		}
		if !r.Dead {
			o.Runners[g]++
		}
	}
	o.T1 = time.Now()
	return o
}

func (s *Sim) KillRunner(group string) (bool, error) {
	names := []string{group}
	if group == ModelA {
		names = append(names, ModelAShort)
	}
	killed := false
	for _, n := range names {
		killed = s.S.KillRunner(n) || killed
	}
	return killed, nil
}

func (s *Sim) Restart(context.Context) error {
	s.S.Restart()
	return nil
}

func (s *Sim) SetFault(f Fault) error {
	var fs []vramguardtest.Fault
	switch f {
	case FaultSlowLoad:
		return nil // the simulator's load time is fixed per model
	case FaultCrashAfter:
		fs = []vramguardtest.Fault{vramguardtest.CrashAfter(3)}
	case FaultOOM:
		fs = []vramguardtest.Fault{vramguardtest.OOM()}
	case FaultHangLoad:
		fs = []vramguardtest.Fault{vramguardtest.Stall(time.Hour)}
	default:
		return fmt.Errorf("oracle: fault %q", f)
	}
	for _, m := range []string{ModelA, ModelAShort, ModelB} {
		if err := s.S.SetFaults(m, fs...); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sim) ClearFault() error {
	for _, m := range []string{ModelA, ModelAShort, ModelB} {
		if err := s.S.SetFaults(m); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sim) CLI(ctx context.Context, host, model string) error {
	c := api.NewClient(&url.URL{Scheme: "http", Host: host}, noKeepAlive())
	return c.Generate(ctx, &api.GenerateRequest{Model: model, Prompt: "a castle at dawn"}, func(api.GenerateResponse) error { return nil })
}

// noKeepAlive returns an HTTP client that keeps no idle connection, so
// that none outlives the schedule whose goroutine opened it.
func noKeepAlive() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// waitEmpty waits until t lists nothing and runs no runner.
func waitEmpty(ctx context.Context, t Target, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		o := t.Observe(ctx)
		if o.Err == "" && len(o.Listed) == 0 && len(o.Runners) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still resident after %v: listed %v, runners %v %s", limit, o.Listed, o.Runners, o.Err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
