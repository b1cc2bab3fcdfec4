// Command vramgate listens where clients expect Ollama and forwards to it,
// carrying vramguard's guarantees to every program on the host, those that
// do not import the library included: a chat UI, ComfyUI's Ollama nodes, a
// Python script, `ollama run` in a terminal.
//
//	OLLAMA_HOST=127.0.0.1:11435 ollama serve     # Ollama moves aside
//	vramgate -ollama 127.0.0.1:11435             # the gate answers on 127.0.0.1:11434
//
// Every Ollama route passes through unchanged, streamed replies as they
// arrive (OLLAMA_HOST pointed at the gate is all a client needs). On top:
//
//   - An unload (keep_alive 0 with no prompt or messages: `ollama stop`) is
//     answered only once vramguard has verified the model gone, re-sent
//     when Ollama lost it; a generation with keep_alive 0 holds back its
//     done line until the model is verified gone (its trailer
//     X-Vramgate-Unload says what was verified, or why not); POST
//     /api/unload unloads one model or all, verified.
//   - Every load is admitted first: a load that would evict a model another
//     vramguard program (or an HTTP lease) holds, break the memory a GPU
//     reader measures (other programs' reservations are not free), or
//     interrupt a ComfyUI render (-comfyui) waits (-admit-wait) or is
//     refused with 503, Retry-After and a JSON body naming the blockers.
//     GET /vramgate/can-load?model=M answers the same question without
//     loading.
//   - Leases over HTTP: POST /vramgate/leases takes a lease on a model,
//     held by the gate in the host-wide lease directory with a TTL, for
//     the HTTP client (every vramguard program, the gate's own unloads and
//     room-making included, keeps the model as the client's and names it:
//     "render-box via vramgate (pid N, ...)"); its id extends (POST
//     /vramgate/leases/ID) and releases (DELETE) it.
//   - Reservations over HTTP (reserve.go): POST /vramgate/reservations
//     {"device", "bytes", "for", "holder", "pid", "ttl", "make_room"} keeps
//     free bytes of a device for a recipient, host-wide (every vramguard
//     program, the gate's own admissions and every other reservation
//     taken through it count them as taken); with
//     "make_room" it first makes the room (verified unloads of idle,
//     unleased models, those requests through the gate are using when
//     it begins kept; with -comfyui, ComfyUI asked last, -make-room or
//     not) and answers a measured receipt
//     (models evicted, tenants asked, free bytes), or a 503 naming
//     what keeps the room. Its id extends (POST .../ID) and releases
//     (DELETE .../ID) it; GET lists them without ids, other programs'
//     included. They need a GPU reader.
//   - GET /metrics and GET /ready, the same as `vramwatch -listen` (package
//     probe), plus the gate's own series by client (X-Vramgate-Client).
//
// The gate keeps only HTTP: a forwarded request is admitted by the
// library's one door, OllamaClient.Admit, on the gate's client, whose
// Options.Budget is the gate's flags (-max-loaded is Budget.MaxLoaded,
// -reserve the Headroom, -make-room MakeRoom, -admit-wait
// WaitForLeases and the admission's bound). The library serializes
// the admissions, counts the loads admitted and not listed yet,
// reserves each load host-wide for the HTTP client until Ollama
// answers, counts the model in use while the request runs, and picks
// what a slot or the room unloads by its one victim policy; a change to
// that policy reaches the gate with nothing to change here. can-load
// asks the same rules as a dry run (EnsureFree with DryRun).
//
// It keeps Ollama's own guards at Ollama's address, on every route (guard.go):
// a request from a web page of a foreign origin (outside Ollama's
// allow-list, OLLAMA_ORIGINS honoured as Ollama honours it) and, on a
// loopback listener, one naming a foreign Host (DNS rebinding) are answered
// 403, as Ollama answers them; what it forwards keeps what Ollama's own
// checks need (the Origin, and on loopback the client's Host).
//
// It listens on loopback only unless -allow-remote is given, and then only
// with a bearer token (-token-file or VRAMGATE_TOKEN) that every client
// must send (Authorization: Bearer TOKEN; 401 without it); it refuses to
// start when Ollama does not answer; on SIGINT or SIGTERM it stops accepting,
// lets requests in flight end (bounded), releases its HTTP leases and
// reservations, and
// unloads, verified, the models that loaded through it (-keep-on-exit
// leaves them). Exit status: 0 after a clean stop, 2 for bad usage, 1
// otherwise.
//
// It is a program users run as a tool, so it lives in cmd/ (go install
// github.com/vramguard/vramguard/cmd/vramgate@latest); like vramwatch it is
// built on the public API only (scripts/check-copy.sh builds it in a module
// outside the repository).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/vramguard/vramguard"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	c := &cmd{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	code := c.main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// cmd is one invocation's environment; main fills it from the process,
// tests from buffers.
type cmd struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// ready, when set, is told the address the gate listens on (tests).
	ready func(addr string)
	// newReader opens the GPU reader; nil means gpu.NewAutoReader (tests
	// set the test double's fake GPU).
	newReader func(context.Context) (vramguard.VRAMReader, error)
}

