package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Exit statuses of the stand-in.
const (
	ExitOK    = 0
	ExitLoad  = 1   // the load failed (knob, missing model, port in use)
	ExitCrash = 134 // crash_after_tokens: what a shell reports for SIGABRT
)

// Build is the llama.cpp build number the stand-in claims to be (the one
// Ollama v0.34.4 ships).
const Build = "11081"

// Config configures Run. The zero value runs a stand-in with no arguments
// (device discovery mode) that writes nowhere and reads the real
// environment.
type Config struct {
	// Args is the command line without the program name.
	Args []string
	// Stdout and Stderr receive what llama-server prints there; nil
	// discards it.
	Stdout, Stderr io.Writer
	// Getenv looks up EnvControl and EnvLog; nil means os.Getenv.
	Getenv func(string) string
	// OnListen, if set, is called with the address the HTTP server
	// listens on, before the model starts loading. Tests pass --port 0
	// and learn the port here.
	OnListen func(net.Addr)
	// CUDALibrary is the CUDA driver library Knobs.DeviceBytes allocates
	// through; "" means DefaultCUDALibrary. Tests name a missing file to
	// take the no-GPU path on any machine.
	CUDALibrary string
}

// Main runs the stand-in as a program: it runs until SIGINT or SIGTERM (or
// until a knob makes it exit) and returns the exit status. See Run.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, Config{Args: args, Stdout: stdout, Stderr: stderr})
}

// Run is the stand-in llama-server. With --list-devices or --version it
// prints and returns at once. Otherwise it listens on --host:--port, loads
// --model (if given) and serves until ctx is done, which returns ExitOK, or
// until a knob makes it fail, which returns ExitLoad or ExitCrash. Before
// returning it closes every connection and waits for its handlers, so it
// leaves no goroutine behind. Each call is an independent stand-in; calls
// may run concurrently on different ports.
func Run(ctx context.Context, cfg Config) int {
	stdout, stderr := cfg.Stdout, cfg.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	o := parseArgs(cfg.Args)
	lg := &logger{w: stderr}

	events, err := openEventLog(getenv(EnvLog), os.Getpid())
	if err != nil {
		lg.linef("warn: vramguard stand-in: no event log (%v)", err)
	}
	defer events.close()
	events.start(cfg.Args)

	if o.version {
		lg.linef("version: %s (vramguard-standin)", Build)
		lg.linef("built with %s for %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return ExitOK
	}
	if o.listDevices {
		// A CPU-only build lists no devices; Ollama parses device lines
		// such as "  CUDA0: NVIDIA ... (16379 MiB, 14900 MiB free)".
		fmt.Fprintln(stdout, "Available devices:")
		return ExitOK
	}

	r := &runner{
		opts:   o,
		log:    lg,
		events: events,
		knobs:  &knobSource{path: getenv(EnvControl), model: o.model, log: lg},
		exitCh: make(chan exitRequest, 1),
		stop:   make(chan struct{}),
		cuda:   cfg.CUDALibrary,
	}
	return r.run(ctx, cfg.OnListen)
}

// logger writes whole lines to stderr, one write call per line or block,
// because Ollama matches its patterns against each write it receives.
type logger struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *logger) linef(format string, args ...any) {
	l.block(fmt.Sprintf(format, args...))
}

func (l *logger) block(lines ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, strings.Join(lines, "\n")+"\n")
}

type loadState int

const (
	stateLoading loadState = iota
	stateReady
	stateFailed // out of memory with OOMHealth: /health reports an error
)

type exitRequest struct {
	code   int
	reason string
}

// runner is one stand-in process: its load state, its HTTP handlers and
// the handlers' join point.
type runner struct {
	opts   options
	log    *logger
	events *eventLog
	knobs  *knobSource
	exitCh chan exitRequest // a handler asks the process to exit
	stop   chan struct{}    // closed when the process shuts down
	cuda   string           // Config.CUDALibrary

	chats atomic.Int64 // numbers chat completion ids
	tasks atomic.Int64 // numbers generations, as llama-server's task ids

	mu       sync.Mutex
	state    loadState
	failMsg  string
	closing  bool
	handlers sync.WaitGroup
}

func (r *runner) setState(s loadState, failMsg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state, r.failMsg = s, failMsg
}

func (r *runner) loadState() (loadState, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state, r.failMsg
}

