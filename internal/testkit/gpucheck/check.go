package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/internal/sleep"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// config is what the flags set.
type config struct {
	Ollama, OllamaVersion, Standin, Out, SMI string
	Rounds, CPURounds                        int
	DeviceBytes                              int64
	Poll, Budget                             time.Duration
	ForceCPU                                 bool
}

// The three ways a round frees the runner's memory, taken in turn.
const (
	modeUnload = "unload" // UnloadModel with VerifyVRAM
	modeEnsure = "ensure" // EnsureFree for more than is free while loaded
	modeAwait  = "await"  // a plain unload request, then AwaitFree
)

var modes = [...]string{modeUnload, modeEnsure, modeAwait}

// checker runs one check; its fields are set up by run step by step.
type checker struct {
	cfg      config
	log      io.Writer
	rep      *report
	deadline time.Time
	gpu      bool
	nvml     *gpu.DeviceReader // nil without a GPU
	smi      *gpu.DeviceReader
	srv      *ollamatest.Server
	client   *vramguard.OllamaClient
}

// run performs the check and returns its report. It never returns without
// stopping the server it started.
func run(ctx context.Context, cfg config, log io.Writer) *report {
	rep := &report{Started: time.Now(), DeviceBytes: cfg.DeviceBytes, OllamaVersion: cfg.OllamaVersion, PollMS: ms(cfg.Poll)}
	c := &checker{cfg: cfg, log: log, rep: rep, deadline: time.Now().Add(cfg.Budget)}
	defer func() { rep.ElapsedMS = ms(time.Since(rep.Started)) }()
	defer c.close()

	c.step("detect GPU", func() error { return c.detect(ctx) })
	if c.gpu {
		c.step("readers at idle", func() error { return c.compareReaders(ctx, "idle") })
	}
	if !c.step("start ollama", func() error { return c.startOllama(ctx) }) {
		return c.finish()
	}
	n := cfg.CPURounds
	if c.gpu {
		n = cfg.Rounds
	}
	c.step(fmt.Sprintf("%d rounds", n), func() error { return c.rounds(ctx, n) })
	return c.finish()
}

// step runs fn, records its time and outcome, and prints a line.
func (c *checker) step(name string, fn func() error) bool {
	t0 := time.Now()
	err := fn()
	s := step{Name: name, MS: ms(time.Since(t0)), OK: err == nil}
	if err != nil {
		s.Err = err.Error()
		c.fail("%s: %v", name, err)
	}
	c.rep.Steps = append(c.rep.Steps, s)
	status := "ok"
	if err != nil {
		status = "FAILED: " + err.Error()
	}
	fmt.Fprintf(c.log, "gpucheck: step %-16s %8.0f ms  %s\n", name, s.MS, status)
	return err == nil
}

func (c *checker) fail(format string, args ...any) {
	c.rep.Failures = append(c.rep.Failures, fmt.Sprintf(format, args...))
}

func (c *checker) logf(format string, args ...any) {
	fmt.Fprintf(c.log, "gpucheck: "+format+"\n", args...)
}

func (c *checker) close() {
	if c.client != nil {
		_ = c.client.Close()
	}
	if c.srv != nil {
		// The server's folder goes with it: keep the end of its log (the
		// stand-in's lines included) with the results.
		if err := os.MkdirAll(c.cfg.Out, 0o755); err == nil {
			_ = os.WriteFile(filepath.Join(c.cfg.Out, "ollama.log"), []byte(c.srv.LogTail(1<<20)), 0o644)
		}
		if err := c.srv.Stop(); err != nil {
			c.fail("stop ollama: %v", err)
		}
	}
	if c.nvml != nil {
		_ = c.nvml.Close()
	}
	if c.smi != nil {
		_ = c.smi.Close()
	}
}

// detect opens NVML and nvidia-smi. No GPU is not a failure: the check
// then runs its CPU path and says why it skipped the rest.
func (c *checker) detect(ctx context.Context) error {
	if c.cfg.ForceCPU {
		c.rep.Skipped = "no NVIDIA GPU: skipped (-cpu given); ran the CPU path only"
		c.logf("%s", c.rep.Skipped)
		return nil
	}
	var reasons []string
	nv, err := gpu.NewNVMLReader(gpu.ReaderOptions{})
	if err == nil {
		var snap *vramguard.VRAMSnapshot
		if snap, err = nv.Snapshot(ctx); err == nil && len(snap.Devices) == 0 {
			err = errors.New("no devices")
		}
		if err != nil {
			_ = nv.Close()
		}
	}
	if err != nil {
		reasons = append(reasons, "nvml: "+err.Error())
	} else {
		c.nvml = nv
	}
	sr, err := gpu.NewSMIReader(gpu.ReaderOptions{SMIPath: c.cfg.SMI, SMITimeout: 20 * time.Second})
	if err == nil {
		var snap *vramguard.VRAMSnapshot
		if snap, err = sr.Snapshot(ctx); err == nil && len(snap.Devices) == 0 {
			err = errors.New("no devices")
		}
	}
	if err != nil {
		reasons = append(reasons, "nvidia-smi: "+err.Error())
	} else {
		c.smi = sr
	}
	c.gpu = c.nvml != nil
	c.rep.GPU = c.gpu
	switch {
	case !c.gpu:
		c.rep.Skipped = "no NVIDIA GPU: skipped (" + strings.Join(reasons, "; ") + "); ran the CPU path only"
		c.logf("%s", c.rep.Skipped)
	case c.smi == nil:
		c.fail("NVML works but nvidia-smi does not: %s", strings.Join(reasons, "; "))
	}
	return nil
}

