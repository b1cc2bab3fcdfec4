// Command caption writes a text-to-image prompt from a picture (a
// reference photo, a sketch) with a vision model served by Ollama, and
// unloads the model (verified) before it exits, so the next program on the
// GPU finds the memory free.
//
//	caption photo.jpg > prompt.txt
//	caption -style anime -hint "my cat" - < sketch.png | refine -passes 2
//
// The image is a file, or stdin with "-": PNG, JPEG or WebP, at most
// vramguard.MaxImageBytes. The prompt goes to stdout alone; stderr gets a
// line saying how the model was unloaded, and a progress line while the
// model writes when stderr is a terminal. When no Ollama answers, caption
// runs against vramguard's built-in simulator (fallback.go), whose reply is
// canned, and says so on the first line of stderr; -no-sim makes that an
// error instead. Exit status: 0 on success, 2 for bad usage or invalid
// input (a file that is not an image, a model that cannot see), 1 for any
// other failure, with a one-line error on stderr that names the error's
// kind.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ollama/ollama/api"

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
		readFile: os.ReadFile,
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
	readFile       func(string) ([]byte, error)
	tty            bool // stderr is a terminal: draw the progress line
	stdinTTY       bool // stdin is a terminal: "-" has no image to read
}

// main runs the command and returns its exit status, after writing any
// error as one line on stderr.
func (c *cmd) main(ctx context.Context, args []string) int {
	err := c.run(ctx, args)
	if err == nil {
		return 0
	}
	fmt.Fprintln(c.stderr, "caption: "+oneLine(err))
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
	host      string
	model     string
	style     string
	hint      string
	mood      string
	keep      bool
	noSim     bool
	probe     time.Duration
	timeout   time.Duration
	maxTokens int
	seed      int64
	path      string // the image file, "-" for stdin
}

func (c *cmd) parse(args []string) (*config, error) {
	var cfg config
	styles := nodes.BuiltinStyles().Names()
	fs := flag.NewFlagSet("caption", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.host, "host", "", "Ollama server `URL` or host:port (default $OLLAMA_HOST, else 127.0.0.1:11434)")
	fs.StringVar(&cfg.model, "model", "", "Ollama vision `model` (default: the first installed model that lists vision)")
	fs.StringVar(&cfg.style, "style", "", "style preset: "+strings.Join(styles, ", ")+" (default "+nodes.DefaultStyle+")")
	fs.StringVar(&cfg.hint, "hint", "", "what the image shows or what the prompt should be about, e.g. \"a sketch of my cat\"")
	fs.StringVar(&cfg.mood, "mood", "", "mood of the prompt, e.g. \"serene\"")
	fs.BoolVar(&cfg.keep, "keep", false, "leave the model loaded (Ollama's keep-alive) instead of unloading it")
	fs.BoolVar(&cfg.noSim, "no-sim", false, "fail when no Ollama answers instead of using the built-in simulator")
	fs.DurationVar(&cfg.probe, "probe", 2*time.Second, "how long to wait for Ollama to answer before using the simulator")
	fs.DurationVar(&cfg.timeout, "timeout", 0, "bound on the generation (0: 10m)")
	fs.IntVar(&cfg.maxTokens, "max-tokens", 0, "cap on the reply's tokens; also turns the spinner into a percentage bar (0: none)")
	fs.Int64Var(&cfg.seed, "seed", 0, fmt.Sprintf("sampling seed, 0 to %d: the same model, image and seed give the same prompt", nodes.MaxSeed))
	// Parse calls Usage on every error; only -h prints the usage, other
	// errors are reported as one line by main.
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(c.stderr, "usage: caption [flags] IMAGE|-\n\n"+
				"Writes a text-to-image prompt from an image (PNG, JPEG or WebP) with an Ollama\n"+
				"vision model and prints it on stdout. With - the image is read from stdin.\n\nflags:\n")
			fs.SetOutput(c.stderr)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, usage("%v (see caption -h)", err)
	}
	switch {
	case fs.NArg() != 1:
		return nil, usage("want one image file, or - for stdin; got %d arguments (see caption -h)", fs.NArg())
	case cfg.timeout < 0:
		return nil, usage("-timeout %v is negative", cfg.timeout)
	case cfg.probe <= 0:
		return nil, usage("-probe %v: want a positive duration", cfg.probe)
	case cfg.maxTokens < 0:
		return nil, usage("-max-tokens %d is negative", cfg.maxTokens)
	case cfg.seed < 0 || cfg.seed > nodes.MaxSeed:
		return nil, usage("-seed %d: want 0 to %d", cfg.seed, nodes.MaxSeed)
	}
	if cfg.style != "" && !slices.Contains(styles, strings.ToLower(strings.TrimSpace(cfg.style))) {
		return nil, usage("unknown style %q: want one of %s", cfg.style, strings.Join(styles, ", "))
	}
	cfg.path = fs.Arg(0)
	return &cfg, nil
}

