//go:build darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd

package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tempMaxAge is how long a temporary file may stay unlocked before Live
// removes it: Acquire holds its lock from a moment after creating it.
const tempMaxAge = time.Minute

// Dir is an open lease directory. Its methods are safe for concurrent use
// by many goroutines; many Dirs, in one process or many, may use one
// directory. A Dir holds no file open between calls and needs no Close.
type Dir struct {
	path     string
	shared   bool
	euid     int
	gid      int // the directory's group: the one that shares (Shared)
	dev, ino uint64
	perm     uint32 // of new lease files
	log      *slog.Logger
	now      func() time.Time

	mu     sync.Mutex
	logged map[string]string // path → reason last logged
}

// Open opens the lease directory of opts, creating it (mode 0700, and its
// parents) when missing. It refuses, with an *Error of Kind ErrUnsafeDir, a
// directory that is a symbolic link or not a directory, that belongs to
// another user (Shared: unless its group is one of ours), or that grants
// its group or others any access (Shared: others any access); and one whose
// parent belongs to someone other than the caller, root (or, Shared, the
// directory's owner) or that others may write to without the sticky bit
// (as /tmp has), since whoever may rename the directory may replace it.
// Acquire and Live check the directory again (mode, owner, and that the
// path still names the directory Open checked) and fail the same way.
func Open(opts Options) (*Dir, error) {
	const op = "open"
	path := opts.Dir
	if path == "" {
		path = defaultDir()
	}
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, &Error{Op: op, Path: opts.Dir, Err: err}
	}
	d := &Dir{
		path:   path,
		shared: opts.Shared,
		euid:   os.Geteuid(),
		perm:   0o600,
		log:    opts.Logger,
		now:    opts.Now,
		logged: make(map[string]string),
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.shared {
		d.perm = 0o640 // group members open it to test its lock
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(path, 0o700); err != nil {
			return nil, &Error{Op: op, Path: path, Err: err}
		}
		fi, err = os.Lstat(path)
	}
	if err != nil {
		return nil, &Error{Op: op, Path: path, Err: err}
	}
	if err := d.checkDir(fi); err != nil {
		return nil, &Error{Op: op, Path: path, Kind: ErrUnsafeDir, Err: err}
	}
	st := fi.Sys().(*syscall.Stat_t)
	d.dev, d.ino, d.gid = uint64(st.Dev), uint64(st.Ino), int(st.Gid)
	if err := d.checkParent(filepath.Dir(path), int(st.Uid)); err != nil {
		return nil, &Error{Op: op, Path: path, Kind: ErrUnsafeDir, Err: err}
	}
	return d, nil
}

// defaultDir is $XDG_RUNTIME_DIR/vramguard/leases where XDG_RUNTIME_DIR is
// absolute and ours (under sudo it may still name the invoking user's),
// else <tmp>/vramguard-<euid>/leases.
func defaultDir() string {
	euid := os.Geteuid()
	if x := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(x) {
		if fi, err := os.Stat(x); err == nil && fi.IsDir() && int(fi.Sys().(*syscall.Stat_t).Uid) == euid {
			return filepath.Join(x, "vramguard", "leases")
		}
	}
	return filepath.Join(os.TempDir(), "vramguard-"+strconv.Itoa(euid), "leases")
}

// checkDir applies Open's rules to the directory's Lstat.
func (d *Dir) checkDir(fi fs.FileInfo) error {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return errors.New("is a symbolic link")
	}
	if !fi.IsDir() {
		return errors.New("is not a directory")
	}
	return d.checkDirStat(fi.Sys().(*syscall.Stat_t))
}

// checkDirStat applies Open's owner and mode rules to a directory's stat.
func (d *Dir) checkDirStat(st *syscall.Stat_t) error {
	uid, perm := int(st.Uid), uint32(st.Mode)&0o777
	if !d.shared {
		if uid != d.euid {
			return fmt.Errorf("belongs to uid %d, not %d", uid, d.euid)
		}
		if perm&0o077 != 0 {
			return fmt.Errorf("mode %04o lets group or others in (want 0700; Shared allows 0770)", perm)
		}
		return nil
	}
	if perm&0o007 != 0 {
		return fmt.Errorf("mode %04o lets others in (Shared allows at most 0770)", perm)
	}
	if uid != d.euid && !inGroup(int(st.Gid)) {
		return fmt.Errorf("belongs to uid %d and group %d, which is not one of ours", uid, st.Gid)
	}
	return nil
}

