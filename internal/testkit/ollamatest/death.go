package ollamatest

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

// CrashMarker starts the line ReportDeath logs for a server that died of
// a crash known to be Ollama's own. scripts/test-integration.sh runs a
// failed test again once when, and only when, its output carries it
// (internal/tools/rerun decides).
const CrashMarker = "ollamatest: known server crash:"

// Death reports whether the server's current process exited by itself
// (not through Stop, Restart, Crash or the harness's own kill), and why:
// the first "fatal error:" or "panic:" line it logged since it started, or
// its exit status when it logged neither. An external server never dies
// here.
func (s *Server) Death() (cause string, died bool) {
	if s.external {
		return "", false
	}
	sp := s.proc()
	if sp == nil || sp.stopped.Load() {
		return "", false
	}
	select {
	case <-sp.exited:
	default:
		return "", false
	}
	if line := fatalLine(s.logPath, sp.logStart); line != "" {
		return line, true
	}
	return "exited: " + sp.cmd.ProcessState.String(), true
}

// fatalLine returns the first line of the log at path, from offset on,
// that starts a Go runtime crash or a panic.
func fatalLine(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if bytes.HasPrefix(line, []byte("fatal error:")) || bytes.HasPrefix(line, []byte("panic:")) {
			return string(line)
		}
	}
	return ""
}

// KnownCrash reports whether cause, a Death of a server of version, is
// Ollama's /api/ps data race: its handler iterates the scheduler's map of
// loaded models without the lock, and a load or unload that writes the map
// meanwhile kills the server with "fatal error: concurrent map iteration
// and map write" (ollama/ollama#17376, fixed in v0.32.4; README, known
// server issues). Every verified unload polls /api/ps, so a suite of
// hundreds of them meets it now and then on v0.6.5, v0.17.4 and v0.24.0.
func KnownCrash(version, cause string) bool {
	if !strings.Contains(cause, "fatal error: concurrent map iteration and map write") {
		return false
	}
	return versionBefore(version, 0, 32, 4)
}

// versionBefore reports whether v ("0.17.4") is older than
// major.minor.patch; a version it cannot read is not.
func versionBefore(v string, major, minor, patch int) bool {
	n, ok := versionNumbers(v)
	if !ok {
		return false
	}
	want := [3]int{major, minor, patch}
	for i := range n {
		if n[i] != want[i] {
			return n[i] < want[i]
		}
	}
	return false
}

// ReportDeath fails t when s died by itself during it (Death), naming the
// cause and, for a crash KnownCrash knows, the CrashMarker line. It
// returns whether s died; the caller restarts it if later tests share it.
func ReportDeath(t testing.TB, s *Server) bool {
	t.Helper()
	cause, died := s.Death()
	if !died {
		return false
	}
	if KnownCrash(s.Version(), cause) {
		t.Errorf("%s ollama %s: %s (ollama/ollama#17376, fixed in v0.32.4)", CrashMarker, s.Version(), cause)
	} else {
		t.Errorf("ollama %s died during the test: %s", s.Version(), cause)
	}
	t.Logf("ollama %s log (tail):\n%s", s.Version(), s.LogTail(3000))
	return true
}