// compareReaders reads NVML and nvidia-smi one after the other and
// compares their devices and processes.
func (c *checker) compareReaders(ctx context.Context, when string) error {
	if c.smi == nil {
		return errors.New("no nvidia-smi reader to compare with")
	}
	ns, err := c.nvml.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("nvml: %w", err)
	}
	ss, err := c.smi.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("nvidia-smi: %w", err)
	}
	cmp := compareSnapshots(when, ns, ss)
	c.rep.Readers = append(c.rep.Readers, cmp)
	if len(cmp.Mismatches) > 0 {
		return fmt.Errorf("%s", strings.Join(cmp.Mismatches, "; "))
	}
	return nil
}

// startOllama starts the real server with the stand-in, registers the tiny
// models and sets the stand-in's knobs.
func (c *checker) startOllama(ctx context.Context) error {
	t0 := time.Now()
	srv, err := ollamatest.Start(ctx, ollamatest.Options{
		Version:      c.cfg.OllamaVersion,
		Binary:       c.cfg.Ollama,
		Standin:      c.cfg.Standin,
		StartTimeout: 60 * time.Second,
	})
	if err != nil {
		return err
	}
	c.srv = srv
	if srv.External() {
		return fmt.Errorf("%s is set: the check starts its own server", ollamatest.EnvHost)
	}
	if !srv.UsesStandin() {
		return fmt.Errorf("ollama %s does not run models in llama-server: the stand-in cannot hold device memory", c.cfg.OllamaVersion)
	}
	c.rep.Ollama.StartMS = ms(time.Since(t0))
	c.rep.Ollama.PID = srv.PID()
	c.rep.Ollama.URL = srv.URL().String()
	if v, err := srv.Client().Version(ctx); err == nil {
		c.rep.Ollama.Reported = v
	}
	if err := ollamatest.RegisterModels(ctx, srv); err != nil {
		return err
	}
	if err := srv.SetRunnerKnobs(standin.Knobs{TokenMS: -1, DeviceBytes: c.cfg.DeviceBytes}); err != nil {
		return err
	}
	opts := vramguard.Options{Host: srv.URL().String(), UnloadTimeout: time.Minute}
	if c.gpu {
		opts.VRAM, opts.VerifyVRAM, opts.VRAMPollInterval = c.nvml, true, c.cfg.Poll
	}
	c.client, err = vramguard.NewClient(opts)
	return err
}