// requestExit asks run to end the process; only the first request counts.
func (r *runner) requestExit(code int, reason string) {
	select {
	case r.exitCh <- exitRequest{code, reason}:
	default:
	}
}

func (r *runner) run(ctx context.Context, onListen func(net.Addr)) int {
	o := r.opts
	k := r.knobs.current()
	r.banner()
	for _, b := range o.bad {
		r.log.linef("warn: vramguard stand-in: ignoring invalid argument %q", b)
	}

	ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		r.log.linef("main: couldn't bind HTTP server socket, hostname: %s, port: %d", o.host, o.port)
		r.events.exit(ExitLoad, "listen")
		return ExitLoad
	}
	srv := &http.Server{
		Handler: r.handler(),
		// net/http's own complaints must not reach Ollama's error capture.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	addr := ln.Addr().(*net.TCPAddr)
	r.log.linef("main: HTTP server is listening, hostname: %s, port: %d, http threads: %d", o.host, addr.Port, r.opts.slots()+3)
	if onListen != nil {
		onListen(ln.Addr())
	}

	code := r.lifecycle(ctx, k, addr)

	// Shut down abruptly, as a process exit would: close the listener and
	// every connection, release hanging handlers, then join them.
	_ = srv.Close()
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
	close(r.stop)
	r.handlers.Wait()
	<-served
	return code
}

// banner prints what llama-server prints before it loads anything. Ollama's
// device discovery starts llama-server without --model and reads stderr up
// to the system_info line.
func (r *runner) banner() {
	n := runtime.NumCPU()
	r.log.block(
		fmt.Sprintf("build: %s (vramguard-standin) with %s for %s/%s", Build, runtime.Version(), runtime.GOOS, runtime.GOARCH),
		fmt.Sprintf("system info: n_threads = %d, n_threads_batch = %d, total_threads = %d", n, n, n),
		"",
		fmt.Sprintf("system_info: n_threads = %d (n_threads_batch = %d) / %d | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ", n, n, n),
		"",
	)
}

// lifecycle loads the model and serves until ctx is done or a knob ends
// the process; it returns the exit status.
func (r *runner) lifecycle(ctx context.Context, k Knobs, addr *net.TCPAddr) int {
	o := r.opts
	if o.model == "" {
		r.setState(stateReady, "")
		r.log.linef("main: no model given; serving /health only")
		return r.serve(ctx)
	}

	r.setState(stateLoading, "")
	r.log.block(
		"main: loading model",
		fmt.Sprintf("srv    load_model: loading model '%s'", o.model),
		fmt.Sprintf("llama_model_loader: loaded meta data with 20 key-value pairs and 12 tensors from %s (version GGUF V3 (latest))", o.model),
		"load_tensors: loading model tensors, this can take a while... (mmap = true)",
	)
	t := time.NewTimer(k.loadDelay())
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ExitOK
	}

	switch {
	case k.Hang == HangLoad:
		// /health keeps answering "Loading model".
		return r.serve(ctx)
	case k.OOMAtLoad:
		size := k.ModelBytes
		if size <= 0 {
			size = 1 << 30
		}
		r.log.block(oomLines(size)...)
		if k.OOMHealth {
			r.setState(stateFailed, "failed to load model: cudaMalloc failed: out of memory")
			return r.serve(ctx)
		}
		r.log.block(failedLoadLines(o.model)...)
		r.events.exit(ExitLoad, "oom_at_load")
		return ExitLoad
	case k.ExitAtLoad:
		r.log.block(append([]string{
			"llama_model_load: error loading model: vramguard stand-in: exit_at_load knob set",
		}, failedLoadLines(o.model)...)...)
		r.events.exit(ExitLoad, "exit_at_load")
		return ExitLoad
	}

	if k.DeviceBytes > 0 {
		hold, err := HoldDeviceMemory(r.cuda, k.DeviceBytes)
		switch {
		case errors.Is(err, ErrNoGPU):
			// No "error:" in the line: Ollama would take it for the
			// runner's last error.
			r.log.linef("warn: vramguard stand-in: device_bytes %d not held, running without device memory (%s)", k.DeviceBytes, noErrorPrefix.Replace(err.Error()))
		case err != nil:
			if errors.Is(err, errDeviceOOM) {
				r.log.block(oomLines(k.DeviceBytes)...)
			}
			r.log.block(append([]string{
				fmt.Sprintf("llama_model_load: vramguard stand-in: %s", noErrorPrefix.Replace(err.Error())),
			}, failedLoadLines(o.model)...)...)
			r.events.exit(ExitLoad, "device_bytes")
			return ExitLoad
		default:
			defer hold.Release()
			r.log.linef("load_tensors: vramguard stand-in: holding %d bytes of device memory on CUDA%d (%s), %d of %d bytes free after the allocation",
				hold.Bytes, hold.Device, hold.Name, hold.Free, hold.Total)
		}
	}

	size := k.ModelBytes
	if size <= 0 {
		fi, err := os.Stat(o.model)
		if err != nil {
			r.log.block(append([]string{
				fmt.Sprintf("gguf_init_from_file: failed to open GGUF file '%s'", o.model),
				fmt.Sprintf("llama_model_load: error loading model: llama_model_loader: failed to load model from %s", o.model),
			}, failedLoadLines(o.model)...)...)
			r.events.exit(ExitLoad, "model file")
			return ExitLoad
		}
		size = fi.Size()
	}
	// Ollama sets the size of /api/ps from this line (bufferSizeRegex in
	// llm/llama_server.go): "<component>: <backend> model buffer size = X MiB".
	// Only the model buffer is reported, so /api/ps shows ModelBytes.
	r.log.block(
		fmt.Sprintf("load_tensors:          CPU model buffer size = %8.2f MiB", float64(size)/(1<<20)),
		fmt.Sprintf("llama_context: n_ctx         = %d", o.slotCtx()*o.slots()),
		fmt.Sprintf("llama_context: n_ctx_seq     = %d", o.slotCtx()),
		fmt.Sprintf("srv    load_model: initializing slots, n_slots = %d", o.slots()),
		"main: model loaded",
		fmt.Sprintf("main: server is listening on http://%s", net.JoinHostPort(o.host, strconv.Itoa(addr.Port))),
		"main: starting the main loop...",
		"srv  update_slots: all slots are idle",
	)
	r.setState(stateReady, "")
	return r.serve(ctx)
}