// main runs the command and returns its exit status, after writing any
// error as one line on stderr.
func (c *cmd) main(ctx context.Context, args []string) int {
	err := c.run(ctx, args)
	if err == nil {
		return 0
	}
	msg := strings.ReplaceAll(err.Error(), "vramguard: ", "")
	fmt.Fprintln(c.stderr, "vramgate: "+strings.Join(strings.Fields(msg), " "))
	if vramguard.KindOf(err) == vramguard.KindInvalidInput {
		return 2
	}
	return 1
}

func usage(format string, args ...any) error {
	return &vramguard.Error{Op: "usage", Kind: vramguard.KindInvalidInput, Err: fmt.Errorf(format, args...)}
}

// config is the parsed command line.
type config struct {
	listen      string
	ollama      string
	allowRemote bool
	maxBody     int64
	maxLoaded   int
	device      int
	gpu         bool
	makeRoom    bool
	admitWait   time.Duration
	retryAfter  time.Duration
	reserve     uint64
	leaseDir    string
	leaseMax    time.Duration
	unloadWait  time.Duration
	stopWait    time.Duration
	keepOnExit  bool
	comfyui     string
	protected   string
	verbose     bool
	origins     string // OLLAMA_ORIGINS, read as Ollama reads it
	tokenFile   string
	token       string // the bearer token clients must send; never logged
}

