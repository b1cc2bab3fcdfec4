package ollamatest

import (
	"os"
	"path/filepath"
	"testing"
)

// The cause is the first crash line the current process logged: a line
// of an earlier process (before the offset) is not its.
func TestFatalLine(t *testing.T) {
	old := "time=1 level=INFO msg=start\nfatal error: an earlier process's crash\n"
	cur := "time=2 level=INFO msg=start\n[GIN] 200 | GET /api/ps\n  fatal error: concurrent map iteration and map write\n\ngoroutine 1 [running]:\npanic: later\n"
	path := filepath.Join(t.TempDir(), "server.log")
	if err := os.WriteFile(path, []byte(old+cur), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := fatalLine(path, int64(len(old))), "fatal error: concurrent map iteration and map write"; got != want {
		t.Errorf("fatalLine from the current start = %q, want %q", got, want)
	}
	if got, want := fatalLine(path, 0), "fatal error: an earlier process's crash"; got != want {
		t.Errorf("fatalLine of the whole log = %q, want %q", got, want)
	}
	if got := fatalLine(path, int64(len(old+cur))); got != "" {
		t.Errorf("fatalLine past the crash = %q, want none", got)
	}
}

func TestKnownCrash(t *testing.T) {
	const race = "fatal error: concurrent map iteration and map write"
	for _, c := range []struct {
		version, cause string
		want           bool
	}{
		{"0.6.5", race, true},
		{"0.17.4", race, true},
		{"0.24.0", race, true},
		{"0.32.3", race, true},
		{"v0.32.3", race, true},
		{"0.32.4", race, false}, // fixed by ollama/ollama#17376
		{"0.34.4", race, false},
		{"0.17.4", "fatal error: concurrent map read and map write", false}, // another race than /api/ps's
		{"0.17.4", "panic: runtime error: index out of range", false},
		{"0.17.4", "exited: signal: killed", false},
		{"0.17.4-rc1", race, true},
		{"main", race, false}, // a version it cannot read is not excused
	} {
		if got := KnownCrash(c.version, c.cause); got != c.want {
			t.Errorf("KnownCrash(%q, %q) = %v, want %v", c.version, c.cause, got, c.want)
		}
	}
}