// checkParent refuses a parent directory whose owner or writers could
// swap the lease directory for another.
func (d *Dir) checkParent(parent string, dirOwner int) error {
	fi, err := os.Stat(parent)
	if err != nil {
		return fmt.Errorf("parent %s: %w", parent, err)
	}
	uid := int(fi.Sys().(*syscall.Stat_t).Uid)
	if uid != d.euid && uid != 0 && (!d.shared || uid != dirOwner) {
		return fmt.Errorf("parent %s belongs to uid %d", parent, uid)
	}
	if fi.Mode().Perm()&0o002 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("parent %s (mode %04o) is writable by others and not sticky", parent, fi.Mode().Perm())
	}
	return nil
}

func inGroup(gid int) bool {
	if gid == os.Getegid() {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, gid)
}

// verify checks the directory again before a use: same rules, same inode.
func (d *Dir) verify(op string) error {
	fi, err := os.Lstat(d.path)
	if err != nil {
		return &Error{Op: op, Path: d.path, Err: err}
	}
	if err := d.checkDir(fi); err != nil {
		return &Error{Op: op, Path: d.path, Kind: ErrUnsafeDir, Err: err}
	}
	if st := fi.Sys().(*syscall.Stat_t); uint64(st.Dev) != d.dev || uint64(st.Ino) != d.ino {
		return &Error{Op: op, Path: d.path, Kind: ErrUnsafeDir, Err: errors.New("replaced since Open")}
	}
	return nil
}

