package ollamatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/testkit/gguf"
)

// The models RegisterModels creates. ModelA is gguf.Small(), ModelB the
// bigger gguf.Large(), so tests can tell loads and swaps apart.
const (
	ModelA = "tiny-a"
	ModelB = "tiny-b"
)

// RegisterModels creates ModelA and ModelB on s. Registering again is
// cheap: the blobs are already there and the manifests are rewritten.
func RegisterModels(ctx context.Context, s *Server) error {
	c := s.Client()
	for _, m := range []struct {
		name string
		p    gguf.Params
	}{
		{ModelA, gguf.Small()},
		{ModelB, gguf.Large()},
	} {
		if _, err := gguf.Register(ctx, c, m.name, m.p); err != nil {
			return err
		}
	}
	return nil
}

// InCI reports whether the CI environment variable is true. In CI a server
// that cannot be built or started fails the test instead of skipping it.
func InCI() bool {
	v, _ := strconv.ParseBool(os.Getenv("CI"))
	return v
}

// unavailable fails (in CI) or skips the test because no server could be had.
func unavailable(t testing.TB, version string, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("ollama %s unavailable (CI=true makes this a failure): %v", version, err)
	}
	t.Skipf("ollama %s unavailable: %v\n"+
		"To run these tests, build the servers once with scripts/install-ollama.sh, "+
		"or set %s to an ollama binary, or %s to a running server.", version, err, EnvBin, EnvHost)
}

// Require starts a server of version for the test and stops it in
// t.Cleanup (which also runs when the test panics or fails). If the test
// failed, the tail of the server log is logged first. When no server can be
// built or started, Require skips the test, or fails it when InCI.
func Require(t testing.TB, version string) *Server {
	t.Helper()
	s, err := Start(t.Context(), Options{Version: version, Logf: t.Logf})
	if err != nil {
		unavailable(t, version, err)
	}
	t.Cleanup(func() {
		// A death is reported with the log's tail.
		if died := ReportDeath(t, s); !died && t.Failed() {
			t.Logf("ollama %s server log (tail):\n%s", s.Version(), s.LogTail(4000))
		}
		if err := s.Stop(); err != nil {
			t.Errorf("stop ollama %s: %v", s.Version(), err)
		}
	})
	return s
}

// Pool holds at most one server per version, started on first use and
// shared by the tests of a package; Close stops them all. Start it in
// TestMain:
//
//	var pool = ollamatest.NewPool(ollamatest.Options{})
//
//	func TestMain(m *testing.M) { os.Exit(pool.Run(m)) }
//
// Pool is safe for concurrent use. A failed start is remembered, so the
// tests after it do not rebuild.
type Pool struct {
	opts Options

	mu      sync.Mutex
	entries map[string]*poolEntry
	closed  bool
}

type poolEntry struct {
	done chan struct{} // closed when the start attempt ended
	s    *Server
	err  error
}

// NewPool returns an empty pool whose servers are started with opts
// (Version is set per call).
func NewPool(opts Options) *Pool {
	return &Pool{opts: opts, entries: map[string]*poolEntry{}}
}

// errPoolClosed is returned by Get after Close.
var errPoolClosed = errors.New("ollamatest: pool closed")

// Get returns the pool's server of version, starting it if this is the
// first call for that version. Concurrent callers wait for the same start;
// ctx bounds only this caller's wait and, for the first caller, the start.
func (p *Pool) Get(ctx context.Context, version string) (*Server, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errPoolClosed
	}
	e, ok := p.entries[version]
	if !ok {
		e = &poolEntry{done: make(chan struct{})}
		p.entries[version] = e
	}
	p.mu.Unlock()
	if !ok {
		opts := p.opts
		opts.Version = version
		e.s, e.err = Start(ctx, opts)
		close(e.done)
	}
	select {
	case <-e.done:
		return e.s, e.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// Require returns the pool's server of version, skipping or failing the
// test like the package-level Require when none can be had. A server that
// died by itself during the test fails it (ReportDeath) and is started
// again for the tests after it.
func (p *Pool) Require(t testing.TB, version string) *Server {
	t.Helper()
	s, err := p.Get(t.Context(), version)
	if err != nil {
		unavailable(t, version, err)
	}
	t.Cleanup(func() {
		if !ReportDeath(t, s) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Restart(ctx); err != nil {
			t.Errorf("restart ollama %s after its death: %v", s.Version(), err)
		}
	})
	return s
}

// Close stops every server of the pool, after waiting for starts in
// progress. Later Gets fail.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	entries := p.entries
	p.entries = map[string]*poolEntry{}
	p.mu.Unlock()
	var errs []error
	for v, e := range entries {
		<-e.done
		if e.s != nil {
			if err := e.s.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("ollama %s: %w", v, err))
			}
		}
	}
	return errors.Join(errs...)
}

// TestingM is the part of *testing.M that Run needs (the same shape as
// goleak.TestingM).
type TestingM interface{ Run() int }

// Run runs m and closes the pool afterwards, also when m.Run panics. It
// returns m.Run's code, or 1 if Close failed.
func (p *Pool) Run(m TestingM) (code int) {
	defer func() {
		if err := p.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "ollamatest:", err)
			if code == 0 {
				code = 1
			}
		}
	}()
	return m.Run()
}

// Wrap returns m with Run replaced by p.Run(m), for wrappers such as
// goleak.VerifyTestMain(pool.Wrap(m)), which then checks for leaks after
// the servers are stopped.
func (p *Pool) Wrap(m TestingM) TestingM { return wrapped{p, m} }

type wrapped struct {
	p *Pool
	m TestingM
}

func (w wrapped) Run() int { return w.p.Run(w.m) }
