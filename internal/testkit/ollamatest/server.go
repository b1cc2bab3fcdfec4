package ollamatest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// Options configures Start. The zero value starts the first of Versions().
type Options struct {
	// Version is the Ollama version to run, such as "0.17.4". Empty means
	// Versions()[0]. It only selects the binary to build; it is ignored when
	// Binary or EnvBin is set or EnvHost points at a running server.
	Version string

	// Binary is the ollama binary to run. Empty means EnvBin, else the
	// cached build of Version (built first if missing; see Binary).
	Binary string

	// Standin is the stand-in llama-server binary installed for versions
	// that run models in llama-server (UsesLlamaServer). Empty means
	// StandinBinary, which builds it and so needs the go command; a
	// program running where there is no Go (a GPU machine) passes one
	// built ahead.
	Standin string

	// Env holds extra KEY=VALUE entries for the server process, such as
	// "OLLAMA_KEEP_ALIVE=1m". They override the harness's own settings.
	Env []string

	// StartTimeout bounds the wait for the server to answer HEAD / after
	// it was started. Zero means 60 seconds.
	StartTimeout time.Duration

	// Logf receives progress lines (build, start). Nil discards them. It is
	// only called during Start.
	Logf func(format string, args ...any)
}

// Timings records how long Start took.
type Timings struct {
	Build time.Duration // building the binary; 0 when it was cached
	Start time.Duration // from launching the process until it answered
}

// Server is a running Ollama server: one started by Start, or an external
// one named by EnvHost. Its methods are safe for concurrent use.
type Server struct {
	version  string
	url      *url.URL
	external bool
	timings  Timings
	tr       *http.Transport

	// Only for servers Start launched.
	dir             string
	logPath         string
	bin             string   // the ollama binary
	env             []string // serve's environment, its address included
	startTimeout    time.Duration
	launched, ready time.Time

	// mu guards serve, which Restart replaces.
	mu    sync.Mutex
	serve *serveProc

	standin bool // models run in the stand-in llama-server

	stopOnce sync.Once
	stopErr  error
}

// Start launches `ollama serve` isolated from the user's own Ollama: HOME
// and OLLAMA_MODELS point into a new temporary folder, it listens on a free
// port of 127.0.0.1, and other OLLAMA_* variables of this process are not
// passed on (OLLAMA_KEEP_ALIVE is therefore the default, 5 minutes;
// OLLAMA_NOPRUNE=1 is set). The server leads its own process group, so Stop
// also ends the `ollama runner` processes it spawns; on Linux the kernel
// sends it SIGTERM if this process dies first, and it then stops its
// runners itself.
//
// If EnvHost is set, Start starts nothing and returns a Server for that
// address after checking that it answers.
//
// ctx bounds building the binary and waiting for the server to answer; it
// does not bound the server's life, which ends with Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	if host := os.Getenv(EnvHost); host != "" {
		return attach(ctx, host, timeout)
	}

	version := strings.TrimPrefix(opts.Version, "v")
	if version == "" {
		version = Versions()[0]
	}
	var timings Timings
	bin := opts.Binary
	if bin == "" {
		bin = os.Getenv(EnvBin)
	}
	if bin == "" {
		if version == CustomVersion {
			return nil, fmt.Errorf("ollamatest: version %q needs %s or %s", CustomVersion, EnvBin, EnvHost)
		}
		t0 := time.Now()
		path, built, err := Binary(ctx, version, logf)
		if err != nil {
			return nil, err
		}
		if built {
			timings.Build = time.Since(t0)
		}
		bin = path
	}
	// From v0.30 Ollama runs models in llama.cpp's llama-server, which
	// cannot be built here: the stand-in takes its place.
	var standinBin string
	if UsesLlamaServer(version) {
		standinBin = opts.Standin
		if standinBin == "" {
			p, err := StandinBinary(ctx)
			if err != nil {
				return nil, err
			}
			standinBin = p
		}
	}

	removeStaleDirs()
	dir, err := os.MkdirTemp("", tempPrefix)
	if err != nil {
		return nil, fmt.Errorf("ollamatest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("ollamatest: %w", err)
	}
	// A port picked by the kernel can be taken again before the server
	// binds it; try a few times.
	var lastErr error
	for range 3 {
		s, err := launch(ctx, bin, version, dir, standinBin, opts.Env, timeout)
		if err == nil {
			s.timings = timings
			s.timings.Start = s.ready.Sub(s.launched)
			logf("ollamatest: ollama %s serving at %s (pid %d, started in %s)", version, s.url, s.PID(), s.timings.Start.Round(time.Millisecond))
			return s, nil
		}
		lastErr = err
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

var errAddrInUse = errors.New("address already in use")

// Each server's temporary folder is os.TempDir()/<tempPrefix>*, holding a
// file ownerFile with the process ID of the test process that made it.
const (
	tempPrefix = "vramguard-ollama-"
	ownerFile  = "owner.pid"
)

// removeStaleDirs removes the temporary folders of servers whose test
// process died without stopping them (a panic in a goroutine skips every
// cleanup; the kernel then ends the server, but not its folder).
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // not ours, or still being created
		}
		if pid, err := strconv.Atoi(string(b)); err == nil && pid > 0 && !alive(pid) {
			os.RemoveAll(d)
		}
	}
}

