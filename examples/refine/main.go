// Command refine rewrites a diffusion prompt with a local LLM served by
// Ollama, and unloads the model (verified) before it exits, so the next
// program on the GPU finds the memory free.
//
//	echo "a fox in the snow" | refine -passes 2 > prompt.txt
//	refine -generate -style anime "a girl on a rooftop at night"
//
// The prompt comes from the arguments or, without any, from stdin; the
// result goes to stdout alone. A progress bar is drawn on stderr when stderr
// is a terminal. Exit status: 0 on success, 2 for bad usage or invalid
// input, 1 for any other failure, with a one-line error on stderr that
// names the error's kind.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/nodes"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	c := &cmd{
		stdin:    os.Stdin,
		stdout:   os.Stdout,
		stderr:   os.Stderr,
		getenv:   os.Getenv,
		tty:      isTerminal(os.Stderr),
		stdinTTY: isTerminal(os.Stdin),
	}
	code := c.main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// cmd is one invocation's environment; main fills it from the process,
// tests from buffers.
type cmd struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	tty            bool // stderr is a terminal: draw the progress bar
	stdinTTY       bool // stdin is a terminal: say that the prompt is awaited
}

// main runs the command and returns its exit status, after writing any
// error as one line on stderr.
func (c *cmd) main(ctx context.Context, args []string) int {
	err := c.run(ctx, args)
	if err == nil {
		return 0
	}
	fmt.Fprintln(c.stderr, "refine: "+oneLine(err))
	if vramguard.KindOf(err) == vramguard.KindInvalidInput {
		return 2
	}
	return 1
}

// oneLine formats err on one line. Every error run returns is a
// *vramguard.Error, whose text names its kind; the repeated package prefix
// is dropped.
func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), "vramguard: ", "")
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
	if vramguard.KindOf(err) == vramguard.KindUnknown {
		s = vramguard.KindUnknown.String() + ": " + s
	}
	return s
}

// usage builds the KindInvalidInput error of a bad command line.
func usage(format string, args ...any) error {
	return &vramguard.Error{Op: "usage", Kind: vramguard.KindInvalidInput, Err: fmt.Errorf(format, args...)}
}

// config is the parsed command line.
type config struct {
	host         string
	model        string
	passes       int
	style        string
	generate     bool
	instructions string
	keep         bool
	timeout      time.Duration
	maxTokens    int
	prompt       string // from the arguments
	stdin        bool   // no arguments: read the prompt from stdin
}

func (c *cmd) parse(args []string) (*config, error) {
	var cfg config
	fs := flag.NewFlagSet("refine", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.host, "host", "", "Ollama server `URL` or host:port (default $OLLAMA_HOST, else 127.0.0.1:11434)")
	fs.StringVar(&cfg.model, "model", "", "Ollama `model` (default: the first installed, prompt-tuned models first)")
	fs.IntVar(&cfg.passes, "passes", nodes.DefaultPasses, fmt.Sprintf("refinement passes, 1 to %d", nodes.MaxPasses))
	fs.BoolVar(&cfg.generate, "generate", false, "treat the input as a short description and write a prompt from it first")
	fs.StringVar(&cfg.style, "style", "", "style preset for -generate: "+strings.Join(nodes.BuiltinStyles().Names(), ", ")+" (default "+nodes.DefaultStyle+")")
	fs.StringVar(&cfg.instructions, "instructions", "", "what the refinement should improve, e.g. \"more detail on the lighting\"")
	fs.BoolVar(&cfg.keep, "keep", false, "leave the model loaded (Ollama's keep-alive) instead of unloading it")
	fs.DurationVar(&cfg.timeout, "timeout", 0, "bound on each generation (0: 10m)")
	fs.IntVar(&cfg.maxTokens, "max-tokens", 0, "cap on each reply's tokens; also turns the spinner into a percentage bar (0: none)")
	// Parse calls Usage on every error; only -h prints the usage, other
	// errors are reported as one line by main.
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(c.stderr, "usage: refine [flags] [prompt ...]\n\n"+
				"Refines a text-to-image prompt with an Ollama model and prints it on stdout.\n"+
				"Without arguments the prompt is read from stdin.\n\nflags:\n")
			fs.SetOutput(c.stderr)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, usage("%v (see refine -h)", err)
	}
	switch {
	case cfg.passes < 1 || cfg.passes > nodes.MaxPasses:
		return nil, usage("-passes %d: want 1 to %d", cfg.passes, nodes.MaxPasses)
	case cfg.timeout < 0:
		return nil, usage("-timeout %v is negative", cfg.timeout)
	case cfg.maxTokens < 0:
		return nil, usage("-max-tokens %d is negative", cfg.maxTokens)
	case cfg.style != "" && !cfg.generate:
		return nil, usage("-style needs -generate: styles shape the prompt written from a description, the refiner keeps the prompt's own style")
	}
	if cfg.style != "" {
		if _, ok := nodes.BuiltinStyles().Style(cfg.style); !ok {
			return nil, usage("unknown style %q: want one of %s", cfg.style, strings.Join(nodes.BuiltinStyles().Names(), ", "))
		}
	}
	cfg.prompt, cfg.stdin = strings.Join(fs.Args(), " "), fs.NArg() == 0
	return &cfg, nil
}

