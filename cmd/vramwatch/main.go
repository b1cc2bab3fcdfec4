// Command vramwatch shows who holds the GPU's memory: the processes the
// driver lists (through NVML or nvidia-smi) next to the models Ollama has
// loaded (/api/ps), with the model each runner serves when it can be told
// (runners of both generations, `ollama runner` and Ollama's
// `llama-server`, name their weights blob, which Ollama maps to a model),
// Ollama's short-lived GPU discovery processes marked as such, and orphans,
// which only killing frees: runners whose `ollama serve` is gone, and
// runners that hold memory although Ollama lists no model.
//
//	vramwatch                 # a live table, refreshed every second; Ctrl-C quits
//	vramwatch -once           # one table, for scripts
//	vramwatch -once -json     # one JSON object; in live mode one per line
//	vramwatch -listen :9464   # serve /metrics (Prometheus) and /ready (probes)
//
// With -listen it prints no table: it serves, until SIGINT or SIGTERM,
// GET /metrics (vramprom's gauges for the server's resident models and the
// device memory by holder, and the runner processes /proc shows) and
// GET /ready?model=NAME&free=BYTES&device=N, which answers 200 when every
// condition asked for holds (the model resident, checked against its
// runner process on a local server; BYTES free on device N) and 503
// otherwise, with a JSON body that says why (see package probe). A model is
// "loading" while a runner serves its weights and /api/ps does not list it
// yet (from Ollama v0.17 on /api/ps lists a model only once it is loaded;
// v0.6.5 lists it from the start of its load, so there it reads resident).
//
// Without a GPU reader it says so (once) and still shows Ollama's side,
// with the runners /proc lists and the model each serves; without Ollama
// it says so and still shows the GPU's. Exit status: 0 on success
// (Ctrl-C included), 2 for bad usage, 1 when -once could read neither side.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/gpu"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	c := &cmd{
		stdout: os.Stdout,
		stderr: os.Stderr,
		getenv: os.Getenv,
		tty:    isTerminal(os.Stdout),
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
// tests from buffers and a simulated GPU.
type cmd struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	tty            bool // stdout is a terminal: redraw in place
	// newReader opens a GPU reader of the caller's (tests); nil means
	// gpu.NewAutoReader, closed when run returns.
	newReader func(context.Context) (vramguard.VRAMReader, error)
	// procRoot is the procfs root the runners are read from when there is
	// no GPU snapshot; "" means /proc (tests point it at a fake tree).
	procRoot string
}

// errNothing is returned by -once when neither side could be read.
var errNothing = errors.New("neither the GPU nor Ollama could be read")

// main runs the command and returns its exit status, after writing any
// error as one line on stderr.
func (c *cmd) main(ctx context.Context, args []string) int {
	err := c.run(ctx, args)
	if err == nil {
		return 0
	}
	msg := strings.ReplaceAll(err.Error(), "vramguard: ", "")
	fmt.Fprintln(c.stderr, "vramwatch: "+strings.Join(strings.Fields(msg), " "))
	if vramguard.KindOf(err) == vramguard.KindInvalidInput {
		return 2
	}
	return 1
}

// usage builds the KindInvalidInput error of a bad command line.
func usage(format string, args ...any) error {
	return &vramguard.Error{Op: "usage", Kind: vramguard.KindInvalidInput, Err: fmt.Errorf(format, args...)}
}

// config is the parsed command line.
type config struct {
	host     string
	interval time.Duration
	once     bool
	json     bool
	listen   string // serve HTTP on this address instead of printing tables
	gpu      bool   // open a GPU reader
	comfyui  string // ComfyUI's URL: name its process as a holder
	comfyPID uint   // ComfyUI's process, when it cannot be found from comfyui
}

