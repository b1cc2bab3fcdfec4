//go:build unix

package ollamatest_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// recordTB keeps what ReportDeath says instead of failing the test.
type recordTB struct {
	testing.TB
	errs []string
}

func (r *recordTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recordTB) Logf(string, ...any) {}
func (r *recordTB) Helper()             {}

// Death reports a server process that exited by itself, and only that: not
// one the harness crashed or restarted.
func TestDeath(t *testing.T) {
	s, err := ollamatest.Start(t.Context(), ollamatest.Options{Version: ollamatest.Versions()[0], Logf: t.Logf})
	if err != nil {
		t.Skipf("no server: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	if s.External() {
		t.Skip("an external server is not ours to kill")
	}
	if cause, died := s.Death(); died {
		t.Fatalf("a live server: Death = %q", cause)
	}
	if err := s.Crash(); err != nil {
		t.Fatal(err)
	}
	if cause, died := s.Death(); died {
		t.Errorf("after the harness's Crash: Death = %q, want none (the harness ended it)", cause)
	}
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(s.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	cause, died := s.Death()
	for ; !died && time.Now().Before(deadline); cause, died = s.Death() {
		time.Sleep(10 * time.Millisecond)
	}
	if !died || cause != "exited: signal: killed" {
		t.Fatalf("killed from outside: Death = %q, %v; want exited: signal: killed", cause, died)
	}
	rec := &recordTB{TB: t}
	if !ollamatest.ReportDeath(rec, s) || len(rec.errs) != 1 {
		t.Fatalf("ReportDeath reported %q", rec.errs)
	}
	// A death that is not Ollama's known crash carries no marker, so
	// scripts/test-integration.sh does not run the test again.
	if strings.Contains(rec.errs[0], ollamatest.CrashMarker) || !strings.Contains(rec.errs[0], "died during the test: exited: signal: killed") {
		t.Errorf("ReportDeath said %q", rec.errs[0])
	}
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if cause, died := s.Death(); died {
		t.Errorf("after a restart: Death = %q", cause)
	}
}
