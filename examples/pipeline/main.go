// Command pipeline is a small diffusion orchestrator that reproduces the
// out-of-memory story vramguard exists for, and shows it solved: an LLM
// writes, refines and negates the prompt, then an 11.2 GB text encoder is
// loaded on the same GPU.
//
// It prints a timeline (time, step, models resident per /api/ps, device
// memory and its source) and writes an SVG picture of memory over time.
// With no Ollama answering at -host it runs against vramguard's built-in
// simulator with a simulated 24 GiB GPU (fallback.go), and says so on its
// first line.
//
//	go run ./examples/pipeline                 # phase mode: 2 loads, verified hand-over
//	go run ./examples/pipeline -mode per-call  # unload after every call: 5 loads
//	go run ./examples/pipeline -mode naive     # the original failure: models stay, the encoder load fails
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/nodes"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if code := exitCode(err); code != 0 {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(code)
	}
}

// exitCode is the exit status for run's error: 0 for none and for -h (the
// usage is printed; asking for it is no failure), 2 for a usage error, 1
// for any other failure.
func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	return 1
}

var errUsage = errors.New("usage")

type config struct {
	host        string
	genModel    string
	model       string
	mode        string
	bytes       uint64
	out         string
	description string
	probe       time.Duration
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := &config{}
	fs.StringVar(&cfg.host, "host", "", "Ollama server (default OLLAMA_HOST or 127.0.0.1:11434)")
	fs.StringVar(&cfg.genModel, "gen-model", "", "model of the prompt generator (model B; default: simulator's qwen3:8b, or the first installed model)")
	fs.StringVar(&cfg.model, "model", "", "model of the refiner and the negative prompt (model A; default: simulator's llama3.2:3b, or the first installed model)")
	fs.StringVar(&cfg.mode, "mode", "phase", "phase (warm across steps, verified hand-over), per-call (unload after each call) or naive (the original failure)")
	fs.Uint64Var(&cfg.bytes, "bytes", 11_200_000_000, "bytes the text encoder needs")
	fs.StringVar(&cfg.out, "out", filepath.Join(os.TempDir(), "vramguard-pipeline.svg"), "where to write the SVG picture")
	fs.StringVar(&cfg.description, "description", "a lighthouse on a cliff at dusk", "what the image shows")
	fs.DurationVar(&cfg.probe, "probe", time.Second, "how long to wait for Ollama before using the simulator")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	switch cfg.mode {
	case "phase", "per-call", "naive":
	default:
		return nil, fmt.Errorf("%w: -mode %q: want phase, per-call or naive", errUsage, cfg.mode)
	}
	if cfg.bytes == 0 || cfg.bytes > vramguard.MaxBytes {
		return nil, fmt.Errorf("%w: -bytes %d is out of range", errUsage, cfg.bytes)
	}
	return cfg, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	rec := newRecorder()
	opts := vramguard.Options{Host: cfg.host, Hooks: rec.hooks()}

	// Is a real Ollama there?
	probe, err := vramguard.NewClient(opts)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.probe)
	version, verr := probe.API().Version(pctx)
	cancel()
	probe.Close()

	var (
		fallback *simulated // nil against a real Ollama
		reader   vramguard.VRAMReader
	)
	if verr != nil {
		if fallback, err = startSimulator(); err != nil {
			return err
		}
		defer fallback.close()
		opts.Host = fallback.host()
		reader = fallback.reader()
		fmt.Fprintf(stdout, "vramguard pipeline: no Ollama answered (%v); using the built-in simulator with a simulated 24 GiB GPU (the UNet already holds %s)\n",
			shortErr(verr), gb(simUNet))
		if cfg.genModel == "" {
			cfg.genModel = simGen
		}
		if cfg.model == "" {
			cfg.model = simModel
		}
	} else {
		r, rerr := gpu.NewAutoReader(ctx, gpu.ReaderOptions{})
		if rerr == nil {
			defer r.Close() // shuts NVML down
			reader = r      // only on success: a nil *DeviceReader would be a non-nil VRAMReader
		}
		fmt.Fprintf(stdout, "vramguard pipeline: Ollama %s at %s; device memory from %s\n", version, hostOf(opts.Host), readerName(r, rerr))
	}
	opts.VRAM = reader
	if cfg.mode != "naive" {
		// The LLM side is admitted against a budget too: each load must
		// leave room for the text encoder that comes next, making room
		// (largest Ollama models first) when it would not. Without a GPU
		// reader the budget switches itself off.
		opts.Budget = &vramguard.Budget{Headroom: cfg.bytes, MakeRoom: true, OffWithoutGPU: true}
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		return err
	}
	defer c.Close()
	if cfg.genModel == "" || cfg.model == "" {
		if err := pickModels(ctx, c, cfg); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "mode %s: generator on %s, refiner (3 passes) and negative prompt on %s, then a %s text encoder\n\n",
		cfg.mode, cfg.genModel, cfg.model, gb(cfg.bytes))

	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		rec.sampleEvery(sctx, reader, 25*time.Millisecond)
	}()
	perr := pipeline(ctx, c, fallback, reader, rec, cfg)
	stopSampling()
	<-sampled

	if err := rec.printTable(stdout); err != nil {
		return err
	}
	if err := writeFile(cfg.out, func(w io.Writer) error {
		return rec.writeSVG(w, fmt.Sprintf("vramguard pipeline, %s mode: device memory over time", cfg.mode))
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nloads: %d; evicted by the budget: %d; picture of VRAM over time: %s\n", rec.count("load"), rec.count("budget eviction"), cfg.out)
	return perr
}

// pipeline runs the orchestrator's steps. fallback is the simulated GPU,
// nil on a real one.
func pipeline(ctx context.Context, c *vramguard.OllamaClient, fallback *simulated, reader vramguard.VRAMReader, rec *recorder, cfg *config) error {
	rec.addRow(ctx, c, reader, "start", "")
	guard := vramguard.Guard{Client: c} // per-call: verified unload after each call
	var phase *vramguard.Phase
	switch cfg.mode {
	case "naive":
		guard.KeepLoaded = true // the original design without its fix: Ollama's 5 minutes
	case "phase":
		var opts vramguard.PhaseOptions
		if reader != nil {
			// Without a reader End could not measure, and would fail.
			opts.NeedBytes = cfg.bytes
		}
		var err error
		phase, err = c.StartPhase(ctx, "prompts", opts)
		if err != nil {
			return err
		}
		defer phase.End(ctx) // idempotent; also ends it on an early return
		guard = phase.Guard()
	}
	gen := nodes.PromptGenerator{Guard: guard, Model: cfg.genModel, MaxTokens: 60}
	ref := nodes.PromptRefiner{Guard: guard, Model: cfg.model, MaxTokens: 60}
	neg := nodes.NegativePrompt{Guard: guard, Model: cfg.model, MaxTokens: 40}

	var prompt, negative string
	steps := []struct {
		name string
		fn   func() error
	}{
		{"generate prompt", func() error {
			r, err := gen.Generate(ctx, nodes.GenerateInput{Description: cfg.description, Style: "cinematic"})
			if err == nil {
				prompt = r.Prompt
			}
			return err
		}},
		{"refine ×3", func() error {
			r, err := ref.Refine(ctx, nodes.RefineInput{Prompt: prompt, Passes: 3})
			if err == nil {
				prompt = r.Prompt
			}
			return err
		}},
		{"negative prompt", func() error {
			r, err := neg.Generate(ctx, nodes.NegativeInput{Prompt: prompt, Style: "cinematic"})
			if err == nil {
				negative = r.Prompt
			}
			return err
		}},
	}
	for _, s := range steps {
		if err := rec.step(s.name, s.fn); err != nil {
			rec.addRow(ctx, c, reader, s.name, "failed: "+shortErr(err))
			return err
		}
		rec.addRow(ctx, c, reader, s.name, "")
	}

	// Make room, verified, right before the big load.
	var note string
	err := rec.step("hand over VRAM", func() error {
		switch cfg.mode {
		case "phase":
			rep, err := phase.End(ctx)
			if rep != nil && rep.Cleanup != nil {
				note = unloadNote(rep.Cleanup.Unloads)
				if rep.Handover != nil {
					note += fmt.Sprintf("; %s free", gb(rep.Handover.FreeAfter))
				}
			}
			return err
		case "per-call":
			if reader == nil {
				// EnsureFree cannot measure; it would unload every model
				// the server lists, other programs' too, only if asked
				// (AllModels). The guards already unloaded ours.
				note = "no GPU reader: nothing to measure"
				return nil
			}
			rep, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: cfg.bytes})
			if rep != nil {
				note = fmt.Sprintf("EnsureFree evicted %d; %s free", len(rep.Evicted), gb(rep.FreeAfter))
			}
			return err
		}
		note = "nothing done (naive)"
		return nil
	})
	rec.addRow(ctx, c, reader, "hand over VRAM", note)
	if err != nil {
		return err
	}

	err = rec.step("load text encoder", func() error { return loadEncoder(ctx, fallback, reader, cfg.bytes) })
	if err != nil {
		rec.event("oom", "text encoder")
		rec.addRow(ctx, c, reader, "load text encoder", "FAILED: "+err.Error())
		return fmt.Errorf("loading the text encoder: %w", err)
	}
	if reader == nil {
		rec.addRow(ctx, c, reader, "load text encoder", "not checked: no GPU reader to measure free memory")
	} else {
		rec.addRow(ctx, c, reader, "load text encoder", gb(cfg.bytes)+" loaded")
	}
	if fallback != nil {
		// The diffusion model would encode prompt and negative here.
		_ = rec.step("encode and denoise", func() error {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(300 * time.Millisecond):
				return nil
			}
		})
		fallback.free("text encoder")
		rec.sampleOnce(ctx, reader)
	}
	_, _ = prompt, negative
	return nil
}

