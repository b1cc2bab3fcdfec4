// Package lease lets every vramguard client on a host see which models the
// others are using, so that one program's unload does not pull a model from
// under another program still generating with it. It needs no daemon: a
// lease is a file, held by an open, flock(2)ed descriptor, so it ends with
// its process however the process ends, SIGKILL and OOM kills included.
//
// # Leases
//
// A lease says: process PID (program Program) is using Model on the Ollama
// server Server, since Created, until Until or until released (zero Until);
// or, with For (and ForPID) set, holds it there for that recipient (a
// proxy's HTTP client, say).
// [Dir.Acquire] takes one and returns it [Held]; [Held.Release] ends it;
// [Dir.Live] lists those in force. A lease is advice among cooperating
// clients: it keeps vramguard from unloading a model, not Ollama, and not
// a client that does not ask.
//
// # Reservations
//
// A reservation says: process PID keeps Bytes of device Device's free
// memory for a recipient (For: "ComfyUI render 42", and ForPID, its
// process, when known), since Created, until Until or until released. It
// is the same file, lock and liveness as a lease, named "<ID>.reserve",
// with no Model ([Record.IsReservation]). [Dir.Reserved] lists those in
// force. Taking one is "check that the bytes are free, then Acquire",
// which must not interleave with another process's: callers hold
// [Dir.Lock] across both. Like a lease it is advice among cooperating
// clients: the driver knows nothing of it.
//
// # Files
//
// The directory is $XDG_RUNTIME_DIR/vramguard/leases (per user, in memory,
// emptied at logout), else <os.TempDir()>/vramguard-<euid>/leases, or
// [Options.Dir]. It holds one file per lease, "<ID>.lease", where ID is 16
// random hex digits, containing one line of JSON of at most [MaxFileBytes]:
//
//	{"v":1,"id":"8f3a...","server":"127.0.0.1:11434","model":"qwen3:8b","pid":4242,"program":"caption","note":"captioning","created":"2025-01-02T03:04:05.123456789Z"}
//
// [Parse] is its strict reader. A lease is written as ".tmp-<ID>", locked
// and filled, then renamed into place, so its final name never shows an
// unlocked or half-written file of a living holder.
//
// # Liveness
//
// A lease file is live if and only if another open file description holds
// its flock. Its holder took flock(LOCK_EX) before the file had its name
// and keeps the descriptor open; the kernel drops the lock when the last
// descriptor of that open file closes, which process exit does. A reader
// opens the file and tries flock(LOCK_SH|LOCK_NB): EWOULDBLOCK means the
// holder lives, and the content is read; success means the holder is gone,
// and the reader removes the file (if the name still names the inode it
// locked). A shared lock, not an exclusive one, so that two readers at
// once never take each other for a holder. Only the lock counts: the PID in
// the file is for people (PIDs are reused, and another PID namespace
// would show another number), and the content of a live file that does not
// parse is ignored, never taken for a lease on some model.
//
// Locks belong to open file descriptions, not to processes: a second open
// of the file in the holder's own process sees it locked too. The holder's
// descriptor is close-on-exec, so a child does not keep a lease alive after
// its parent dies. Until is read by the reader's clock ([Options.Now]): a
// live lease whose Until has passed is left out even before its holder
// gets round to releasing it; Created is never compared with the clock,
// so a clock that jumps neither ends a lease of zero Until nor hides one
// created "in the future".
//
// flock on NFS is emulated with byte-range locks on some systems and not
// at all on others: keep the directory on a local file system (the default
// places are).
//
// # Threat model
//
// By default a lease directory is its user's alone: [Open] refuses a
// directory that is a symbolic link, belongs to another user or grants its
// group or others any access (and one whose parent another user could swap
// it through), so another local user can neither read your leases nor
// forge, hide or pin one; and [Dir.Live] reads only regular files of your
// own, at most MaxFileBytes, opened without following links or blocking, so
// a planted symlink, FIFO or huge file is skipped (and logged) rather than
// followed or read. The same user's processes are trusted: they can write
// anything there, as they could signal your process.
//
// [Options.Shared] is for sharing on purpose between the users of one group,
// for example a directory made by an administrator with
//
//	install -d -m 2770 -g gpu /run/vramguard-gpu
//
// (setgid, so new files take the group). Then the directory may be
// group-writable and belong to another user whose group is ours, lease
// files are group-readable (0640), and files of other users count when
// their group is the directory's. That trusts the directory's owner and
// every member of its group: any of them can forge a lease (keeping a model
// loaded against your wish), remove one (letting another client unload a
// model you use), or hold a lock on your file after your process died
// (keeping its lease alive). Others stay out: a Shared directory with any
// access for others is refused.
//
// # Platforms
//
// The package needs flock(2) from the standard syscall package (no cgo,
// no golang.org/x/sys): Linux, Android, the BSDs, macOS, iOS and illumos.
// Elsewhere (Windows, Solaris, AIX, Plan 9, WebAssembly) it builds, and
// [Open] fails with [ErrUnsupported].
//
// # Concurrency
//
// Every function and method is safe for concurrent use. Nothing is kept at
// package level; a [Dir] keeps only its settings and the set of paths it
// has logged.
package lease