// readNames lists the directory, checking it as verify does, but on the
// descriptor it reads, so that nothing can swap it between check and read.
// (os.Open would also cost four fcntl calls and an epoll_ctl per pass.)
func (d *Dir) readNames(op string) ([]string, error) {
	var fd int
	err := eintr(func() (err error) {
		fd, err = syscall.Open(d.path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		return err
	})
	if err == syscall.ELOOP || err == syscall.ENOTDIR {
		if verr := d.verify(op); verr != nil {
			return nil, verr // says why
		}
	}
	if err != nil {
		return nil, &Error{Op: op, Path: d.path, Err: &fs.PathError{Op: "open", Path: d.path, Err: err}}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, &Error{Op: op, Path: d.path, Err: &fs.PathError{Op: "fstat", Path: d.path, Err: err}}
	}
	if err := d.checkDirStat(&st); err != nil {
		return nil, &Error{Op: op, Path: d.path, Kind: ErrUnsafeDir, Err: err}
	}
	if uint64(st.Dev) != d.dev || uint64(st.Ino) != d.ino {
		return nil, &Error{Op: op, Path: d.path, Kind: ErrUnsafeDir, Err: errors.New("replaced since Open")}
	}
	var names []string
	buf := make([]byte, 8<<10)
	for {
		var n int
		err := eintr(func() (err error) { n, err = syscall.ReadDirent(fd, buf); return err })
		if err != nil {
			return nil, &Error{Op: op, Path: d.path, Err: &fs.PathError{Op: "readdirent", Path: d.path, Err: err}}
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
}

// Path returns the directory's absolute path.
func (d *Dir) Path() string { return d.path }

// Held is a lease this process holds: an open, exclusively locked file
// descriptor on the lease file. The lease lasts until Release or until the
// process ends, however it ends. Dropping a Held without Release does not
// end the lease (no finalizer closes the descriptor): release it. The
// descriptor is close-on-exec, so a child process does not inherit the
// lease. Held is safe for concurrent use.
type Held struct {
	rec Record

	mu       sync.Mutex
	fd       int
	released bool
	err      error
}

// Acquire takes a lease on r.Model at r.Server, or with r.Bytes above
// zero a reservation of r.Bytes on r.Device, and returns it held. It sets
// r.Version to 1, a fresh random ID, PID to this process, Created to
// Options.Now (UTC), Program to filepath.Base(os.Args[0]) if empty, and
// r.Server to NormalizeServer(r.Server) (when not empty); any value given
// for Version, PID or Created is replaced. r.ID is kept when set (one of
// NewID's, so that the caller knows the lease's ID before its file
// exists; ErrMalformed when it is not 16 lower-case hex digits), else made. A lease needs a Server and
// a Model, a reservation no Model, and the record must encode in
// MaxFileBytes (else ErrMalformed). Until may be in the past: the lease is
// then never live. Acquire does not check that a reservation's bytes are
// free: its caller does, under [Dir.Lock].
//
// The file is made as a temporary ".tmp-<ID>" (mode 0600, 0640 when
// Shared), locked with flock(LOCK_EX), written, then renamed to
// "<ID>.lease" ("<ID>.reserve" for a reservation), so no reader ever sees
// a lease file unlocked or half written while its holder lives.
func (d *Dir) Acquire(r Record) (*Held, error) {
	const op = "acquire"
	if !r.IsReservation() && r.Server == "" {
		return nil, &Error{Op: op, Path: d.path, Kind: ErrMalformed, Err: errors.New("no server")}
	}
	if !r.IsReservation() && r.Model == "" {
		return nil, &Error{Op: op, Path: d.path, Kind: ErrMalformed, Err: errors.New("no model")}
	}
	switch {
	case r.ID == "":
		id, err := NewID()
		if err != nil {
			return nil, &Error{Op: op, Path: d.path, Err: err}
		}
		r.ID = id
	case !validID(r.ID):
		return nil, &Error{Op: op, Path: d.path, Kind: ErrMalformed, Err: fmt.Errorf("id %q is not 16 lower-case hex digits", r.ID)}
	}
	r.Version = 1
	if r.Server != "" {
		r.Server = NormalizeServer(r.Server)
	}
	r.PID = os.Getpid()
	if r.Program == "" && len(os.Args) > 0 {
		r.Program = filepath.Base(os.Args[0])
	}
	r.Created = d.now().UTC().Round(0)
	r.Path = filepath.Join(d.path, r.ID+r.suffix())
	fd, r, err := d.write(op, r)
	if err != nil {
		return nil, err
	}
	return &Held{rec: r, fd: fd}, nil
}

// write writes r (its ID and Path set) as a temporary file, locked, and
// renames it to r.Path, replacing a file of that name: the new locked
// descriptor and r as written.
func (d *Dir) write(op string, r Record) (int, Record, error) {
	if !r.Until.IsZero() {
		r.Until = r.Until.UTC().Round(0)
	}
	path := r.Path
	r.Path, r.UID = "", 0
	b, err := encode(r)
	if err == nil {
		_, err = parse(b) // what is written must read back
	}
	if err != nil {
		return -1, r, &Error{Op: op, Path: d.path, Kind: ErrMalformed, Err: err}
	}
	if err := d.verify(op); err != nil {
		return -1, r, err
	}
	r.Path, r.UID = path, d.euid
	tmp := filepath.Join(d.path, tempPrefix+r.ID)
	fd, err := d.writeLocked(tmp, b)
	if err != nil {
		return -1, r, &Error{Op: op, Path: tmp, Err: err}
	}
	if err := os.Rename(tmp, r.Path); err != nil {
		_ = syscall.Unlink(tmp)
		_ = syscall.Close(fd)
		return -1, r, &Error{Op: op, Path: r.Path, Err: err}
	}
	return fd, r, nil
}

// Extend sets when the held lease or reservation ends of itself (zero:
// when released). The file is written anew and renamed over the old one
// while both are locked, so no reader sees it unlocked or half written;
// the old descriptor is closed after. It fails on a released Held, and
// when the file is no longer the holder's (removed or replaced by hand),
// without changing the lease.
func (h *Held) Extend(d *Dir, until time.Time) error {
	const op = "extend"
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return &Error{Op: op, Path: h.rec.Path, Err: errors.New("released")}
	}
	var mine, there syscall.Stat_t
	if err := syscall.Fstat(h.fd, &mine); err != nil {
		return &Error{Op: op, Path: h.rec.Path, Err: fmt.Errorf("fstat: %w", err)}
	}
	if err := syscall.Lstat(h.rec.Path, &there); err != nil || !sameFile(&mine, &there) {
		return &Error{Op: op, Path: h.rec.Path, Err: errors.New("the file is no longer this holder's")}
	}
	r := h.rec
	r.Until = until
	fd, r, err := d.write(op, r)
	if err != nil {
		return err
	}
	_ = syscall.Close(h.fd) // the new descriptor holds the lease now
	h.fd, h.rec = fd, r
	return nil
}

// writeLocked creates path, locks it exclusively and writes b, returning
// the locked descriptor; on failure it removes path.
func (d *Dir) writeLocked(path string, b []byte) (fd int, err error) {
	err = eintr(func() (err error) {
		fd, err = syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, d.perm)
		return err
	})
	if err != nil {
		return -1, err
	}
	defer func() {
		if err != nil {
			_ = syscall.Unlink(path)
			_ = syscall.Close(fd)
		}
	}()
	// A Live pass only tests a temporary file's lock once it looks a minute
	// old; that takes a clock that jumped, and the test's shared lock is
	// dropped at once. So a few tries suffice, and a hostile holder of
	// the lock fails Acquire instead of hanging it.
	for try := 0; ; try++ {
		err = eintr(func() error { return syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB) })
		if err == nil {
			break
		}
		if err != syscall.EWOULDBLOCK || try == 20 {
			return -1, fmt.Errorf("flock: %w", err)
		}
		time.Sleep(time.Millisecond)
	}
	if err = syscall.Fchmod(fd, d.perm); err != nil { // whatever the umask
		return -1, fmt.Errorf("fchmod: %w", err)
	}
	if d.shared {
		var st syscall.Stat_t
		if err = syscall.Fstat(fd, &st); err != nil {
			return -1, fmt.Errorf("fstat: %w", err)
		}
		if int(st.Gid) != d.gid {
			if err = syscall.Fchown(fd, -1, d.gid); err != nil {
				return -1, fmt.Errorf("fchown to group %d: %w", d.gid, err)
			}
		}
	}
	for len(b) > 0 {
		var n int
		err = eintr(func() (err error) { n, err = syscall.Write(fd, b); return err })
		if err != nil {
			return -1, fmt.Errorf("write: %w", err)
		}
		b = b[n:]
	}
	return fd, nil
}