// serveProc is one run of `ollama serve`.
type serveProc struct {
	cmd      *exec.Cmd
	pid      int
	exited   chan struct{} // closed when the process has been reaped
	logStart int64         // the log's size when it started: its lines follow
	stopped  atomic.Bool   // set before the harness itself ends it (kill, Crash)
}

// proc returns the current serve process.
func (s *Server) proc() *serveProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serve
}

// spawn starts serve with s's binary and environment, appending to its
// log, and waits until it answers.
func (s *Server) spawn(ctx context.Context) error {
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("ollamatest: %w", err)
	}
	defer logFile.Close() // the child has its own copy
	var logStart int64
	if fi, err := logFile.Stat(); err == nil {
		logStart = fi.Size()
	}
	cmd := exec.Command(s.bin, "serve")
	cmd.Dir = s.dir
	cmd.Env = s.env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	newGroup(cmd)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("ollamatest: start %s: %w", s.bin, err)
	}
	p := &serveProc{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{}), logStart: logStart}
	go func() {
		defer close(p.exited)
		_ = cmd.Wait()
	}()
	s.mu.Lock()
	s.serve = p
	s.launched = t0
	s.mu.Unlock()
	if err := s.waitReady(ctx, s.startTimeout); err != nil {
		s.kill()
		log := s.LogTail(3000)
		if strings.Contains(log, "address already in use") {
			err = fmt.Errorf("%w: %w", errAddrInUse, err)
		}
		return fmt.Errorf("ollamatest: ollama %s did not start: %w\nserver log:\n%s", s.version, err, log)
	}
	s.mu.Lock()
	s.ready = time.Now()
	s.mu.Unlock()
	return nil
}

// Restart stops the server and its runners as Stop does (SIGTERM, then
// SIGKILL), keeping its folder, models and port, and starts it again, as
// a service manager's restart would. Calls in flight fail; a client that
// keeps the server's URL reaches the new process once Restart returned.
// It returns ErrExternal for an external server.
func (s *Server) Restart(ctx context.Context) error {
	if s.external {
		return ErrExternal
	}
	if err := s.kill(); err != nil {
		return err
	}
	return s.spawn(ctx)
}