// loadEncoder "loads" the text encoder: on the simulator it allocates on the
// simulated GPU; on a real one it checks that the GPU has the room.
func loadEncoder(ctx context.Context, fallback *simulated, reader vramguard.VRAMReader, bytes uint64) error {
	if fallback != nil {
		return fallback.allocate("text encoder", bytes)
	}
	if reader == nil {
		return nil // nothing to check against
	}
	snap, err := reader.Snapshot(ctx)
	if err != nil {
		return err
	}
	if d := snap.Device(0); d != nil && d.Free < bytes {
		return fmt.Errorf("VRAM grow failed: %d bytes", bytes-d.Free)
	}
	return nil
}

// pickModels fills empty model flags from the installed models.
func pickModels(ctx context.Context, c *vramguard.OllamaClient, cfg *config) error {
	cat := nodes.Catalog{Client: c}
	ms, err := cat.Models(ctx)
	if err != nil {
		return err
	}
	if len(ms) == 0 {
		return errors.New("no model installed: pull one (ollama pull llama3.2) or pass -model")
	}
	if cfg.model == "" {
		cfg.model = ms[0]
	}
	if cfg.genModel == "" {
		cfg.genModel = ms[min(1, len(ms)-1)]
	}
	return nil
}

// unloadNote says what a phase's verified unloads did: the models that were
// still loaded, and those that had left already (the budget made room).
func unloadNote(reps []vramguard.UnloadReport) string {
	var was, gone []string
	for _, u := range reps {
		if !u.Verified {
			continue
		}
		if u.WasLoaded {
			was = append(was, u.Model)
		} else {
			gone = append(gone, u.Model)
		}
	}
	note := "verified unload of " + strings.Join(was, ", ")
	if len(was) == 0 {
		note = "nothing left to unload"
	}
	if len(gone) > 0 {
		note += " (" + strings.Join(gone, ", ") + " had left already)"
	}
	return note
}

func (r *recorder) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.kind == kind {
			n++
		}
	}
	return n
}

func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readerName(r *gpu.DeviceReader, err error) string {
	if err != nil {
		return "nowhere (no GPU reader: " + shortErr(err) + ")"
	}
	return r.Source()
}

func hostOf(h string) string {
	if h == "" {
		if h = os.Getenv("OLLAMA_HOST"); h == "" {
			return vramguard.DefaultOptions().Host
		}
	}
	return h
}

func shortErr(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && len(s) > 120 {
		s = s[i+2:]
	}
	return s
}
