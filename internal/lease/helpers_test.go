//go:build darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd

package lease

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logged is one record a capture handler got.
type logged struct {
	level slog.Level
	msg   string
	path  string
}

// capture is a slog.Handler keeping what it gets, for tests of what Live
// logs.
type capture struct {
	mu   *sync.Mutex
	recs *[]logged
}

func newCapture() capture { return capture{mu: new(sync.Mutex), recs: new([]logged)} }

func (c capture) Enabled(context.Context, slog.Level) bool { return true }
func (c capture) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c capture) WithGroup(string) slog.Handler            { return c }
func (c capture) Handle(_ context.Context, r slog.Record) error {
	l := logged{level: r.Level, msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "path" {
			l.path = a.Value.String()
		}
		return true
	})
	c.mu.Lock()
	*c.recs = append(*c.recs, l)
	c.mu.Unlock()
	return nil
}

// of returns the records about path.
func (c capture) of(path string) []logged {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logged
	for _, l := range *c.recs {
		if l.path == path {
			out = append(out, l)
		}
	}
	return out
}

// openDir opens a fresh lease directory under t.TempDir().
func openDir(t testing.TB, opts Options) *Dir {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = filepath.Join(t.TempDir(), "leases")
	}
	d, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// acquire takes a lease and releases it at the end of the test.
func acquire(t testing.TB, d *Dir, r Record) *Held {
	t.Helper()
	h, err := d.Acquire(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Release() })
	return h
}

// sample is a valid record with the given ID, as another holder would
// write it.
func sample(id, model string) Record {
	return Record{Version: 1, ID: id, Server: "127.0.0.1:11434", Model: model, PID: 99999, Program: "other", Created: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// writeFile writes content to dir/name (mode 0600) and returns its path.
func writeFile(t testing.TB, dir, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeRecord writes r as dir/<r.ID>.lease, as a holder that died would
// have left it.
func writeRecord(t testing.TB, dir string, r Record) string {
	t.Helper()
	b, err := encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, r.ID+leaseSuffix, b)
}

// hold plays another holder of path: a second open file description
// with flock(LOCK_EX), which conflicts with Live's test even in this
// process. The returned func (also run at cleanup) lets go.
func hold(t testing.TB, path string) (letGo func()) {
	t.Helper()
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	letGo = func() { once.Do(func() { _ = syscall.Close(fd) }) }
	t.Cleanup(letGo)
	return letGo
}

// ids returns the IDs of recs, in order.
func ids(recs []Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// live calls d.Live and fails the test on an error.
func live(t testing.TB, d *Dir, server, model string) []Record {
	t.Helper()
	recs, err := d.Live(server, model)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