// launch starts one serve process and waits until it answers.
func launch(ctx context.Context, bin, version, dir, standinBin string, extraEnv []string, timeout time.Duration) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	home := filepath.Join(dir, "home")
	models := filepath.Join(dir, "models")
	for _, d := range []string{home, models} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("ollamatest: %w", err)
		}
	}
	logPath := filepath.Join(dir, "server.log")

	hostPort := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OLLAMA_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"HOME="+home,
		"OLLAMA_HOST="+hostPort,
		"OLLAMA_MODELS="+models,
		"OLLAMA_NOPRUNE=1",
	)
	if standinBin != "" {
		if err := installStandin(standinBin, dir); err != nil {
			return nil, fmt.Errorf("ollamatest: install the stand-in llama-server: %w", err)
		}
		env = append(env,
			standin.EnvControl+"="+filepath.Join(dir, knobsFile),
			standin.EnvLog+"="+filepath.Join(dir, eventsFile))
	}
	env = append(env, extraEnv...)
	_ = os.Remove(logPath) // a new log for a new start

	s := &Server{
		version:      version,
		url:          &url.URL{Scheme: "http", Host: hostPort},
		tr:           newTransport(),
		dir:          dir,
		logPath:      logPath,
		bin:          bin,
		env:          env,
		startTimeout: timeout,
		standin:      standinBin != "",
	}
	if err := s.spawn(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("ollamatest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func newTransport() *http.Transport {
	return http.DefaultTransport.(*http.Transport).Clone()
}

// waitReady polls HEAD / until it answers 200, the process exits, ctx ends
// or timeout passes.
func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("no answer from %s within %s", s.url, timeout))
	defer cancel()
	defer s.tr.CloseIdleConnections()
	hc := &http.Client{Transport: s.tr}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodHead, s.url.String()+"/", nil)
		resp, err := hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.proc().exited:
			return fmt.Errorf("server exited: %v", s.proc().cmd.ProcessState)
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// attach returns a Server for an already running Ollama at host.
func attach(ctx context.Context, host string, timeout time.Duration) (*Server, error) {
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("ollamatest: %s: %w", EnvHost, err)
	}
	s := &Server{url: u, external: true, tr: newTransport()}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := s.Client()
	if err := c.Heartbeat(ctx); err != nil {
		return nil, fmt.Errorf("ollamatest: %s=%s does not answer: %w", EnvHost, host, err)
	}
	if s.version, err = c.Version(ctx); err != nil {
		return nil, fmt.Errorf("ollamatest: %s=%s: version: %w", EnvHost, host, err)
	}
	return s, nil
}

// URL returns the server's base URL, such as http://127.0.0.1:40123.
func (s *Server) URL() *url.URL {
	u := *s.url
	return &u
}

// Client returns a new Ollama client for the server. Its HTTP client has no
// timeout (bound calls with their ctx) and shares a transport with the
// server's other clients, whose idle connections Stop and
// CloseIdleConnections close.
func (s *Server) Client() *api.Client {
	return api.NewClient(s.URL(), &http.Client{Transport: s.tr})
}

// CloseIdleConnections closes the idle keep-alive connections of the
// clients from Client, so that their goroutines end (for goleak).
func (s *Server) CloseIdleConnections() { s.tr.CloseIdleConnections() }

// Version returns the version the server was started for (such as
// "0.17.4", or CustomVersion for EnvBin). A module-built server itself
// reports 0.0.0. For an external server it is what /api/version said.
// ModelsDir is the server's OLLAMA_MODELS folder ("" for an external
// server): a second server started with OLLAMA_MODELS set to it serves the
// same weights files, as two servers of one user on one machine do.
func (s *Server) ModelsDir() string {
	if s.dir == "" {
		return ""
	}
	return filepath.Join(s.dir, "models")
}

func (s *Server) Version() string { return s.version }

// External reports whether the server is the one EnvHost names. Tests must
// then not kill its runners or assume it holds only their models.
func (s *Server) External() bool { return s.external }

// Timings returns how long building and starting took.
func (s *Server) Timings() Timings { return s.timings }

// PID returns the process ID of `ollama serve`, or 0 for an external server.
func (s *Server) PID() int {
	if p := s.proc(); p != nil {
		return p.pid
	}
	return 0
}

