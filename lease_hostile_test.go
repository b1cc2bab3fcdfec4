//go:build linux

package vramguard_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Hostile and broken lease state never breaks a caller: garbage (held or
// not), a truncated record, a symlink to another directory's live lease
// and thousands of stale files are each ignored or cleaned up, and the
// unload goes ahead, verified; a directory others may write is refused
// with one WARN line, HoldModel fails typed, and unloads go on.
func TestHostileLeaseFiles(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	b := leaseClient(t, s, dir, vramguard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	warmModel(t, b, "small")

	// Another directory's live lease, to point a symlink at.
	elsewhere := leaseDir(t)
	a := leaseClient(t, s, elsewhere, vramguard.Options{})
	l, err := a.HoldModel(t.Context(), "small", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	record := fmt.Sprintf(`{"v":1,"id":"%%s","server":"%s","model":"small:latest","pid":%d,"program":"forged","created":"2026-01-01T00:00:00Z"}`,
		strings.TrimPrefix(s.URL().String(), "http://"), os.Getpid())
	// Held garbage and a held truncated record: a live holder, unreadable.
	for _, f := range []struct{ name, body string }{
		{"00000000000000aa.lease", "\x00\xffnot json at all"},
		{"00000000000000ab.lease", fmt.Sprintf(record, "00000000000000ab")[:40]},
	} {
		fd, err := os.Open(write(f.name, f.body))
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		if err := syscall.Flock(int(fd.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
	}
	// A symlink to the live lease of the other directory.
	matches, _ := filepath.Glob(filepath.Join(elsewhere, "*.lease"))
	if len(matches) != 1 {
		t.Fatalf("%d leases in the other directory", len(matches))
	}
	if err := os.Symlink(matches[0], filepath.Join(dir, l.Info().ID+".lease")); err != nil {
		t.Fatal(err)
	}
	// 2,000 well-formed leases of no live holder.
	for i := range 2000 {
		id := fmt.Sprintf("%016x", 0xb00000+i)
		write(id+".lease", fmt.Sprintf(record, id))
	}

	rep, err := b.UnloadModel(t.Context(), "small")
	if err != nil || !rep.Verified || len(rep.Leased) != 0 || s.Listed("small") {
		t.Fatalf("UnloadModel among hostile lease files: %+v, %v; want verified, no lease", rep, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.lease")); len(left) != 3 {
		t.Errorf("%d files left, want the two held unreadable ones and the symlink (stale ones removed)", len(left))
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("no WARN line for the hostile files:\n%s", logs.String())
	}

	// A directory others may write: refused, once, and nothing breaks.
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	logs.Reset()
	u := leaseClient(t, s, open, vramguard.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 3 {
		if _, err := u.HoldModel(t.Context(), "small", time.Minute); !errors.Is(err, vramguard.KindUnavailable) || !strings.Contains(err.Error(), "unsafe") {
			t.Fatalf("HoldModel in a world-writable directory: %v, want KindUnavailable naming it unsafe", err)
		}
	}
	warmModel(t, u, "small")
	if rep, err := u.UnloadModel(t.Context(), "small"); err != nil || !rep.Verified {
		t.Fatalf("UnloadModel with a refused lease directory: %+v, %v", rep, err)
	}
	ph, err := u.StartPhase(t.Context(), "p", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pg := ph.Guard()
	if _, err := pg.Generate(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, nil); err != nil {
		t.Fatalf("a phase with a refused lease directory: %v", err)
	}
	if _, err := ph.End(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d WARN lines, want the one for the refused directory:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "lease directory is refused"); n != 1 {
		t.Errorf("%d WARN lines for the refused directory, want 1:\n%s", n, logs.String())
	}
}
