//go:build unix

package ollamatest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestBinaryLockAndCache checks, without building anything, that Binary
// waits for another builder's lock (giving up with ctx) and then uses the
// binary that builder left.
func TestBinaryLockAndCache(t *testing.T) {
	cache := t.TempDir()
	t.Setenv(EnvCache, cache)
	const version = "0.0.1"
	dir := filepath.Join(cache, version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, format) }
	if _, _, err := Binary(ctx, version, logf); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Binary while locked: %v, want deadline exceeded", err)
	}
	if len(logged) != 1 {
		t.Errorf("logged %q, want one waiting line", logged)
	}

	// The other builder finishes: binary in place, lock released.
	want := filepath.Join(dir, "ollama")
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.Close()
	path, built, err := Binary(t.Context(), "v"+version, nil)
	if err != nil || path != want || built {
		t.Fatalf("Binary = %q, %v, %v; want %q, false, nil", path, built, err, want)
	}
}

func TestNeedsShim(t *testing.T) {
	for v, want := range map[string]bool{
		"0.6.5": false, "0.6.9-rc1": false, "0.7.0": true, "0.17.4": true, "0.24.0": true,
		"0.29.9": true, "0.30.0": false, "0.34.4": false, "1.0.0": false,
	} {
		if got := needsShim(v); got != want {
			t.Errorf("needsShim(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestUsesLlamaServer(t *testing.T) {
	for v, want := range map[string]bool{
		"0.6.5": false, "0.17.4": false, "0.24.0": false, "0.29.9-rc1": false,
		"0.30.0": true, "v0.34.4": true, "1.2.3": true, CustomVersion: false, "": false,
	} {
		if got := UsesLlamaServer(v); got != want {
			t.Errorf("UsesLlamaServer(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestRemoveStaleDirs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	mk := func(name, owner string) string {
		d := filepath.Join(tmp, tempPrefix+name)
		if err := os.MkdirAll(filepath.Join(d, "models"), 0o755); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(d, ownerFile), []byte(owner), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	live := mk("live", "1")          // pid 1 is always alive
	dead := mk("dead", "2147483646") // no such pid
	unowned := mk("unowned", "")
	removeStaleDirs()
	for d, keep := range map[string]bool{live: true, dead: false, unowned: true} {
		if _, err := os.Stat(d); (err == nil) != keep {
			t.Errorf("%s: exists=%v, want %v", filepath.Base(d), err == nil, keep)
		}
	}
}