// Record returns the lease as written, with Path and UID filled in as Live
// would.
func (h *Held) Record() Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rec
}

// Release ends the lease: it removes the file (if the path still names
// it), then closes the descriptor, which drops the lock. It is idempotent:
// later calls return what the first returned. Safe for concurrent use.
func (h *Held) Release() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return h.err
	}
	h.released = true
	var errs []error
	var mine, there syscall.Stat_t
	if err := syscall.Fstat(h.fd, &mine); err != nil {
		errs = append(errs, fmt.Errorf("fstat: %w", err))
	} else if err := syscall.Lstat(h.rec.Path, &there); err == nil && sameFile(&mine, &there) {
		if err := syscall.Unlink(h.rec.Path); err != nil && err != syscall.ENOENT {
			errs = append(errs, fmt.Errorf("unlink: %w", err))
		}
	} else if err != nil && err != syscall.ENOENT {
		errs = append(errs, fmt.Errorf("lstat: %w", err))
	}
	if err := syscall.Close(h.fd); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		h.err = &Error{Op: "release", Path: h.rec.Path, Err: err}
	}
	return h.err
}

// Live returns the live leases on model at server: model "" means every
// model of server, server "" every server (server is compared after
// NormalizeServer). A lease file is live while another open file
// description holds its flock; Live tests that without blocking. Leases
// whose Until has passed (by Options.Now) are left out, though their
// holders may not have released them yet. The result is sorted by Until
// (zero, until released, last), then Created, then ID.
//
// On the way Live removes stale lease files (unlocked: their holders
// died) and temporary files left unlocked for over a minute, and skips,
// logging once per path, what is not a lease of a trusted owner: symbolic
// links, files that are not regular, files of other users (Shared: unless
// of the directory's group), files over MaxFileBytes, and live files that
// do not parse or whose name is not their ID. None of those is an error:
// Live fails only when the directory cannot be read or is no longer safe.
//
// A lease acquired before Live begins is in the result, one released
// before it begins is not; one acquired or released meanwhile may be
// either.
func (d *Dir) Live(server, model string) ([]Record, error) {
	if server != "" {
		server = NormalizeServer(server)
	}
	return d.live("live", leaseSuffix, func(r Record) bool {
		return (server == "" || NormalizeServer(r.Server) == server) && (model == "" || r.Model == model)
	})
}

// Reserved returns the live reservations on device (-1: on every device),
// by the rules of Live (stale and foreign files as Live treats them,
// Until by Options.Now), in Live's order.
func (d *Dir) Reserved(device int) ([]Record, error) {
	return d.live("reserved", reserveSuffix, func(r Record) bool { return device < 0 || r.Device == device })
}

