// Command render alternates an LLM and a diffusion server on one GPU, both
// ways, for several rounds: each round writes an image prompt on Ollama
// (in a phase, its model warm across the round's steps), hands the GPU
// over verified and reserved for the render (Phase.End with NeedBytes: no
// other program on the host may load into that room until the render has
// it), renders on ComfyUI, and frees
// ComfyUI with a measured receipt (comfyui.Client.Free) so that the next
// round's LLM load finds the memory. It prints each step's time and what
// it measured.
//
// With neither server answering it runs on vramguard's test double: a fake
// Ollama and a fake ComfyUI sharing one simulated 16 GiB GPU, on which the
// LLM and the render do not fit together (fallback.go).
//
//	go run ./examples/render                       # on the double, 5 rounds
//	go run ./examples/render -host 127.0.0.1:11434 -comfyui http://127.0.0.1:8188 \
//	    -workflow workflow_api.json -model qwen3:8b -need 9000000000
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/gpu"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

type config struct {
	host, comfy, workflow, model string
	rounds                       int
	need                         uint64
	probe                        time.Duration
	description                  string
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := &config{}
	fs.StringVar(&cfg.host, "host", "", "Ollama server (default OLLAMA_HOST or 127.0.0.1:11434)")
	fs.StringVar(&cfg.comfy, "comfyui", comfyui.DefaultURL, "ComfyUI's URL")
	fs.StringVar(&cfg.workflow, "workflow", "", "API-format workflow (ComfyUI's Export (API)); its positive CLIPTextEncode gets the prompt. Default: the double's")
	fs.StringVar(&cfg.model, "model", "", "the prompt writer's model (default: the double's qwen3:8b, or the first installed model)")
	fs.IntVar(&cfg.rounds, "rounds", 5, "rounds of prompts → render")
	fs.Uint64Var(&cfg.need, "need", 0, "bytes the render needs free (default: the double's checkpoint and working memory; required with real servers)")
	fs.DurationVar(&cfg.probe, "probe", time.Second, "how long to wait for each server before using the double")
	fs.StringVar(&cfg.description, "description", "a lighthouse on a cliff at dusk", "what the images show")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	case cfg.rounds < 1 || cfg.rounds > 1000:
		return nil, fmt.Errorf("%w: -rounds %d: want 1 to 1000", errUsage, cfg.rounds)
	case cfg.need > vramguard.MaxBytes:
		return nil, fmt.Errorf("%w: -need %d is out of range", errUsage, cfg.need)
	}
	return cfg, nil
}

// setup is what a run talks to: real servers, or the double.
type setup struct {
	ollama   *vramguard.OllamaClient
	comfy    *comfyui.Client
	reader   vramguard.VRAMReader
	workflow comfyui.Workflow
	close    func()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	st, banner, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.close()
	fmt.Fprintln(stdout, banner)
	fmt.Fprintf(stdout, "%d rounds: prompt on %s, hand-over of %s, render, free\n\n", cfg.rounds, cfg.model, formatBytes(cfg.need))
	tally, err := rounds(ctx, st, cfg, stdout)
	fmt.Fprintf(stdout, "\n%d rounds: %d loads, %d out-of-memory failures, %d loads spilled to the CPU, %d of %d receipts measured (%s)\n",
		tally.rounds, tally.loads, tally.oom, tally.spilled, tally.measured, tally.rounds, strings.Join(tally.outcomes, ", "))
	return err
}

// connect finds the servers, or starts the double when neither answers.
func connect(ctx context.Context, cfg *config) (*setup, string, error) {
	probe, err := vramguard.NewClient(vramguard.Options{Host: cfg.host})
	if err != nil {
		return nil, "", err
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.probe)
	version, oerr := probe.API().Version(pctx)
	cancel()
	probe.Close()
	cprobe, err := comfyui.New(comfyui.Options{URL: cfg.comfy, StatsTimeout: cfg.probe})
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", errUsage, err)
	}
	stats, cerr := cprobe.SystemStats(ctx)
	cprobe.Close()
	switch {
	case oerr != nil && cerr != nil:
		d, err := startDouble()
		if err != nil {
			return nil, "", err
		}
		cfg.model = cmpOr(cfg.model, simModel)
		if cfg.need == 0 {
			cfg.need = simNeed
		}
		st, err := d.setup(cfg)
		if err != nil {
			d.close()
			return nil, "", err
		}
		return st, fmt.Sprintf("vramguard render: no Ollama and no ComfyUI answered; using the test double: a fake Ollama and a fake ComfyUI on one simulated %s GPU", formatBytes(simGPU)), nil
	case oerr != nil:
		return nil, "", fmt.Errorf("no Ollama answers (ComfyUI does, at %s): %w", cfg.comfy, oerr)
	case cerr != nil:
		return nil, "", fmt.Errorf("no ComfyUI answers at %s (Ollama does): %w", cfg.comfy, cerr)
	case cfg.workflow == "" || cfg.need == 0:
		return nil, "", fmt.Errorf("%w: with real servers give -workflow (an API-format file) and -need (bytes the render needs)", errUsage)
	}
	wf, err := readWorkflow(cfg.workflow)
	if err != nil {
		return nil, "", err
	}
	reader, rerr := gpu.NewAutoReader(ctx, gpu.ReaderOptions{})
	if rerr != nil {
		return nil, "", fmt.Errorf("a verified hand-over needs the GPU: %w", rerr)
	}
	st, err := build(cfg, cfg.host, reader, 0, wf)
	if err != nil {
		reader.Close()
		return nil, "", err
	}
	inner := st.close
	st.close = func() { inner(); reader.Close() }
	if cfg.model == "" {
		ms, err := st.ollama.ListModels(ctx)
		if err != nil || len(ms) == 0 {
			st.close()
			return nil, "", fmt.Errorf("no -model given and none installed: %v", err)
		}
		cfg.model = ms[0].Name
	}
	return st, fmt.Sprintf("vramguard render: Ollama %s, ComfyUI %s; device memory from %s", version, stats.System.ComfyUIVersion, reader.Source()), nil
}