func (c *cmd) parse(args []string) (*config, error) {
	cfg := config{}
	fs := flag.NewFlagSet("vramgate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:11434", "answer clients on `ADDR` (host:port); a non-loopback address needs -allow-remote and a token (-token-file)")
	fs.StringVar(&cfg.ollama, "ollama", "127.0.0.1:11435", "the Ollama server to forward to (`URL` or host:port)")
	fs.BoolVar(&cfg.allowRemote, "allow-remote", false, "let -listen be an address other machines reach (it then needs a token: -token-file or VRAMGATE_TOKEN)")
	fs.StringVar(&cfg.tokenFile, "token-file", "", "a `FILE` (not readable by others) holding the bearer token every client must send (Authorization: Bearer TOKEN); required with a non-loopback -listen; VRAMGATE_TOKEN gives it instead")
	fs.Int64Var(&cfg.maxBody, "max-body", 64<<20, "largest request body the gate reads (generate, chat, embed, unload, leases), in `bytes`; others stream through")
	fs.IntVar(&cfg.maxLoaded, "max-loaded", 0, "Ollama's OLLAMA_MAX_LOADED_MODELS, when it is set: a load with that many models resident first unloads an idle unleased one, verified, or is refused (0: not checked)")
	fs.IntVar(&cfg.device, "device", 0, "the GPU (as the reader numbers it) Ollama's loads go to")
	fs.BoolVar(&cfg.gpu, "gpu", true, "read the GPU (NVML, else nvidia-smi) to admit loads by memory; -gpu=false: no reader")
	fs.BoolVar(&cfg.makeRoom, "make-room", false, "with a GPU reader, make room for a load (unload idle unleased models, free ComfyUI's cache) instead of refusing it")
	fs.DurationVar(&cfg.admitWait, "admit-wait", 0, "how long an admission may wait, for leases to end and the room to be made, before the load is refused (0: a load kept by leases is refused at once)")
	fs.DurationVar(&cfg.retryAfter, "retry-after", 5*time.Second, "Retry-After of a refusal when no lease among the blockers has an end")
	var reserve uint64
	fs.Uint64Var(&reserve, "reserve", 0, "`bytes` that must stay free on the device after a load (with a GPU reader)")
	fs.StringVar(&cfg.leaseDir, "lease-dir", "", "the host-wide lease directory (default: vramguard's, $XDG_RUNTIME_DIR/vramguard/leases); one given here that cannot be used (another owner, a mode other than 0700) stops the start, the default only turns leases off, with a WARN line")
	fs.DurationVar(&cfg.leaseMax, "lease-max", 10*time.Minute, "longest TTL an HTTP lease or reservation may ask for (at most 1h)")
	fs.DurationVar(&cfg.unloadWait, "unload-timeout", 30*time.Second, "bound of each verified unload")
	fs.DurationVar(&cfg.stopWait, "stop-timeout", 10*time.Second, "on SIGINT/SIGTERM, how long requests in flight may take to end")
	fs.BoolVar(&cfg.keepOnExit, "keep-on-exit", false, "leave the models that loaded through the gate resident when it stops")
	fs.StringVar(&cfg.comfyui, "comfyui", "", "ComfyUI's `URL`: with a GPU reader, a load that needs its memory frees its cache, and is refused while it renders")
	fs.StringVar(&cfg.protected, "protected", "", "comma-separated models the gate never unloads to make room")
	fs.BoolVar(&cfg.verbose, "v", false, "log each admission and unload (debug)")
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(c.stderr, "usage: vramgate [flags]\n\n"+
				"A drop-in proxy in front of Ollama: point OLLAMA_HOST at -listen.\n"+
				"Unloads are verified, loads admitted (leases, memory, ComfyUI),\n"+
				"leases can be taken over HTTP, and /metrics and /ready are served.\n\nflags:\n")
			fs.SetOutput(c.stderr)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, usage("%v (see vramgate -h)", err)
	}
	cfg.reserve = reserve
	getenv := c.getenv
	if getenv == nil { // an empty environment
		getenv = func(string) string { return "" }
	}
	cfg.origins = getenv("OLLAMA_ORIGINS")
	if _, err := ollamaOrigins(cfg.origins); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, usage("unexpected argument %q (see vramgate -h)", fs.Arg(0))
	case cfg.maxBody < 1<<10:
		return nil, usage("-max-body %d: want 1024 bytes or more", cfg.maxBody)
	case cfg.maxLoaded < 0:
		return nil, usage("-max-loaded %d: want 0 or more", cfg.maxLoaded)
	case cfg.device < 0:
		return nil, usage("-device %d: want a device index (0, 1, ...)", cfg.device)
	case cfg.admitWait < 0, cfg.retryAfter <= 0, cfg.leaseMax <= 0, cfg.unloadWait <= 0, cfg.stopWait <= 0:
		return nil, usage("-admit-wait must be 0 or more, -retry-after, -lease-max, -unload-timeout and -stop-timeout more than 0")
	case cfg.leaseMax > time.Hour:
		return nil, usage("-lease-max %v: want at most 1h (what vramguard keeps for someone else always ends within an hour; a client extends it)", cfg.leaseMax)
	case cfg.reserve > vramguard.MaxBytes:
		return nil, usage("-reserve %d: more than any device", cfg.reserve)
	}
	var err error
	if cfg.token, err = readToken(cfg.tokenFile, getenv("VRAMGATE_TOKEN")); err != nil {
		return nil, err
	}
	if err := checkListen(cfg.listen, cfg.allowRemote, cfg.token != ""); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// checkListen refuses an address other machines could reach unless
// allowRemote says so on purpose and the gate has a token.
func checkListen(addr string, allowRemote, hasToken bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return usage("-listen %q: want host:port", addr)
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return nil
	}
	if !allowRemote {
		return usage("-listen %q is not a loopback address: other machines could load, unload and lease through it; give -allow-remote to mean it", addr)
	}
	if !hasToken {
		return usage("-listen %q with -allow-remote needs a token, or anyone who reaches the port could load, unload and lease: give -token-file FILE or VRAMGATE_TOKEN (clients send Authorization: Bearer TOKEN)", addr)
	}
	return nil
}

func (c *cmd) run(ctx context.Context, args []string) error {
	cfg, err := c.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if cfg.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: level}))
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return &vramguard.Error{Op: "listen", Kind: vramguard.KindUnavailable, Err: err}
	}
	g, err := newGate(ctx, cfg, ln.Addr().String(), log, c.newReader)
	if err != nil {
		_ = ln.Close()
		return err
	}
	return g.serve(ctx, c, ln)
}