// live is Live and Reserved: the live files of suffix that keep says.
func (d *Dir) live(op, suffix string, keep func(Record) bool) ([]Record, error) {
	names, err := d.readNames(op)
	if err != nil {
		return nil, err
	}
	now := d.now()
	var out []Record
	buf := make([]byte, MaxFileBytes+1) // one more, to see a file grown past the limit
	for _, name := range names {
		path := filepath.Join(d.path, name)
		switch {
		case strings.HasPrefix(name, tempPrefix):
			d.checkTemp(path, now)
		case strings.HasSuffix(name, suffix):
			r, ok := d.checkLease(path, name, buf)
			if !ok || !r.Until.IsZero() && !now.Before(r.Until) || !keep(r) {
				continue
			}
			out = append(out, r)
		}
	}
	d.forget(names)
	slices.SortFunc(out, func(a, b Record) int {
		switch {
		case a.Until.IsZero() && !b.Until.IsZero():
			return 1
		case !a.Until.IsZero() && b.Until.IsZero():
			return -1
		}
		return cmp.Or(a.Until.Compare(b.Until), a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// file is one directory entry, opened for a lock test after the checks
// that come before opening.
type file struct {
	fd int
	st syscall.Stat_t
}

// openEntry Lstats path, applies the owner and type rules, and opens it
// without following links or blocking. ok false: skipped (and logged).
func (d *Dir) openEntry(path string) (f file, fi fs.FileInfo, ok bool) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return f, nil, false // released meanwhile
	case err != nil:
		d.note(slog.LevelWarn, path, "lstat failed", "err", err)
		return f, nil, false
	case fi.Mode()&fs.ModeSymlink != 0:
		d.note(slog.LevelWarn, path, "symbolic link")
		return f, nil, false
	case !fi.Mode().IsRegular():
		d.note(slog.LevelWarn, path, "not a regular file", "mode", fi.Mode().String())
		return f, nil, false
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != d.euid && !(d.shared && int(st.Gid) == d.gid) {
		d.note(slog.LevelWarn, path, "another user's file", "uid", st.Uid, "gid", st.Gid)
		return f, nil, false
	}
	if fi.Size() > MaxFileBytes {
		d.note(slog.LevelWarn, path, "larger than MaxFileBytes", "size", fi.Size())
		return f, nil, false
	}
	err = eintr(func() (err error) {
		f.fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		return err
	})
	if err == syscall.ENOENT {
		return f, nil, false
	}
	if err != nil {
		d.note(slog.LevelWarn, path, "open failed", "err", err)
		return f, nil, false
	}
	if err := syscall.Fstat(f.fd, &f.st); err != nil || !sameFile(&f.st, st) {
		// Replaced between Lstat and open: the next pass looks again.
		_ = syscall.Close(f.fd)
		return f, nil, false
	}
	return f, fi, true
}

// tryLock tests f's lock. A shared lock conflicts with the holder's
// exclusive one but not with another reader's test, so two Live passes at
// once never take each other for a holder. alive false: the lock was
// taken, and is held until f is closed.
func (d *Dir) tryLock(path string, f file) (alive, ok bool) {
	err := eintr(func() error { return syscall.Flock(f.fd, syscall.LOCK_SH|syscall.LOCK_NB) })
	switch err {
	case nil:
		return false, true
	case syscall.EWOULDBLOCK:
		return true, true
	}
	d.note(slog.LevelWarn, path, "flock failed", "err", err)
	return false, false
}

// removeStale unlinks path if it still names f (locked by us, so no holder
// has it), then closes f.
func (d *Dir) removeStale(path string, f file, reason string) {
	defer syscall.Close(f.fd)
	var now syscall.Stat_t
	if err := syscall.Lstat(path, &now); err != nil || !sameFile(&now, &f.st) {
		return // removed or replaced meanwhile
	}
	if err := syscall.Unlink(path); err != nil && err != syscall.ENOENT {
		d.note(slog.LevelWarn, path, reason+": cannot remove", "err", err)
		return
	}
	d.log.Debug("lease: removed "+reason, "path", path)
}

// checkLease tests one lease file and reads it if live, into buf (of
// MaxFileBytes+1).
func (d *Dir) checkLease(path, name string, buf []byte) (Record, bool) {
	f, _, ok := d.openEntry(path)
	if !ok {
		return Record{}, false
	}
	alive, ok := d.tryLock(path, f)
	if !ok {
		_ = syscall.Close(f.fd)
		return Record{}, false
	}
	if !alive {
		d.removeStale(path, f, "stale lease (holder gone)")
		return Record{}, false
	}
	defer syscall.Close(f.fd)
	n := 0
	for n < len(buf) {
		var m int
		err := eintr(func() (err error) { m, err = syscall.Read(f.fd, buf[n:]); return err })
		if err != nil {
			d.note(slog.LevelWarn, path, "read failed", "err", err)
			return Record{}, false
		}
		if m == 0 {
			break
		}
		n += m
	}
	r, err := Parse(buf[:n])
	if err != nil {
		d.note(slog.LevelWarn, path, "live file is not a lease", "err", err)
		return Record{}, false
	}
	if name != r.ID+r.suffix() {
		d.note(slog.LevelWarn, path, "name is not the lease's id", "id", r.ID)
		return Record{}, false
	}
	r.Path, r.UID = path, int(f.st.Uid)
	d.clear(path)
	return r, true
}

func (d *Dir) checkTemp(path string, now time.Time) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().IsRegular() && now.Sub(fi.ModTime()) < tempMaxAge {
		return // gone, or an Acquire under way
	}
	f, _, ok := d.openEntry(path)
	if !ok {
		return
	}
	alive, ok := d.tryLock(path, f)
	if !ok || alive {
		_ = syscall.Close(f.fd)
		return
	}
	d.removeStale(path, f, "abandoned temporary file")
}

// note logs one skipped file, once per path and reason.
func (d *Dir) note(level slog.Level, path, reason string, attrs ...any) {
	d.mu.Lock()
	seen := d.logged[path] == reason
	d.logged[path] = reason
	d.mu.Unlock()
	if !seen {
		// Live takes no ctx: its work is a few system calls per file.
		d.log.Log(context.Background(), level, "lease: ignoring file: "+reason, append([]any{"path", path}, attrs...)...)
	}
}

// clear forgets that path was logged: it is a good lease now.
func (d *Dir) clear(path string) {
	d.mu.Lock()
	delete(d.logged, path)
	d.mu.Unlock()
}

// forget drops the logged paths that a pass no longer listed, so the
// memory of what was logged stays as small as the directory.
func (d *Dir) forget(names []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.logged) == 0 {
		return
	}
	listed := make(map[string]bool, len(names))
	for _, n := range names {
		listed[filepath.Join(d.path, n)] = true
	}
	for p := range d.logged {
		if !listed[p] {
			delete(d.logged, p)
		}
	}
}

func sameFile(a, b *syscall.Stat_t) bool {
	return uint64(a.Dev) == uint64(b.Dev) && uint64(a.Ino) == uint64(b.Ino)
}

func eintr(f func() error) error {
	for {
		if err := f(); err != syscall.EINTR {
			return err
		}
	}
}

// lockName is the file Lock locks: not a lease, a reservation or a
// temporary file, so Live and Reserved pass it by.
const lockName = ".lock"

// Lock takes the directory's exclusive lock, which serializes the checks
// that must not interleave across processes (a reservation's "is it free?"
// and its Acquire), and returns its unlock. It tries without blocking
// until ctx ends (every 2 ms), so a stuck holder costs a caller its ctx,
// never a hang. The lock ends with its process, however it ends.
func (d *Dir) Lock(ctx context.Context) (unlock func(), err error) {
	const op = "lock"
	if err := d.verify(op); err != nil {
		return nil, err
	}
	path := filepath.Join(d.path, lockName)
	var fd int
	err = eintr(func() (err error) {
		fd, err = syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, d.perm)
		return err
	})
	if err != nil {
		return nil, &Error{Op: op, Path: path, Err: err}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		_ = syscall.Close(fd)
		return nil, &Error{Op: op, Path: path, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || int(st.Uid) != d.euid && !(d.shared && int(st.Gid) == d.gid) {
		_ = syscall.Close(fd)
		return nil, &Error{Op: op, Path: path, Kind: ErrUnsafeDir, Err: errors.New("the lock file is not a regular file of ours")}
	}
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		err := eintr(func() error { return syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB) })
		if err == nil {
			return func() { _ = syscall.Close(fd) }, nil
		}
		if err != syscall.EWOULDBLOCK {
			_ = syscall.Close(fd)
			return nil, &Error{Op: op, Path: path, Err: fmt.Errorf("flock: %w", err)}
		}
		select {
		case <-ctx.Done():
			_ = syscall.Close(fd)
			return nil, &Error{Op: op, Path: path, Err: context.Cause(ctx)}
		case <-t.C:
		}
	}
}