// run refines one prompt. It returns only *vramguard.Error values (joined
// when the refinement worked but the unload failed; the result is then
// printed too).
func (c *cmd) run(ctx context.Context, args []string) (err error) {
	cfg, err := c.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	prompt, err := c.input(cfg)
	if err != nil {
		return err
	}

	host := cfg.host
	if host == "" {
		host = c.getenv("OLLAMA_HOST")
	}
	client, err := vramguard.NewClient(vramguard.Options{
		Host:              host,
		Getenv:            c.getenv,
		KeepModelsOnClose: cfg.keep,
		Timeouts:          vramguard.Timeouts{Total: cfg.timeout},
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, client.Close()) }()
	if host == "" {
		host = vramguard.DefaultOptions().Host
	}
	if err := ping(ctx, client, host); err != nil {
		return err
	}

	model := cfg.model
	if model == "" {
		if model, err = firstModel(ctx, client); err != nil {
			return err
		}
	}

	// Without -keep, a phase keeps the model warm between the generation
	// and the passes and ends with one verified unload; with -keep,
	// nothing is unloaded and Ollama's keep-alive applies.
	guard := vramguard.Guard{Client: client, KeepLoaded: true}
	if !cfg.keep {
		phase, err := client.StartPhase(ctx, "refine", vramguard.PhaseOptions{})
		if err != nil {
			return err
		}
		defer func() {
			_, perr := phase.End(ctx)
			err = errors.Join(err, perr)
		}()
		guard = phase.Guard()
	}

	bar := &nodes.ProgressLine{W: c.stderr, Off: !c.tty}
	defer bar.Clear()
	if cfg.generate {
		bar.Stage = "generate"
		g := nodes.PromptGenerator{Guard: guard, Model: model, Timeout: cfg.timeout, MaxTokens: cfg.maxTokens, Progress: bar.Update}
		res, err := g.Generate(ctx, nodes.GenerateInput{Description: prompt, Style: cfg.style})
		if err != nil {
			return err
		}
		prompt = res.Prompt
	}
	bar.Stage = "refine"
	r := nodes.PromptRefiner{Guard: guard, Model: model, Timeout: cfg.timeout, MaxTokens: cfg.maxTokens, Progress: bar.Update}
	res, err := r.Refine(ctx, nodes.RefineInput{Prompt: prompt, Instructions: cfg.instructions, Passes: cfg.passes})
	bar.Clear()
	if res != nil {
		if _, werr := fmt.Fprintln(c.stdout, res.Prompt); werr != nil && err == nil {
			err = &vramguard.Error{Op: "write result", Kind: vramguard.KindUnavailable, Err: werr}
		}
	}
	return err
}

// input returns the prompt: the arguments, else stdin.
func (c *cmd) input(cfg *config) (string, error) {
	prompt := cfg.prompt
	if cfg.stdin {
		if c.stdinTTY {
			fmt.Fprintln(c.stderr, "refine: reading the prompt from stdin (end with Ctrl-D)")
		}
		b, err := io.ReadAll(io.LimitReader(c.stdin, nodes.MaxInputBytes+1))
		if err != nil {
			return "", &vramguard.Error{Op: "read prompt", Kind: vramguard.KindUnavailable, Err: err}
		}
		if len(b) > nodes.MaxInputBytes {
			return "", usage("prompt on stdin exceeds %d bytes", nodes.MaxInputBytes)
		}
		prompt = string(b)
	}
	prompt = strings.TrimSpace(prompt)
	if prompt == "" {
		return "", usage("empty prompt: pass it as arguments or on stdin")
	}
	return prompt, nil
}

// ping checks that an Ollama server answers, so that a missing server is
// reported as such rather than as the failure of a later call.
func ping(ctx context.Context, c *vramguard.OllamaClient, host string) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := c.API().Heartbeat(pctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return &vramguard.Error{Op: "connect", Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	return &vramguard.Error{Op: "connect", Kind: vramguard.KindUnavailable,
		Err: fmt.Errorf("no Ollama server answers at %s (is `ollama serve` running? set -host or OLLAMA_HOST): %w", host, err)}
}

// firstModel returns the model Catalog lists first: a prompt-tuned one if
// any is installed.
func firstModel(ctx context.Context, c *vramguard.OllamaClient) (string, error) {
	cat := nodes.Catalog{Client: c}
	models, err := cat.Models(ctx)
	if err != nil {
		return "", err
	}
	if len(models) == 0 {
		return "", &vramguard.Error{Op: "pick model", Kind: vramguard.KindNotFound,
			Err: errors.New("the server has no models installed (ollama pull <model>, or pass -model)")}
	}
	return models[0], nil
}