// build makes the clients: ComfyUI named in the reader, registered as a
// tenant (after Ollama's idle models, waiting for a busy queue), and a
// budget that makes room for every LLM load.
func build(cfg *config, host string, reader vramguard.VRAMReader, pid uint32, wf comfyui.Workflow) (*setup, error) {
	cc, err := comfyui.New(comfyui.Options{URL: cfg.comfy, VRAM: reader, PID: pid})
	if err != nil {
		return nil, err
	}
	named := cc.Reader(reader)
	oc, err := vramguard.NewClient(vramguard.Options{Host: host, VRAM: named,
		Budget: &vramguard.Budget{MakeRoom: true}})
	if err != nil {
		cc.Close()
		return nil, err
	}
	if _, err := oc.RegisterTenant(cc.Tenant(comfyui.TenantOptions{})); err != nil {
		oc.Close()
		cc.Close()
		return nil, err
	}
	return &setup{ollama: oc, comfy: cc, reader: named, workflow: wf, close: func() { oc.Close(); cc.Close() }}, nil
}

// tally is what the rounds measured.
type tally struct {
	rounds, loads, oom, spilled, measured int
	outcomes                              []string
}

// rounds runs the rounds, printing a line per step.
func rounds(ctx context.Context, st *setup, cfg *config, w io.Writer) (tally, error) {
	var t tally
	fmt.Fprintf(w, "%-5s  %-9s  %7s  %s\n", "ROUND", "STEP", "TIME", "WHAT")
	line := func(round int, step string, d time.Duration, what string) {
		fmt.Fprintf(w, "%-5d  %-9s  %6.2fs  %s\n", round, step, d.Seconds(), what)
	}
	counts := map[comfyui.Outcome]int{}
	for r := 1; r <= cfg.rounds; r++ {
		t.rounds = r
		start := time.Now()
		// The hand-over reserves the render's room for it: no other
		// program on the host loads into it before the render allocates.
		// With ComfyUI's process known, the reservation also ends as that
		// process takes the room.
		pid, _ := st.comfy.Process(ctx)
		phase, err := st.ollama.StartPhase(ctx, "prompts", vramguard.PhaseOptions{NeedBytes: cfg.need,
			Reserve: vramguard.ReserveOptions{For: fmt.Sprintf("render %d", r), PID: pid}})
		if err != nil {
			return t, err
		}
		g := phase.Guard()
		var prompt string
		loads := 0
		for _, ask := range []string{
			"Write one image prompt for: " + cfg.description,
			"Refine this image prompt, keep it one line: ",
		} {
			gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: cfg.model, Prompt: ask + prompt}, nil)
			if err != nil {
				if vramguard.KindOf(err) == vramguard.KindOutOfMemory {
					t.oom++
				}
				_, _ = phase.End(ctx)
				return t, err
			}
			prompt = strings.TrimSpace(gen.Text)
			if gen.Loaded {
				loads++
			}
			if gen.Offload != nil {
				t.spilled++
			}
		}
		t.loads += loads
		line(r, "prompts", time.Since(start), fmt.Sprintf("2 calls on %s, %d load", cfg.model, loads))

		rep, err := phase.End(ctx)
		if err != nil {
			if vramguard.KindOf(err) == vramguard.KindOutOfMemory {
				t.oom++
			}
			return t, err
		}
		h := rep.Handover
		what := fmt.Sprintf("%s free of the %s the render needs, verified (%s)", formatBytes(h.FreeAfter), formatBytes(cfg.need), evicted(rep))
		if h.Reservation != nil {
			what += fmt.Sprintf(", reserved for %s", h.Reservation.Info().For)
		}
		line(r, "hand-over", h.Elapsed, what)

		start = time.Now()
		res, err := st.comfy.Run(ctx, withPrompt(st.workflow, prompt, r))
		if err != nil {
			if vramguard.KindOf(err) == vramguard.KindOutOfMemory {
				t.oom++
			}
			return t, err
		}
		what = fmt.Sprintf("%d image: %s", len(res.Images), imageNames(res))
		if h.Reservation != nil {
			// The render has allocated and ended: its room is its own, or
			// free again for the next round.
			if err := h.Reservation.Release(); err != nil {
				return t, err
			}
			what += "; reservation released"
		}
		line(r, "render", time.Since(start), what)

		rc, err := st.comfy.Free(ctx, comfyui.FreeRequest{Wait: true})
		if err != nil {
			return t, err
		}
		counts[rc.Outcome]++
		if rc.Outcome == comfyui.OutcomeFreed || rc.Outcome == comfyui.OutcomePartlyFreed {
			t.measured++
		}
		line(r, "free", rc.Elapsed, receiptLine(rc))
	}
	for _, o := range []comfyui.Outcome{comfyui.OutcomeFreed, comfyui.OutcomePartlyFreed, comfyui.OutcomePending, comfyui.OutcomeNotMeasured} {
		if counts[o] > 0 {
			t.outcomes = append(t.outcomes, fmt.Sprintf("%d %s", counts[o], o))
		}
	}
	return t, nil
}