func (c *cmd) parse(args []string) (*config, error) {
	var cfg config
	fs := flag.NewFlagSet("vramwatch", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.host, "host", "", "Ollama server `URL` or host:port (default $OLLAMA_HOST, else 127.0.0.1:11434)")
	fs.DurationVar(&cfg.interval, "interval", time.Second, "time between refreshes")
	fs.BoolVar(&cfg.once, "once", false, "print one table and exit")
	fs.BoolVar(&cfg.json, "json", false, "print JSON: one object per refresh, one per line")
	fs.StringVar(&cfg.listen, "listen", "", "serve GET /metrics and GET /ready?model=NAME&free=BYTES&device=N on `ADDR` (host:port) until SIGINT/SIGTERM, instead of printing tables")
	fs.BoolVar(&cfg.gpu, "gpu", true, "read the GPU (NVML, else nvidia-smi); -gpu=false: no GPU reader")
	fs.StringVar(&cfg.comfyui, "comfyui", "", "ComfyUI's `URL`: its process is named \"ComfyUI\" among the holders (found by the port it listens on and its argv), and its mode, --reserve-vram and --vram-headroom are shown")
	fs.UintVar(&cfg.comfyPID, "comfyui-pid", 0, "ComfyUI's `PID`, where -comfyui cannot find it (a container)")
	fs.Usage = func() {} // Parse calls it on every error; only -h prints the usage
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(c.stderr, "usage: vramwatch [flags]\n\n"+
				"Shows the GPU's memory by process next to the models Ollama has loaded,\n"+
				"names the model each Ollama runner serves, and flags orphaned runners:\n"+
				"those whose server is gone, or that hold memory while Ollama lists no model.\n"+
				"With -listen it serves that instead: GET /metrics for Prometheus, and\n"+
				"GET /ready?model=NAME&free=BYTES&device=N for probes (200 ready, 503 not, JSON body).\n\nflags:\n")
			fs.SetOutput(c.stderr)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, usage("%v (see vramwatch -h)", err)
	}
	switch {
	case fs.NArg() > 0:
		return nil, usage("unexpected argument %q (see vramwatch -h)", fs.Arg(0))
	case cfg.interval < 100*time.Millisecond && !cfg.once:
		return nil, usage("-interval %v: want 100ms or more", cfg.interval)
	case cfg.listen != "" && (cfg.once || cfg.json):
		return nil, usage("-listen serves HTTP: -once and -json are for the table")
	case cfg.comfyPID != 0 && cfg.comfyui == "":
		return nil, usage("-comfyui-pid names ComfyUI's process: give -comfyui too")
	case cfg.comfyPID > math.MaxUint32:
		return nil, usage("-comfyui-pid %d: not a process id", cfg.comfyPID)
	}
	return &cfg, nil
}

// run shows the table once or until ctx is done (which is not a failure),
// or serves -listen's endpoints until then.
func (c *cmd) run(ctx context.Context, args []string) (err error) {
	cfg, err := c.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}

	host := cfg.host
	if host == "" {
		host = c.getenv("OLLAMA_HOST")
	}
	w := &watcher{timeout: max(cfg.interval, 5*time.Second), procRoot: c.procRoot}
	switch {
	case !cfg.gpu:
		w.gpuErr = errors.New("off (-gpu=false)")
	case c.newReader != nil:
		w.gpu, w.gpuErr = c.newReader(ctx)
	default:
		if r, rerr := gpu.NewAutoReader(ctx, gpu.ReaderOptions{}); rerr != nil {
			w.gpuErr = rerr // w.gpu stays a nil interface, not a nil *DeviceReader
		} else {
			w.gpu = r
			defer func() { err = errors.Join(err, r.Close()) }() // shuts NVML down
		}
	}
	if cfg.comfyui != "" {
		cc, err := comfyui.New(comfyui.Options{URL: cfg.comfyui, PID: uint32(cfg.comfyPID), VRAM: w.gpu})
		if err != nil {
			return err
		}
		defer cc.Close()
		w.comfy = cc
		if w.gpu != nil {
			w.gpu = cc.Reader(w.gpu)
		}
	}
	// The client reads the GPU too, so that /ready?free= counts other
	// programs' reservations (probe's DeviceState.Reservations).
	client, err := vramguard.NewClient(vramguard.Options{Host: host, Getenv: c.getenv, KeepModelsOnClose: true, VRAM: w.gpu})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, client.Close()) }()
	if host == "" {
		host = vramguard.DefaultOptions().Host
	}
	w.ollama, w.host = client, host
	if ctx.Err() != nil {
		return nil
	}
	if cfg.listen != "" {
		return c.serve(ctx, w, cfg.listen)
	}

	if cfg.once {
		rep := w.collect(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := c.show(rep, cfg, 0); err != nil {
			return err
		}
		if rep.GPU == nil && rep.Ollama == nil {
			return &vramguard.Error{Op: "watch", Kind: vramguard.KindUnavailable, Err: errNothing}
		}
		return nil
	}

	tick := time.NewTicker(cfg.interval)
	defer tick.Stop()
	for n := 0; ; n++ {
		rep := w.collect(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := c.show(rep, cfg, n); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// show writes the n-th report (from 0): JSON on one line, or a table that
// replaces the previous one on a terminal and follows it after a blank
// line elsewhere, where only the first says that there is no GPU reader
// (that holds for the whole run).
func (c *cmd) show(rep *report, cfg *config, n int) error {
	var err error
	switch {
	case cfg.json:
		err = json.NewEncoder(c.stdout).Encode(rep)
	default:
		var b strings.Builder
		switch {
		case cfg.once:
		case c.tty:
			b.WriteString("\x1b[H\x1b[2J")
			fmt.Fprintf(&b, "vramwatch  %s  every %v, Ctrl-C quits\n\n", rep.Time.Format(time.TimeOnly), cfg.interval)
		default:
			if n > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "vramwatch  %s\n", rep.Time.Format(time.DateTime))
		}
		writeTable(&b, rep, cfg.once || c.tty || n == 0)
		_, err = io.WriteString(c.stdout, b.String())
	}
	if err != nil {
		return &vramguard.Error{Op: "write", Kind: vramguard.KindUnavailable, Err: err}
	}
	return nil
}
