//go:build darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd

package lease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func reserved(t *testing.T, d *Dir, device int) []Record {
	t.Helper()
	rs, err := d.Reserved(device)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// A reservation is its own kind of file: Reserved lists it by device,
// Live never does, and a lease never shows in Reserved.
func TestReservationAcquireReservedRelease(t *testing.T) {
	d := openDir(t, Options{})
	res := acquire(t, d, Record{Device: 1, Bytes: 10 << 30, For: "ComfyUI render 42", ForPID: 77, ForBase: 1 << 30, Note: "phase prompts"})
	l := acquire(t, d, Record{Server: "127.0.0.1:11434", Model: "qwen3:8b"})
	r := res.Record()
	if r.Path != filepath.Join(d.Path(), r.ID+".reserve") || r.Server != "" || r.Model != "" || r.PID != os.Getpid() {
		t.Fatalf("reservation Record() = %+v: want <ID>.reserve, no server or model, this pid", r)
	}
	for _, dev := range []int{1, -1} {
		if got := reserved(t, d, dev); len(got) != 1 || got[0] != r {
			t.Fatalf("Reserved(%d) = %+v, want the reservation %+v", dev, got, r)
		}
	}
	if got := reserved(t, d, 0); len(got) != 0 {
		t.Fatalf("Reserved(0) = %+v, want none (the reservation is on device 1)", got)
	}
	if got := live(t, d, "", ""); len(got) != 1 || got[0].ID != l.Record().ID {
		t.Fatalf("Live = %+v, want the lease alone", got)
	}
	if err := res.Release(); err != nil {
		t.Fatal(err)
	}
	if got := reserved(t, d, -1); len(got) != 0 || exists(r.Path) {
		t.Fatalf("Reserved after Release = %+v (file left: %v)", got, exists(r.Path))
	}
	if got := live(t, d, "", ""); len(got) != 1 {
		t.Fatalf("releasing the reservation touched the lease: Live = %+v", got)
	}
}

// A lease on a model may name a recipient (a proxy's client): it is a
// lease, listed by Live with For and ForPID as written, never by
// Reserved; a lease's other reservation fields are refused.
func TestLeaseForARecipient(t *testing.T) {
	d := openDir(t, Options{})
	l := acquire(t, d, Record{Server: "127.0.0.1:11434", Model: "qwen3:8b", For: "chat-ui", ForPID: 77, Note: "HTTP lease"})
	r := l.Record()
	if r.Path != filepath.Join(d.Path(), r.ID+".lease") {
		t.Fatalf("Record() = %+v: want <ID>.lease", r)
	}
	if got := live(t, d, "127.0.0.1:11434", "qwen3:8b"); len(got) != 1 || got[0] != r {
		t.Fatalf("Live = %+v, want the lease %+v", got, r)
	}
	if got := reserved(t, d, -1); len(got) != 0 {
		t.Fatalf("Reserved = %+v, want none", got)
	}
	if _, err := d.Acquire(Record{Server: "s", Model: "m", For: "x", ForBase: 5}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Acquire of a lease with for_base = %v, want ErrMalformed", err)
	}
}

// Extend moves Until with the file locked throughout: another Dir sees
// the reservation live before, at and after, with the new Until; an Until
// in the past ends it for readers; a released Held cannot be extended.
func TestExtend(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	d := openDir(t, Options{Now: clock})
	other, err := Open(Options{Dir: d.Path(), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	h := acquire(t, d, Record{Device: 0, Bytes: 1 << 30, For: "encoder", Until: now.Add(time.Minute)})
	id := h.Record().ID
	if err := h.Extend(d, now.Add(5*time.Minute)); err != nil {
		t.Fatal(err)
	}
	got := reserved(t, other, 0)
	if len(got) != 1 || got[0].ID != id || !got[0].Until.Equal(now.Add(5*time.Minute)) {
		t.Fatalf("Reserved after Extend = %+v, want %s until +5m", got, id)
	}
	entries, _ := os.ReadDir(d.Path())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			t.Fatalf("Extend left a temporary file %s", e.Name())
		}
	}
	// The new descriptor holds the lock: the file is not stale.
	f, err := syscall.Open(h.Record().Path, syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(f, syscall.LOCK_SH|syscall.LOCK_NB); err != syscall.EWOULDBLOCK {
		t.Fatalf("flock of the extended file = %v, want EWOULDBLOCK (held)", err)
	}
	syscall.Close(f)
	if err := h.Extend(d, now.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := reserved(t, other, -1); len(got) != 0 {
		t.Fatalf("Reserved after an Extend into the past = %+v, want none", got)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if err := h.Extend(d, now.Add(time.Hour)); err == nil {
		t.Fatal("Extend of a released Held succeeded")
	}
	if got := reserved(t, other, -1); len(got) != 0 {
		t.Fatalf("Reserved after Release and a refused Extend = %+v", got)
	}
}

// A file removed or replaced by hand is no longer the holder's: Extend
// refuses rather than write a lease nobody asked for.
func TestExtendRemovedFile(t *testing.T) {
	d := openDir(t, Options{})
	h := acquire(t, d, Record{Bytes: 1 << 20, For: "x"})
	if err := os.Remove(h.Record().Path); err != nil {
		t.Fatal(err)
	}
	if err := h.Extend(d, time.Now().Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "no longer") {
		t.Fatalf("Extend of a removed file = %v, want a refusal", err)
	}
	if got := reserved(t, d, -1); len(got) != 0 {
		t.Fatalf("Reserved = %+v: Extend wrote the file back", got)
	}
}

func TestReservationParse(t *testing.T) {
	const head = `{"v":1,"id":"0123456789abcdef","pid":5,"program":"p","created":"2026-12-04T12:00:00Z"`
	for _, tc := range []struct {
		name, rest string
		ok         bool
	}{
		{"reservation", `,"device":1,"bytes":1024,"for":"render","for_pid":9,"for_base":5}`, true},
		{"reservation with a server", `,"server":"127.0.0.1:11434","bytes":1024}`, true},
		{"reservation naming a model", `,"model":"m","bytes":1024}`, false},
		{"negative device", `,"device":-1,"bytes":1024}`, false},
		{"negative bytes", `,"bytes":-1}`, false},
		{"bytes over MaxBytes", `,"bytes":1125899906842625}`, false},
		{"for_base over MaxBytes", `,"bytes":1,"for_base":1125899906842625}`, false},
		{"negative for_pid", `,"bytes":1,"for_pid":-3}`, false},
		{"lease with a device", `,"server":"s","model":"m","device":1}`, false},
		{"lease for a recipient", `,"server":"s","model":"m","for":"x","for_pid":9}`, true},
		{"lease with a uuid", `,"server":"s","model":"m","uuid":"GPU-1"}`, false},
		{"lease with for_base", `,"server":"s","model":"m","for":"x","for_base":5}`, false},
		{"lease with load", `,"server":"s","model":"m","load":"m"}`, false},
		{"lease with a negative for_pid", `,"server":"s","model":"m","for_pid":-1}`, false},
		{"neither model nor bytes", `,"server":"s"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(head + tc.rest))
			if (err == nil) != tc.ok {
				t.Fatalf("Parse = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse = %v, want ErrMalformed", err)
			}
		})
	}
}

// A forged file that says "reservation" under a lease's name (or the
// reverse), live and locked, counts as neither.
func TestReservationUnderWrongName(t *testing.T) {
	d := openDir(t, Options{})
	for _, tc := range []struct{ name, body string }{
		{"0123456789abcdef.lease", `{"v":1,"id":"0123456789abcdef","pid":5,"created":"2026-12-04T12:00:00Z","bytes":1024}`},
		{"fedcba9876543210.reserve", `{"v":1,"id":"fedcba9876543210","pid":5,"created":"2026-12-04T12:00:00Z","server":"s","model":"m"}`},
	} {
		path := filepath.Join(d.Path(), tc.name)
		if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Open(path, syscall.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
			t.Fatal(err)
		}
	}
	if got := reserved(t, d, -1); len(got) != 0 {
		t.Fatalf("Reserved = %+v, want none", got)
	}
	if got := live(t, d, "", ""); len(got) != 0 {
		t.Fatalf("Live = %+v, want none", got)
	}
}

// Lock serializes: a second Lock waits for the first, and ends with its
// ctx when the first is not let go.
func TestLock(t *testing.T) {
	d := openDir(t, Options{})
	unlock, err := d.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := d.Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Lock while held = %v, want the ctx's deadline", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := d.Lock(t.Context())
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Lock returned %v while the first was held", err)
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	if err := <-got; err != nil {
		t.Fatalf("Lock after unlock = %v", err)
	}
	if got := live(t, d, "", ""); len(got) != 0 {
		t.Fatalf("the lock file shows as a lease: %+v", got)
	}
}

// A planted symbolic link at the lock's name is not followed.
func TestLockRefusesSymlink(t *testing.T) {
	d := openDir(t, Options{})
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Symlink(target, filepath.Join(d.Path(), lockName)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Lock(t.Context()); err == nil {
		t.Fatal("Lock followed a symbolic link")
	}
	if exists(target) {
		t.Fatal("Lock created the link's target")
	}
}

// A reservation whose holder is SIGKILLed ends at once.
func TestKilledReservationHolder(t *testing.T) {
	d := openDir(t, Options{})
	cmd := helperCommand(t, d.Path())
	cmd.Env = append(cmd.Env, helperReserveEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	id, err := readLine(out)
	if err != nil || !validID(id) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper said %q, %v; want its reservation ID", id, err)
	}
	if got := reserved(t, d, 1); len(got) != 1 || got[0].ID != id || got[0].PID != cmd.Process.Pid || got[0].Bytes != 10<<30 {
		t.Fatalf("Reserved with the helper holding = %+v", got)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for pass := 0; ; pass++ {
		if got := reserved(t, d, -1); len(got) == 0 {
			break
		} else if pass == 50 {
			t.Fatalf("Reserved 50 ms after the holder was killed = %+v", got)
		}
		time.Sleep(time.Millisecond)
	}
	if exists(filepath.Join(d.Path(), id+".reserve")) {
		t.Fatal("the killed holder's reservation file is still there")
	}
}