// rounds loads and frees the model n times, taking the modes in turn.
func (c *checker) rounds(ctx context.Context, n int) error {
	var errs []error
	for i := range n {
		if left := time.Until(c.deadline); left < 20*time.Second {
			c.fail("stopped after %d of %d rounds to stay inside the %v budget", i, n, c.cfg.Budget)
			break
		}
		r := c.round(ctx, i+1, modes[i%len(modes)])
		c.rep.Rounds = append(c.rep.Rounds, r)
		if c.gpu {
			c.logf("round %2d %-6s load %6.0f ms  call %6.0f ms  driver free %6.0f ms  %s", r.N, r.Mode, r.LoadMS, r.CallMS, r.DriverFreeMS, r.verdict())
		} else {
			c.logf("round %2d %-6s load %6.0f ms  call %6.0f ms  runner exit %6.0f ms  %s", r.N, r.Mode, r.LoadMS, r.CallMS, r.PIDGoneMS, r.verdict())
		}
		if r.Err != "" {
			errs = append(errs, fmt.Errorf("round %d (%s): %s", r.N, r.Mode, r.Err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	c.rep.summarise()
	if line := c.standinLine(); line != "" {
		c.rep.StandinSays = line
	}
	return errors.Join(errs...)
}

// standinLine returns the stand-in's last line about device memory from
// the server's log: what it held, or why it held nothing.
func (c *checker) standinLine() string {
	log := c.srv.LogTail(4 << 20)
	var last string
	for line := range strings.Lines(log) {
		if strings.Contains(line, "vramguard stand-in: holding") || strings.Contains(line, "device_bytes") {
			last = strings.TrimSpace(line)
		}
	}
	return last
}

const model = ollamatest.ModelA

// round loads the model, finds its runner, frees it one way and times it.
func (c *checker) round(ctx context.Context, n int, mode string) (r round) {
	r = round{N: n, Mode: mode, DriverFreeMS: -1, PIDGoneMS: -1}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := c.waitNoRunner(ctx, 15*time.Second); err != nil {
		r.Err = err.Error()
		return r
	}
	t0 := time.Now()
	if err := c.load(ctx); err != nil {
		r.Err = "load: " + err.Error()
		return r
	}
	r.LoadMS = ms(time.Since(t0))
	pids, err := c.srv.RunnerPIDs()
	if err != nil || len(pids) != 1 {
		r.Err = fmt.Sprintf("want one runner process after the load, got %v (%v)", pids, err)
		return r
	}
	r.RunnerPID = uint32(pids[0])
	if c.gpu {
		c.gpuRound(ctx, &r)
	} else {
		c.cpuRound(ctx, &r)
	}
	return r
}

// load runs a one-token generation that keeps the model for ten minutes.
func (c *checker) load(ctx context.Context) error {
	done := false
	err := c.srv.Client().Generate(ctx, &api.GenerateRequest{
		Model:     model,
		Prompt:    "hi",
		KeepAlive: &api.Duration{Duration: 10 * time.Minute},
		Options:   map[string]any{"num_predict": 1},
	}, func(g api.GenerateResponse) error {
		done = done || g.Done
		return nil
	})
	if err == nil && !done {
		err = errors.New("stream ended without done")
	}
	return err
}

// rawUnload sends Ollama's unload request and nothing else.
func (c *checker) rawUnload(ctx context.Context) error {
	return c.srv.Client().Generate(ctx, &api.GenerateRequest{
		Model:     model,
		KeepAlive: &api.Duration{Duration: 0},
	}, func(api.GenerateResponse) error { return nil })
}

// waitNoRunner waits until the server has no runner process left.
func (c *checker) waitNoRunner(ctx context.Context, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		pids, err := c.srv.RunnerPIDs()
		if err == nil && len(pids) == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("runner processes %v still alive before the load (%v)", pids, err)
		}
		if err := sleep.Ctx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// cpuRound frees the runner without a GPU: the plumbing of each mode, with
// the runner process's exit in place of the driver's figures.
func (c *checker) cpuRound(ctx context.Context, r *round) {
	gone := c.watchPID(ctx, r.RunnerPID)
	t0 := time.Now()
	var err error
	switch r.Mode {
	case modeUnload:
		var u *vramguard.UnloadReport
		if u, err = c.client.UnloadModel(ctx, model); u != nil {
			r.Verified, r.Checked = u.Verified, u.Checked.String()
		}
	case modeEnsure:
		// No reader: EnsureFree can only unload everything.
		var e *vramguard.EnsureReport
		if e, err = c.client.EnsureFree(ctx, vramguard.EnsureRequest{AllModels: true}); e != nil {
			r.Verified = len(e.Evicted) == 1 && e.Evicted[0].Verified
			if len(e.Evicted) == 1 {
				r.Checked = e.Evicted[0].Checked.String()
			}
		}
	case modeAwait:
		// AwaitFree needs a GPU reader; the plain unload is timed alone.
		err = c.rawUnload(ctx)
		r.Note = "AwaitFree needs a GPU reader: only the plain unload ran"
	}
	r.CallMS = ms(time.Since(t0))
	if d, ok := <-gone; ok {
		r.PIDGoneMS = ms(d)
	}
	switch {
	case err != nil:
		r.Err = err.Error()
	case r.Mode != modeAwait && !r.Verified:
		r.Err = "not verified"
	case r.PIDGoneMS < 0:
		r.Err = "the runner process did not exit within 30 s"
	}
}

// watchPID reports, once, how long after its call the process pid was
// gone (from /proc, not the driver); the channel closes without a value
// if it is still there after 30 s.
func (c *checker) watchPID(ctx context.Context, pid uint32) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	t0 := time.Now()
	go func() {
		defer close(out)
		for time.Since(t0) < 30*time.Second {
			pids, err := c.srv.RunnerPIDs()
			if err == nil && !slices.Contains(pids, int(pid)) {
				out <- time.Since(t0)
				return
			}
			if sleep.Ctx(ctx, c.cfg.Poll) != nil {
				return
			}
		}
	}()
	return out
}
