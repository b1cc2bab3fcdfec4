//go:build darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd

package lease

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestAcquireLiveRelease(t *testing.T) {
	d := openDir(t, Options{})
	before := time.Now().UTC()
	h := acquire(t, d, Record{Server: "http://LOCALHOST:11434/", Model: "qwen3:8b", Note: "caption", Version: 7, PID: 1})
	r := h.Record()
	if r.Version != 1 || !validID(r.ID) || r.PID != os.Getpid() || r.Server != "127.0.0.1:11434" ||
		r.Program != filepath.Base(os.Args[0]) || r.Created.Before(before) || r.Created.Location() != time.UTC || !r.Until.IsZero() ||
		r.Path != filepath.Join(d.Path(), r.ID+".lease") || r.UID != os.Geteuid() {
		t.Fatalf("Record() = %+v: fields not filled as documented", r)
	}
	fi, err := os.Lstat(r.Path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("lease file: %v, %v; want mode 0600", fi, err)
	}
	entries, _ := os.ReadDir(d.Path())
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want the lease alone (no temporary file)", len(entries))
	}

	for _, q := range [][2]string{{"", ""}, {"localhost", ""}, {"127.0.0.1:11434", "qwen3:8b"}, {"http://127.0.0.1", "qwen3:8b"}} {
		got := live(t, d, q[0], q[1])
		if len(got) != 1 || got[0] != r {
			t.Fatalf("Live(%q, %q) = %+v, want the lease as Record() says %+v", q[0], q[1], got, r)
		}
	}
	for _, q := range [][2]string{{"127.0.0.1:11435", ""}, {"", "qwen3:4b"}, {"other:11434", "qwen3:8b"}} {
		if got := live(t, d, q[0], q[1]); len(got) != 0 {
			t.Fatalf("Live(%q, %q) = %+v, want none", q[0], q[1], got)
		}
	}

	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if exists(r.Path) {
		t.Fatal("Release left the file")
	}
	if err := h.Release(); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	if got := live(t, d, "", ""); len(got) != 0 {
		t.Fatalf("Live after Release = %+v", got)
	}
}

func TestAcquireRefuses(t *testing.T) {
	d := openDir(t, Options{})
	tests := []struct {
		name string
		r    Record
	}{
		{"no server", Record{Model: "m"}},
		{"no model", Record{Server: "h"}},
		{"too long for a file", Record{Server: "h", Model: "m", Note: strings.Repeat("n", MaxFileBytes)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := d.Acquire(tt.r)
			if !errors.Is(err, ErrMalformed) || h != nil {
				t.Fatalf("Acquire = %v, %v; want ErrMalformed", h, err)
			}
		})
	}
	if entries, _ := os.ReadDir(d.Path()); len(entries) != 0 {
		t.Fatalf("refused Acquires left %d files", len(entries))
	}
	d2 := openDir(t, Options{Now: func() time.Time { return time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }})
	if _, err := d2.Acquire(Record{Server: "h", Model: "m"}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Acquire with a clock in year 10000 = %v, want ErrMalformed (the file would not parse)", err)
	}
}

func TestLiveOrder(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := base
	d := openDir(t, Options{Now: func() time.Time { return clock }})
	take := func(created time.Time, until time.Time, model string) string {
		clock = created
		return acquire(t, d, Record{Server: "s", Model: model, Until: until}).Record().ID
	}
	forever2 := take(base.Add(2*time.Second), time.Time{}, "a")
	forever1 := take(base.Add(1*time.Second), time.Time{}, "b")
	soon := take(base.Add(3*time.Second), base.Add(time.Hour), "a")
	sooner := take(base.Add(4*time.Second), base.Add(time.Minute), "c")
	clock = base
	if got, want := ids(live(t, d, "", "")), []string{sooner, soon, forever1, forever2}; !slices.Equal(got, want) {
		t.Fatalf("Live order = %v, want %v (by Until, zero last, then Created)", got, want)
	}
	if got, want := ids(live(t, d, "s", "a")), []string{soon, forever2}; !slices.Equal(got, want) {
		t.Fatalf("Live(s, a) = %v, want %v", got, want)
	}
}