// receiptLine is a receipt without its reading count (which varies by run).
func receiptLine(rc *comfyui.Receipt) string {
	s := fmt.Sprintf("%s %s", rc.Outcome, formatBytes(rc.Released()))
	var parts []string
	if rc.Process.Known {
		parts = append(parts, fmt.Sprintf("ComfyUI's process %s → %s", formatBytes(rc.Process.Before), formatBytes(rc.Process.After)))
	}
	if rc.Torch.Known {
		parts = append(parts, fmt.Sprintf("torch pool %s → %s", formatBytes(rc.Torch.Before), formatBytes(rc.Torch.After)))
	}
	if rc.PinnedKnown && rc.Pinned > rc.Tolerance {
		parts = append(parts, formatBytes(rc.Pinned)+" pinned")
	}
	if rc.Pending > 0 {
		parts = append(parts, formatBytes(rc.Pending)+" on its way")
	}
	if rc.Mode != comfyui.ModeUnknown {
		parts = append(parts, string(rc.Mode))
	}
	if len(parts) > 0 {
		s += ": " + strings.Join(parts, ", ")
	}
	return s
}

func evicted(rep *vramguard.PhaseReport) string {
	var names []string
	for _, u := range rep.Cleanup.Unloads {
		if u.Verified {
			names = append(names, u.Model+" unloaded")
		}
	}
	if len(names) == 0 {
		return "nothing to unload"
	}
	return strings.Join(names, ", ")
}

func imageNames(res *comfyui.Result) string {
	var names []string
	for _, im := range res.Images {
		names = append(names, im.Filename)
	}
	return strings.Join(names, ", ")
}

// withPrompt is wf with text in the CLIPTextEncode node that feeds a
// KSampler's positive input (the first CLIPTextEncode when none does), and
// the KSamplers' seed set to seed (ComfyUI answers a graph it ran already
// from its cache, running nothing).
func withPrompt(wf comfyui.Workflow, text string, seed int) comfyui.Workflow {
	out := make(comfyui.Workflow, len(wf))
	target := ""
	for id, n := range wf {
		out[id] = n
		if n.ClassType == "KSampler" {
			if link, ok := n.Inputs["positive"].([]any); ok && len(link) > 0 {
				target, _ = link[0].(string)
			}
			out[id] = withInput(n, "seed", seed)
		}
	}
	if target == "" {
		for id, n := range wf {
			if n.ClassType == "CLIPTextEncode" && (target == "" || id < target) {
				target = id
			}
		}
	}
	if n, ok := out[target]; ok {
		out[target] = withInput(n, "text", text)
	}
	return out
}

// withInput is n with input k set to v (n's own inputs are not changed).
func withInput(n comfyui.Node, k string, v any) comfyui.Node {
	inputs := make(map[string]any, len(n.Inputs)+1)
	for k, v := range n.Inputs {
		inputs[k] = v
	}
	inputs[k] = v
	n.Inputs = inputs
	return n
}

func readWorkflow(path string) (comfyui.Workflow, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var wf comfyui.Workflow
	if err := json.Unmarshal(b, &wf); err != nil {
		return nil, fmt.Errorf("%w: -workflow %s: not an API-format workflow: %v", errUsage, path, err)
	}
	return wf, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