// serve waits for ctx or an exit request from a handler.
func (r *runner) serve(ctx context.Context) int {
	select {
	case <-ctx.Done():
		return ExitOK
	case e := <-r.exitCh:
		r.events.exit(e.code, e.reason)
		return e.code
	}
}

// oomLines are what llama.cpp prints when a CUDA allocation for the model
// weights fails. Ollama's StatusWriter keeps "cudaMalloc failed: out of
// memory", the "failed to allocate" line and "error loading model: ...",
// and classifies them as out of memory (llm/status.go).
func oomLines(size int64) []string {
	return []string{
		fmt.Sprintf("ggml_backend_cuda_buffer_type_alloc_buffer: allocating %.2f MiB on device 0: cudaMalloc failed: out of memory", float64(size)/(1<<20)),
		fmt.Sprintf("alloc_tensor_range: failed to allocate CUDA0 buffer of size %d", size),
		"llama_model_load: error loading model: unable to allocate CUDA0 buffer",
	}
}

// failedLoadLines end every failed load, as in llama-server.
func failedLoadLines(model string) []string {
	return []string{
		"llama_model_load_from_file_impl: failed to load model",
		fmt.Sprintf("common_init_from_params: failed to load model '%s'", model),
		fmt.Sprintf("srv    load_model: failed to load model, '%s'", model),
		"srv    operator(): operator(): cleaning up before exit...",
		"main: exiting due to model loading error",
	}
}

// crash ends the process in the middle of a response: it writes the abort
// line, asks run to exit with ExitCrash and aborts the handler, which makes
// net/http drop the connection without ending the response.
func (r *runner) crash(tokens int) {
	r.log.block(
		fmt.Sprintf("ggml/src/ggml-backend.cpp:1203: GGML_ASSERT(vramguard stand-in: crash_after_tokens = %d) failed", tokens),
	)
	r.requestExit(ExitCrash, "crash_after_tokens")
	panic(http.ErrAbortHandler)
}

// waitDelay sleeps for d unless the request or the process ends first.
func (r *runner) waitDelay(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.stop:
		return errStopping
	}
}

var errStopping = errors.New("standin: shutting down")