// LogTail returns at most the last n bytes of the server's log (its stdout
// and stderr), or "" for an external server.
func (s *Server) LogTail(n int) string {
	if s.logPath == "" {
		return ""
	}
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	return tail(b, n)
}

// RunnerPIDs returns the process IDs of the live runner processes of this
// server (`ollama runner --model ...`, or from v0.30 `llama-server --model
// ...`), in increasing order; discovery processes without a model are not
// runners. It reads /proc, so it works only on
// Linux; for an external server it returns ErrExternal.
func (s *Server) RunnerPIDs() ([]int, error) {
	if s.external {
		return nil, ErrExternal
	}
	procs, err := listProcs()
	if err != nil {
		return nil, fmt.Errorf("ollamatest: list processes: %w", err)
	}
	var pids []int
	for _, p := range procs {
		if s.isRunner(p) {
			pids = append(pids, p.pid)
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// isRunner reports whether p is a live runner of this server: a child of
// serve, or left in its process group after serve exited, that serves a
// model.
func (s *Server) isRunner(p proc) bool {
	pid := s.PID()
	if p.pid == pid || (p.ppid != pid && p.pgid != pid) || p.state == 'Z' || p.state == 'X' || len(p.args) < 2 {
		return false
	}
	isOllamaRunner := p.args[1] == "runner"
	isLlamaServer := filepath.Base(p.args[0]) == standinName
	return (isOllamaRunner || isLlamaServer) && slices.ContainsFunc(p.args, func(a string) bool {
		return a == "--model" || strings.HasPrefix(a, "--model=")
	})
}

// KillRunner kills the runner process pid with SIGKILL, as a crash would,
// and waits up to five seconds for it to be gone. pid must be one of
// RunnerPIDs.
func (s *Server) KillRunner(pid int) error {
	pids, err := s.RunnerPIDs()
	if err != nil {
		return err
	}
	if !slices.Contains(pids, pid) {
		return fmt.Errorf("ollamatest: pid %d is not a runner of this server (runners: %v)", pid, pids)
	}
	if err := killProcess(pid); err != nil {
		return fmt.Errorf("ollamatest: kill runner %d: %w", pid, err)
	}
	for deadline := time.Now().Add(5 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			return fmt.Errorf("ollamatest: runner %d still alive after SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// Stop ends the server and every runner it started, waits for them to
// exit, and removes its temporary folder (models included). It sends
// SIGTERM to the process group, then SIGKILL after 10 seconds. It is safe to
// call more than once and concurrently; later calls return the first
// result. For an external server it only closes idle connections.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.tr.CloseIdleConnections()
		if s.external {
			return
		}
		s.stopErr = s.kill()
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = fmt.Errorf("ollamatest: %w", err)
		}
	})
	return s.stopErr
}

// kill stops the process group and waits until no runner is left.
func (s *Server) kill() error {
	runners, _ := s.RunnerPIDs()
	sp := s.proc()
	sp.stopped.Store(true)
	_ = signalGroup(sp.pid, false)
	select {
	case <-sp.exited:
	case <-time.After(stopGrace):
	}
	// Whatever is left of the group (the server if it ignored SIGTERM,
	// runners it did not stop) gets SIGKILL.
	_ = signalGroup(sp.pid, true)
	<-sp.exited
	for _, pid := range runners {
		if p, ok := readProc(pid); ok && s.isRunner(p) {
			_ = killProcess(pid)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left, err := s.RunnerPIDs()
		if err != nil || len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ollamatest: runners %v still alive after stopping the server", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Crash kills `ollama serve` alone with SIGKILL, as a crash would, and waits
// until it is reaped; its runners are left to themselves (Stop still ends
// them, through the process group). It returns ErrExternal for an external
// server.
func (s *Server) Crash() error {
	if s.external {
		return ErrExternal
	}
	sp := s.proc()
	sp.stopped.Store(true)
	if err := killProcess(sp.pid); err != nil {
		return fmt.Errorf("ollamatest: kill serve %d: %w", sp.pid, err)
	}
	<-sp.exited
	return nil
}