// run captions one image. It returns only *vramguard.Error values (joined
// when the prompt was written but the unload failed; the prompt is then
// printed too).
func (c *cmd) run(ctx context.Context, args []string) (err error) {
	cfg, err := c.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	img, err := c.image(cfg.path)
	if err != nil {
		return err
	}

	host := cfg.host
	if host == "" {
		host = c.getenv("OLLAMA_HOST")
	}
	var unloads reports
	opts := vramguard.Options{
		Host:              host,
		Getenv:            c.getenv,
		KeepModelsOnClose: cfg.keep,
		Timeouts:          vramguard.Timeouts{Total: cfg.timeout},
		Hooks:             vramguard.Hooks{OnUnloadEnd: unloads.add},
	}
	client, err := vramguard.NewClient(opts)
	if err != nil {
		return err
	}
	if host == "" {
		host = vramguard.DefaultOptions().Host
	}
	if perr := ping(ctx, client, cfg.probe); perr != nil {
		client.Close()
		if vramguard.KindOf(perr) == vramguard.KindCanceled {
			return perr
		}
		if cfg.noSim {
			return &vramguard.Error{Op: "connect", Kind: vramguard.KindUnavailable,
				Err: fmt.Errorf("no Ollama server answers at %s (is `ollama serve` running? set -host or OLLAMA_HOST): %w", host, perr)}
		}
		fallback := startSimulator()
		defer fallback.close()
		fmt.Fprintf(c.stderr, "caption: no Ollama answered at %s (%s); using the built-in simulator, whose vision model %s gives a canned reply, not a description of your image\n",
			host, shortErr(perr), simModel)
		opts.Host = fallback.host()
		if cfg.model == "" {
			cfg.model = simModel
		}
		if client, err = vramguard.NewClient(opts); err != nil {
			return err
		}
	}
	defer func() { err = errors.Join(err, client.Close()) }()

	model := cfg.model
	if model == "" {
		if model, err = firstVisionModel(ctx, client); err != nil {
			return err
		}
	}

	bar := &nodes.ProgressLine{W: c.stderr, Off: !c.tty, Stage: "caption"}
	defer bar.Clear()
	n := nodes.ImagePrompter{
		Guard:     vramguard.Guard{Client: client, KeepLoaded: cfg.keep},
		Model:     model,
		Timeout:   cfg.timeout,
		MaxTokens: cfg.maxTokens,
		Progress:  bar.Update,
	}
	res, err := n.Generate(ctx, nodes.ImageInput{Image: img, Hint: cfg.hint, Style: cfg.style, Mood: cfg.mood, Sampling: nodes.Sampling{Seed: cfg.seed}})
	bar.Clear()
	if res == nil {
		return err
	}
	if _, werr := fmt.Fprintln(c.stdout, res.Prompt); werr != nil && err == nil {
		err = &vramguard.Error{Op: "write result", Kind: vramguard.KindUnavailable, Err: werr}
	}
	if err == nil {
		c.report(model, cfg.keep, unloads.list())
	}
	return err
}

// image reads the image from path, or stdin for "-", and checks that it
// is one the library sends, before any server is contacted.
func (c *cmd) image(path string) ([]byte, error) {
	const op = "read image"
	var (
		img []byte
		err error
	)
	name := path
	if path == "-" {
		name = "stdin"
		if c.stdinTTY {
			return nil, usage("stdin is a terminal: pipe an image in (caption - < photo.png), or name a file")
		}
		img, err = io.ReadAll(io.LimitReader(c.stdin, vramguard.MaxImageBytes+1))
	} else {
		img, err = c.readFile(path)
	}
	if err != nil {
		// A file that cannot be read is the caller's input, like one that
		// is not an image; errors.Is still finds fs.ErrNotExist.
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: err}
	}
	if err := vramguard.CheckImage(img); err != nil {
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("%s: %w", name, err)}
	}
	return img, nil
}

// report writes how the model was unloaded, one line per unload.
func (c *cmd) report(model string, keep bool, unloads []vramguard.UnloadReport) {
	if keep {
		fmt.Fprintf(c.stderr, "caption: left %s loaded (-keep)\n", model)
		return
	}
	for _, u := range unloads {
		fmt.Fprintf(c.stderr, "caption: unloaded %s, verified (%s) in %v\n", u.Model, u.Checked, u.Elapsed.Round(time.Millisecond))
	}
}

// reports collects the verified unloads (Hooks.OnUnloadEnd).
type reports struct {
	mu  sync.Mutex
	got []vramguard.UnloadReport
}

func (r *reports) add(_ context.Context, e vramguard.UnloadEnd) {
	if e.Err != nil || !e.Report.Verified {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, *e.Report)
}

func (r *reports) list() []vramguard.UnloadReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// ping checks, within probe, that an Ollama server answers.
func ping(ctx context.Context, c *vramguard.OllamaClient, probe time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, probe)
	defer cancel()
	err := c.API().Heartbeat(pctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return &vramguard.Error{Op: "connect", Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	return err
}

// shortErr is the last part of a connection error: "connection refused".
func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

// firstVisionModel returns the first installed model, in the Catalog's
// order, whose capabilities (/api/show) include vision.
func firstVisionModel(ctx context.Context, c *vramguard.OllamaClient) (string, error) {
	cat := nodes.Catalog{Client: c}
	models, err := cat.Models(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range models {
		resp, err := c.API().Show(ctx, &api.ShowRequest{Model: m})
		if ctx.Err() != nil {
			return "", &vramguard.Error{Op: "pick model", Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
		}
		if err != nil {
			continue // a model the server cannot describe is not picked
		}
		for _, cp := range resp.Capabilities {
			if string(cp) == "vision" {
				return m, nil
			}
		}
	}
	return "", &vramguard.Error{Op: "pick model", Kind: vramguard.KindNotFound,
		Err: fmt.Errorf("none of the %d installed models lists vision (ollama pull llava, or pass -model)", len(models))}
}