// TestSecondHolderInProcess: flock belongs to the open file description,
// so a second open in this process plays another holder.
func TestSecondHolderInProcess(t *testing.T) {
	d := openDir(t, Options{})
	r := sample("00000000000000aa", "m")
	path := writeRecord(t, d.Path(), r)
	letGo := hold(t, path)
	got := live(t, d, "", "m")
	r.Path, r.UID = path, os.Geteuid()
	if len(got) != 1 || got[0] != r {
		t.Fatalf("Live = %+v, want the held file %+v", got, r)
	}
	letGo()
	if got := live(t, d, "", ""); len(got) != 0 || exists(path) {
		t.Fatalf("Live after the holder let go = %+v (file there: %v), want none and the file removed", got, exists(path))
	}
}

// TestReadersDoNotLookAlive: a concurrent Live pass holding its test lock
// on a stale file must not make it look held. Live tests with LOCK_SH,
// which another reader's LOCK_SH does not block; LOCK_EX would.
func TestReadersDoNotLookAlive(t *testing.T) {
	d := openDir(t, Options{})
	path := writeRecord(t, d.Path(), sample("00000000000000bb", "m"))
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Flock(fd, syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if got := live(t, d, "", ""); len(got) != 0 || exists(path) {
		t.Fatalf("Live with another reader's shared lock = %+v (file there: %v), want the stale file removed", got, exists(path))
	}
}

// TestKilledHolder runs a real second process (this test binary again)
// that acquires a lease and waits; Live sees the lease, then the process
// is killed with SIGKILL and, once reaped, the lease is gone.
func TestKilledHolder(t *testing.T) {
	d := openDir(t, Options{})
	cmd := helperCommand(t, d.Path())
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
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	id, err := readLine(out)
	if err != nil || !validID(id) {
		t.Fatalf("helper said %q, %v; want its lease ID", id, err)
	}
	got := live(t, d, "", helperModel)
	if len(got) != 1 || got[0].ID != id || got[0].PID != cmd.Process.Pid || got[0].Program != filepath.Base(os.Args[0]) {
		t.Fatalf("Live with the helper holding = %+v; want its lease %s, pid %d", got, id, cmd.Process.Pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // reaped: the kernel has run its exit, descriptors closed
	killed = true
	// The exit closes the descriptor before the parent can reap the child,
	// so the first pass should see it gone; a few more passes, 1 ms apart,
	// counted from the reaping, allow for a kernel that defers the close.
	for pass := 0; ; pass++ {
		got = live(t, d, "", "")
		if len(got) == 0 {
			t.Logf("lease gone %d passes after the holder was reaped", pass)
			break
		}
		if pass == 50 {
			t.Fatalf("Live 50 ms after the holder was killed and reaped = %+v, want none", got)
		}
		time.Sleep(time.Millisecond)
	}
	if exists(filepath.Join(d.Path(), id+".lease")) {
		t.Fatal("the killed holder's file is still there after Live")
	}
}

func TestRelease(t *testing.T) {
	t.Run("concurrent", func(t *testing.T) {
		d := openDir(t, Options{})
		h := acquire(t, d, Record{Server: "s", Model: "m"})
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = h.Release() })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if exists(h.Record().Path) {
			t.Fatal("file left")
		}
	})
	t.Run("file removed by hand", func(t *testing.T) {
		d := openDir(t, Options{})
		h := acquire(t, d, Record{Server: "s", Model: "m"})
		if err := os.Remove(h.Record().Path); err != nil {
			t.Fatal(err)
		}
		if err := h.Release(); err != nil {
			t.Fatalf("Release = %v, want nil", err)
		}
	})
	t.Run("path replaced by another file", func(t *testing.T) {
		d := openDir(t, Options{})
		h := acquire(t, d, Record{Server: "s", Model: "m"})
		p := h.Record().Path
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		writeFile(t, d.Path(), filepath.Base(p), []byte("someone else's"))
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
		if !exists(p) {
			t.Fatal("Release removed a file that was not its own")
		}
	})
}

// TestRobustness: files that are not a trusted lease are skipped, logged
// once, never taken for a lease, never an error, never a panic; the good
// lease beside them is still found.
func TestRobustness(t *testing.T) {
	valid := func() []byte {
		b, err := encode(sample("00000000000000cc", "m"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	type setup func(t *testing.T, dir string) (path string, skip string)
	file := func(name string, content []byte, held bool) setup {
		return func(t *testing.T, dir string) (string, string) {
			p := writeFile(t, dir, name, content)
			if held {
				hold(t, p)
			}
			return p, ""
		}
	}
	tests := []struct {
		name   string
		setup  setup
		level  slog.Level // of the one log record about the file
		msg    string     // what it says, in part
		remove bool       // Live removes the file
	}{
		{"garbage file, held", file("00000000000000cc.lease", []byte("\x00\xffgarbage\n"), true), slog.LevelWarn, "not a lease", false},
		{"garbage file, stale", file("00000000000000cc.lease", []byte("\x00\xffgarbage\n"), false), slog.LevelDebug, "stale lease", true},
		{"truncated JSON, held", file("00000000000000cc.lease", valid[:len(valid)/2], true), slog.LevelWarn, "not a lease", false},
		{"empty file, held", file("00000000000000cc.lease", nil, true), slog.LevelWarn, "not a lease", false},
		{"v 2, held", file("00000000000000cc.lease", []byte(strings.Replace(string(valid), `"v":1`, `"v":2`, 1)), true), slog.LevelWarn, "not a lease", false},
		{"name is not its id, held", file("00000000000000dd.lease", valid, true), slog.LevelWarn, "name is not", false},
		{"huge file", file("00000000000000cc.lease", append(valid, make([]byte, 1<<20)...), true), slog.LevelWarn, "larger than MaxFileBytes", false},
		{"one byte over MaxFileBytes", file("00000000000000cc.lease", append(valid, make([]byte, MaxFileBytes+1-len(valid))...), true), slog.LevelWarn, "larger than MaxFileBytes", false},
		{"file owned by another uid", func(t *testing.T, dir string) (string, string) {
			if os.Geteuid() != 0 {
				return "", "needs root to chown a file to another uid; as uid " + strconv.Itoa(os.Geteuid()) + " no file of another user can be made"
			}
			p := writeFile(t, dir, "00000000000000cc.lease", valid)
			hold(t, p)
			if err := os.Chown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, slog.LevelWarn, "another user's file", false},
		{"symlink to a live lease elsewhere", func(t *testing.T, dir string) (string, string) {
			target := writeFile(t, t.TempDir(), "00000000000000cc.lease", valid)
			hold(t, target)
			p := filepath.Join(dir, "00000000000000cc.lease")
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, slog.LevelWarn, "symbolic link", false},
		{"dangling symlink", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "00000000000000cc.lease")
			if err := os.Symlink(filepath.Join(dir, "nowhere"), p); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, slog.LevelWarn, "symbolic link", false},
		{"FIFO (would block a plain open)", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "00000000000000cc.lease")
			if err := syscall.Mknod(p, syscall.S_IFIFO|0o600, 0); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, slog.LevelWarn, "not a regular file", false},
		{"directory", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "00000000000000cc.lease")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, slog.LevelWarn, "not a regular file", false},
		{"temporary file that is a symlink", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, ".tmp-00000000000000cc")
			if err := os.Symlink("/etc/passwd", p); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, slog.LevelWarn, "symbolic link", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := newCapture()
			d := openDir(t, Options{Logger: slog.New(logs)})
			good := acquire(t, d, Record{Server: "s", Model: "m"}).Record()
			path, skip := tt.setup(t, d.Path())
			if skip != "" {
				t.Skip(skip)
			}
			for pass := range 3 {
				got := live(t, d, "", "")
				if len(got) != 1 || got[0] != good {
					t.Fatalf("pass %d: Live = %+v, want only the good lease %s", pass, got, good.ID)
				}
			}
			if exists(path) == tt.remove {
				t.Fatalf("file there after Live: %v, want %v", exists(path), !tt.remove)
			}
			recs := logs.of(path)
			if len(recs) != 1 || recs[0].level != tt.level || !strings.Contains(recs[0].msg, tt.msg) {
				t.Fatalf("logged about %s: %+v; want one record at %v saying %q (once per path, three passes)", path, recs, tt.level, tt.msg)
			}
			t.Logf("logged %v %q", recs[0].level, recs[0].msg)
			if len(logs.of(good.Path)) != 0 {
				t.Fatalf("logged about the good lease: %+v", logs.of(good.Path))
			}
		})
	}
}

// TestSharedGroup: in a Shared directory another user's lease counts when
// its group is the directory's, and not when it is another.
func TestSharedGroup(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "leases")
	if err := os.Mkdir(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	shared := openDir(t, Options{Dir: dir, Shared: true})
	own := acquire(t, shared, Record{Server: "s", Model: "m"}).Record()
	if fi, _ := os.Lstat(own.Path); fi.Mode().Perm() != 0o640 {
		t.Fatalf("Shared lease file mode %04o, want 0640 (group members test its lock)", fi.Mode().Perm())
	}
	if os.Geteuid() != 0 {
		t.Skip("the rest needs root to make a file of another uid")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	ours := writeRecord(t, dir, sample("00000000000000e1", "m"))
	theirs := writeRecord(t, dir, sample("00000000000000e2", "m"))
	for p, gid := range map[string]int{ours: int(st.Gid), theirs: 65534} {
		hold(t, p)
		if err := os.Chown(p, 65534, gid); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := ids(live(t, shared, "", "")), []string{"00000000000000e1", own.ID}; !slices.Equal(got, want) {
		t.Fatalf("Shared Live = %v, want %v (another uid of the directory's group counts)", got, want)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	private := openDir(t, Options{Dir: dir})
	if got, want := ids(live(t, private, "", "")), []string{own.ID}; !slices.Equal(got, want) {
		t.Fatalf("private Live = %v, want %v (only our own files)", got, want)
	}
}

func TestOpenUnsafeDir(t *testing.T) {
	root := os.Geteuid() == 0
	tests := []struct {
		name   string
		shared bool
		setup  func(t *testing.T) string // the Dir to open
		unsafe bool
		skip   string
	}{
		{"missing is created 0700", false, func(t *testing.T) string { return filepath.Join(t.TempDir(), "a", "b") }, false, ""},
		{"0700", false, mkdir(0o700), false, ""},
		{"0777", false, mkdir(0o777), true, ""},
		{"0750", false, mkdir(0o750), true, ""},
		{"0701", false, mkdir(0o701), true, ""},
		{"Shared 0770", true, mkdir(0o770), false, ""},
		{"Shared 0750", true, mkdir(0o750), false, ""},
		{"Shared 0777", true, mkdir(0o777), true, ""},
		{"Shared 0771", true, mkdir(0o771), true, ""},
		{"a symlink to a good directory", false, func(t *testing.T) string {
			target := mkdir(0o700)(t)
			p := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			return p
		}, true, ""},
		{"a regular file", false, func(t *testing.T) string { return writeFile(t, t.TempDir(), "f", nil) }, true, ""},
		{"owned by another uid", false, chowned(65534, 65534), true, skipUnlessRoot(root)},
		{"Shared, owned by another uid of another group", true, chowned(65534, 65534), true, skipUnlessRoot(root)},
		{"Shared, owned by another uid of our group", true, chowned(65534, os.Getegid()), false, skipUnlessRoot(root)},
		{"parent writable by others, not sticky", false, func(t *testing.T) string {
			parent := mkdir(0o777)(t)
			return filepath.Join(parent, "leases")
		}, true, ""},
		{"parent writable by others and sticky (as /tmp)", false, func(t *testing.T) string {
			parent := mkdir(0o777 | os.ModeSticky)(t)
			return filepath.Join(parent, "leases")
		}, false, ""},
		{"parent owned by another uid", false, func(t *testing.T) string {
			parent := chowned(65534, 65534)(t)
			p := filepath.Join(parent, "leases")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		}, true, skipUnlessRoot(root)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.skip != "" {
				t.Skip(tt.skip)
			}
			path := tt.setup(t)
			d, err := Open(Options{Dir: path, Shared: tt.shared})
			if tt.unsafe {
				var e *Error
				if !errors.Is(err, ErrUnsafeDir) || !errors.As(err, &e) || e.Op != "open" || d != nil {
					t.Fatalf("Open = %v, %v; want an *Error of Kind ErrUnsafeDir", d, err)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("Open = %v", err)
			}
			fi, err := os.Lstat(d.Path())
			if err != nil || !fi.IsDir() {
				t.Fatalf("Path() %s: %v", d.Path(), err)
			}
			if _, err := d.Live("", ""); err != nil {
				t.Fatalf("Live in a directory Open accepted: %v", err)
			}
		})
	}
}

func mkdir(mode os.FileMode) func(t *testing.T) string {
	return func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "d")
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		return p
	}
}

func chowned(uid, gid int) func(t *testing.T) string {
	return func(t *testing.T) string {
		p := mkdir(0o770)(t)
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

func skipUnlessRoot(root bool) string {
	if root {
		return ""
	}
	return "needs root to chown a directory to another uid"
}

// TestDirChangedAfterOpen: Live and Acquire check the directory again.
func TestDirChangedAfterOpen(t *testing.T) {
	t.Run("made 0777", func(t *testing.T) {
		d := openDir(t, Options{})
		if err := os.Chmod(d.Path(), 0o777); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Live("", ""); !errors.Is(err, ErrUnsafeDir) {
			t.Fatalf("Live = %v, want ErrUnsafeDir", err)
		}
		if _, err := d.Acquire(Record{Server: "s", Model: "m"}); !errors.Is(err, ErrUnsafeDir) {
			t.Fatalf("Acquire = %v, want ErrUnsafeDir", err)
		}
	})
	t.Run("replaced", func(t *testing.T) {
		d := openDir(t, Options{})
		if err := os.Rename(d.Path(), d.Path()+".old"); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(d.Path(), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Live("", ""); !errors.Is(err, ErrUnsafeDir) {
			t.Fatalf("Live = %v, want ErrUnsafeDir", err)
		}
	})
	t.Run("replaced by a symlink", func(t *testing.T) {
		d := openDir(t, Options{})
		if err := os.Rename(d.Path(), d.Path()+".old"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(d.Path()+".old", d.Path()); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Live("", ""); !errors.Is(err, ErrUnsafeDir) {
			t.Fatalf("Live = %v, want ErrUnsafeDir", err)
		}
		if _, err := d.Acquire(Record{Server: "s", Model: "m"}); !errors.Is(err, ErrUnsafeDir) {
			t.Fatalf("Acquire = %v, want ErrUnsafeDir", err)
		}
	})
	t.Run("removed", func(t *testing.T) {
		d := openDir(t, Options{})
		if err := os.Remove(d.Path()); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Live("", ""); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Live = %v, want ErrNotExist", err)
		}
	})
}

func TestDefaultDir(t *testing.T) {
	euid := strconv.Itoa(os.Geteuid())
	t.Run("XDG_RUNTIME_DIR", func(t *testing.T) {
		xdg := t.TempDir()
		t.Setenv("XDG_RUNTIME_DIR", xdg)
		d, err := Open(Options{})
		if err != nil || d.Path() != filepath.Join(xdg, "vramguard", "leases") {
			t.Fatalf("Open = %v, %v; want %s", d, err, filepath.Join(xdg, "vramguard", "leases"))
		}
	})
	t.Run("no XDG_RUNTIME_DIR", func(t *testing.T) {
		tmp := t.TempDir()
		t.Setenv("XDG_RUNTIME_DIR", "")
		t.Setenv("TMPDIR", tmp)
		d, err := Open(Options{})
		if want := filepath.Join(tmp, "vramguard-"+euid, "leases"); err != nil || d.Path() != want {
			t.Fatalf("Open = %v, %v; want %s", d, err, want)
		}
	})
	t.Run("relative XDG_RUNTIME_DIR is ignored", func(t *testing.T) {
		tmp := t.TempDir()
		t.Setenv("XDG_RUNTIME_DIR", "run")
		t.Setenv("TMPDIR", tmp)
		d, err := Open(Options{})
		if want := filepath.Join(tmp, "vramguard-"+euid, "leases"); err != nil || d.Path() != want {
			t.Fatalf("Open = %v, %v; want %s", d, err, want)
		}
	})
}

// TestClockJump: the reader's clock decides only Until; a lease of zero
// Until, or created "in the future", stays live whatever the clock says.
func TestClockJump(t *testing.T) {
	now := time.Now()
	dir := filepath.Join(t.TempDir(), "leases")
	real := openDir(t, Options{Dir: dir})
	forever := acquire(t, real, Record{Server: "s", Model: "forever"}).Record()
	hour := acquire(t, real, Record{Server: "s", Model: "hour", Until: now.Add(time.Hour)}).Record()
	past := acquire(t, real, Record{Server: "s", Model: "past", Until: now.Add(-time.Minute)}).Record()
	ahead := openDir(t, Options{Dir: dir, Now: func() time.Time { return now.AddDate(50, 0, 0) }})
	future := acquire(t, ahead, Record{Server: "s", Model: "created in the future"}).Record()
	tests := []struct {
		name string
		now  time.Time
		want []string
	}{
		{"real clock", now, []string{hour.ID, forever.ID, future.ID}},
		{"100 years ahead", now.AddDate(100, 0, 0), []string{forever.ID, future.ID}},
		{"100 years back", now.AddDate(-100, 0, 0), []string{past.ID, hour.ID, forever.ID, future.ID}},
		{"one second after past's Until", past.Until.Add(time.Second), []string{hour.ID, forever.ID, future.ID}},
		{"at past's Until", past.Until, []string{hour.ID, forever.ID, future.ID}},
		{"just before past's Until", past.Until.Add(-time.Nanosecond), []string{past.ID, hour.ID, forever.ID, future.ID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := openDir(t, Options{Dir: dir, Now: func() time.Time { return tt.now }})
			if got := ids(live(t, d, "", "")); !slices.Equal(got, tt.want) {
				t.Fatalf("Live = %v, want %v", got, tt.want)
			}
		})
	}
	if !exists(past.Path) {
		t.Fatal("Live removed an expired lease whose holder lives: its holder releases it")
	}
}

func TestTempFiles(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name   string
		age    time.Duration // mtime before now
		held   bool
		clock  time.Duration // the reader's clock, from now
		remove bool
	}{
		{"fresh, unlocked: an Acquire under way", 0, false, 0, false},
		{"59s old, unlocked", 59 * time.Second, false, 0, false},
		{"2m old, unlocked: abandoned", 2 * time.Minute, false, 0, true},
		{"2m old, locked: a holder stuck before its rename", 2 * time.Minute, true, 0, false},
		{"fresh, clock far back", 0, false, -24 * time.Hour, false},
		{"fresh, unlocked, clock an hour ahead", 0, false, time.Hour, true},
		{"fresh, locked, clock an hour ahead", 0, true, time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := newCapture()
			d := openDir(t, Options{Logger: slog.New(logs), Now: func() time.Time { return now.Add(tt.clock) }})
			p := writeFile(t, d.Path(), ".tmp-00000000000000ff", []byte(`{"v":1`))
			if err := os.Chtimes(p, now.Add(-tt.age), now.Add(-tt.age)); err != nil {
				t.Fatal(err)
			}
			if tt.held {
				hold(t, p)
			}
			if got := live(t, d, "", ""); len(got) != 0 {
				t.Fatalf("Live = %+v, want none: a temporary file is never a lease", got)
			}
			if exists(p) == tt.remove {
				t.Fatalf("file there after Live: %v, want %v", exists(p), !tt.remove)
			}
			for _, l := range logs.of(p) {
				if l.level > slog.LevelDebug {
					t.Fatalf("logged %+v: a temporary file of ours is no warning", l)
				}
			}
		})
	}
}

// TestManyStale: 5,000 files of dead holders are all removed by one Live,
// and the next Live, on the emptied directory, costs a small fraction of
// it (a baseline taken in the same run, not a wall-clock figure).
func TestManyStale(t *testing.T) {
	logs := newCapture()
	d := openDir(t, Options{Logger: slog.New(logs)})
	makeStale(t, d.Path(), 5000)
	h := acquire(t, d, Record{Server: "s", Model: "m"})
	start := time.Now()
	got := live(t, d, "", "")
	first := time.Since(start)
	if len(got) != 1 || got[0].ID != h.Record().ID {
		t.Fatalf("Live = %d leases, want the one held", len(got))
	}
	if entries, _ := os.ReadDir(d.Path()); len(entries) != 1 {
		t.Fatalf("%d entries left after Live, want the held lease alone", len(entries))
	}
	second := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		live(t, d, "", "")
		second = min(second, time.Since(start))
	}
	t.Logf("first Live (5000 stale): %v, next: %v", first, second)
	if second > first/10 {
		t.Fatalf("Live on the emptied directory took %v, over a tenth of the pass that removed 5000 files (%v)", second, first)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if n := len(*logs.recs); n != 5000 {
		t.Fatalf("%d log records, want 5000 (one Debug per removed file)", n)
	}
}

// makeStale writes n lease files of dead holders into dir.
func makeStale(t testing.TB, dir string, n int) {
	t.Helper()
	for i := range n {
		writeRecord(t, dir, sample(fmt.Sprintf("%016x", i+1), "m"))
	}
}

// TestConcurrent: many goroutines acquire, list and release at once (run
// with -race); each sees its own lease while it holds it and not after.
func TestConcurrent(t *testing.T) {
	d := openDir(t, Options{Logger: slog.New(newCapture())})
	other := openDir(t, Options{Dir: d.Path()}) // a second Dir on the same directory
	const workers, rounds = 16, 30
	var wg sync.WaitGroup
	errs := make(chan error, workers*2)
	for w := range workers {
		wg.Go(func() {
			model := fmt.Sprintf("m%d", w)
			dd := d
			if w%2 == 1 {
				dd = other
			}
			for range rounds {
				h, err := dd.Acquire(Record{Server: "s", Model: model})
				if err != nil {
					errs <- err
					return
				}
				recs, err := dd.Live("s", model)
				if err != nil || len(recs) != 1 || recs[0].ID != h.Record().ID {
					errs <- fmt.Errorf("worker %d: Live while holding = %v, %v", w, ids(recs), err)
					return
				}
				var inner sync.WaitGroup
				for range 2 {
					inner.Go(func() {
						if err := h.Release(); err != nil {
							errs <- err
						}
					})
				}
				inner.Wait()
				recs, err = dd.Live("s", model)
				if err != nil || len(recs) != 0 {
					errs <- fmt.Errorf("worker %d: Live after Release = %v, %v", w, ids(recs), err)
					return
				}
			}
		})
		wg.Go(func() { // a reader of everything
			for range rounds {
				if _, err := d.Live("", ""); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if entries, _ := os.ReadDir(d.Path()); len(entries) != 0 {
		t.Fatalf("%d files left", len(entries))
	}
}

func BenchmarkLiveEmpty(b *testing.B) {
	d := openDir(b, Options{})
	for b.Loop() {
		if _, err := d.Live("", ""); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLive10Held(b *testing.B) {
	d := openDir(b, Options{})
	for i := range 10 {
		acquire(b, d, Record{Server: "s", Model: fmt.Sprintf("m%d", i)})
	}
	for b.Loop() {
		if recs, err := d.Live("s", ""); err != nil || len(recs) != 10 {
			b.Fatal(len(recs), err)
		}
	}
}

// BenchmarkLive5000Stale: one Live pass that removes 5,000 stale files
// (the files are made with the timer stopped).
func BenchmarkLive5000Stale(b *testing.B) {
	d := openDir(b, Options{})
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		makeStale(b, d.Path(), 5000)
		b.StartTimer()
		if recs, err := d.Live("", ""); err != nil || len(recs) != 0 {
			b.Fatal(len(recs), err)
		}
	}
}

// An ID the caller chose (NewID's) is the lease's, so that the caller
// knows it before the file exists; one that is not 16 lower-case hex
// digits is refused, and nothing is written.
func TestAcquireKeepsTheCallersID(t *testing.T) {
	d := openDir(t, Options{})
	id, err := NewID()
	if err != nil || !validID(id) {
		t.Fatalf("NewID() = %q, %v", id, err)
	}
	h := acquire(t, d, Record{Server: "127.0.0.1:11434", Model: "qwen3:8b", ID: id})
	if r := h.Record(); r.ID != id || r.Path != filepath.Join(d.Path(), id+".lease") {
		t.Fatalf("Record() = %+v; want the ID %s", r, id)
	}
	for _, bad := range []string{"FFFFFFFFFFFFFFFF", "fff", "../../etc/passw", "ffffffffffffffffff"} {
		if _, err := d.Acquire(Record{Server: "127.0.0.1:11434", Model: "qwen3:8b", ID: bad}); !errors.Is(err, ErrMalformed) {
			t.Errorf("Acquire with ID %q: %v; want ErrMalformed", bad, err)
		}
	}
	if entries, _ := os.ReadDir(d.Path()); len(entries) != 1 {
		t.Fatalf("%d files in the directory; want the one lease", len(entries))
	}
}
