package procs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
)

// MaxArgsBytes bounds how much of a command line is read: a process can
// make its argv as long as it likes.
const MaxArgsBytes = 4 << 10

// statMax bounds the read of /proc/<pid>/stat. The fields up to the parent
// PID fit well within it (comm is at most 64 bytes), and no field after
// comm holds a ')', so the last ')' of a cut read still ends comm.
const statMax = 512

// Stat is what /proc/<pid>/stat says about a process.
type Stat struct {
	PID   int
	PPID  int    // 0 when the parent is outside this PID namespace
	State byte   // 'R', 'S', 'D', 'Z' (zombie), 'X' (dead), ...
	Comm  string // the executable's base name, at most 15 bytes for a process
}

// Process is a process and what its command line says.
type Process struct {
	Stat
	Args []string // nil when empty (a zombie, a kernel thread) or not readable
	Info
}

// Runner is an Ollama runner process.
type Runner struct {
	Process
	// ServerPID is the PID of the live `ollama serve` that is its parent;
	// 0 when the parent is not one, or could not be checked.
	ServerPID int
	// Orphaned says the parent is known not to be a live `ollama serve`:
	// it is gone, a zombie, or another program (init or a subreaper that
	// adopted the runner after its server died). A runner whose parent
	// could not be checked (PPID 0, an unreadable parent) is not orphaned.
	Orphaned bool
}

// root returns the procfs mount point, "" meaning /proc.
func rootOf(root string) string {
	if root == "" {
		return "/proc"
	}
	return root
}

// ReadStat reads root/<pid>/stat ("" root means /proc). A process that
// does not exist gives an error for which errors.Is(err, fs.ErrNotExist)
// holds.
func ReadStat(root string, pid int) (Stat, error) {
	var buf [statMax]byte
	return readStat(rootOf(root), strconv.Itoa(pid), buf[:])
}

func readStat(root, pid string, buf []byte) (Stat, error) {
	n, err := readInto(root+"/"+pid+"/stat", buf)
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(buf[:n])
}

var errBadStat = errors.New("malformed stat line")

// ParseStat parses a /proc/<pid>/stat line, or its first bytes: "pid
// (comm) state ppid ...". comm may hold spaces and parentheses; it ends at
// the last ')'.
func ParseStat(b []byte) (Stat, error) {
	pid, ppid, state, comm, ok := parseStat(b)
	if !ok {
		return Stat{}, errBadStat
	}
	return Stat{PID: pid, PPID: ppid, State: state, Comm: string(comm)}, nil
}

// parseStat is ParseStat without allocations: comm points into b.
func parseStat(b []byte) (pid, ppid int, state byte, comm []byte, ok bool) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return 0, 0, 0, nil, false
	}
	pid, ok = atoi(bytes.TrimSpace(b[:open]))
	if !ok || pid == 0 {
		return 0, 0, 0, nil, false
	}
	// ") S 1234 ...": one space, the state, one space, the parent's PID.
	rest := b[end+1:]
	if len(rest) < 4 || rest[0] != ' ' || rest[2] != ' ' {
		return 0, 0, 0, nil, false
	}
	f := rest[3:]
	if i := bytes.IndexByte(f, ' '); i >= 0 {
		f = f[:i]
	}
	ppid, ok = atoi(bytes.TrimRight(f, "\n"))
	if !ok {
		return 0, 0, 0, nil, false
	}
	return pid, ppid, rest[1], b[open+1 : end], true
}

// atoi parses a non-negative decimal number of at most 10 digits.
func atoi(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// ReadArgs reads the command line of pid from root/<pid>/cmdline ("" root
// means /proc), at most MaxArgsBytes of it. An empty command line (a
// zombie, a kernel thread) gives nil and no error.
func ReadArgs(root string, pid int) ([]string, error) {
	var buf [MaxArgsBytes]byte
	return readArgs(rootOf(root), strconv.Itoa(pid), buf[:])
}

func readArgs(root, pid string, buf []byte) ([]string, error) {
	n, err := readInto(root+"/"+pid+"/cmdline", buf)
	if err != nil {
		return nil, err
	}
	return SplitArgs(buf[:n]), nil
}

// SplitArgs splits the contents of a cmdline file at its NUL bytes; nil
// when it holds nothing.
func SplitArgs(b []byte) []string {
	s := strings.TrimRight(string(b), "\x00")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\x00")
}

// Read reads pid's stat and command line and classifies it.
func Read(root string, pid int) (Process, error) {
	var buf [MaxArgsBytes]byte
	return read(rootOf(root), strconv.Itoa(pid), buf[:])
}

func read(root, pid string, buf []byte) (Process, error) {
	st, err := readStat(root, pid, buf[:statMax])
	if err != nil {
		return Process{}, err
	}
	args, err := readArgs(root, pid, buf)
	if err != nil {
		return Process{}, err
	}
	return Process{Stat: st, Args: args, Info: Classify(args)}, nil
}

// ParentIsServer checks the parent of a runner: server reports that ppid
// is a live `ollama serve`; known is false when that cannot be told (ppid
// 0, the parent's files unreadable or its command line empty). A parent
// that no longer exists is known, and not a server.
func ParentIsServer(root string, ppid int) (server, known bool) {
	var buf [MaxArgsBytes]byte
	return parentIsServer(rootOf(root), ppid, buf[:])
}

func parentIsServer(root string, ppid int, buf []byte) (server, known bool) {
	if ppid <= 0 {
		return false, false
	}
	p := strconv.Itoa(ppid)
	st, err := readStat(root, p, buf[:statMax])
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, true // gone between our reads: the runner is being orphaned
	case err != nil:
		return false, false
	case !MaybeOllama(st.Comm):
		return false, true // init, a subreaper, a shell: not a server
	}
	args, err := readArgs(root, p, buf)
	if errors.Is(err, fs.ErrNotExist) {
		return false, true
	}
	if err != nil {
		return false, false
	}
	return isLiveServer(Process{Stat: st, Args: args, Info: Classify(args)})
}

// isLiveServer tells whether p, a runner's parent, is a live `ollama
// serve`; known is false when its command line is empty (unreadable).
func isLiveServer(p Process) (server, known bool) {
	switch {
	case p.State == 'Z' || p.State == 'X' || p.State == 'x':
		return false, true
	case p.Args == nil:
		return false, false
	}
	return p.Role == RoleServer, true
}

// scan reads every process under root whose name could be Ollama's, by
// PID: the runners and (nearly always) their servers. It fails only when
// root cannot be listed; processes that vanish or cannot be read during
// the pass are left out.
func scan(root string, buf []byte) (map[int]Process, error) { return scanWhere(root, buf, maybeOllama) }

// scanWhere is scan for the processes whose stat name comm accepts.
func scanWhere(root string, buf []byte, comm func([]byte) bool) (map[int]Process, error) {
	d, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	seen := make(map[int]Process)
	for _, name := range names {
		if !isPID(name) {
			continue
		}
		// The stat line alone rules out nearly every process, with no
		// allocation beyond the path.
		n, err := readInto(root+"/"+name+"/stat", buf[:statMax])
		if err != nil {
			continue
		}
		pid, ppid, state, c, ok := parseStat(buf[:n])
		if !ok || !comm(c) {
			continue
		}
		st := Stat{PID: pid, PPID: ppid, State: state, Comm: string(c)}
		args, err := readArgs(root, name, buf)
		if err != nil {
			continue
		}
		seen[st.PID] = Process{Stat: st, Args: args, Info: Classify(args)}
	}
	return seen, nil
}

// Servers counts the live `ollama serve` processes under root ("" means
// /proc). Zero means that no Ollama server's processes can be seen from
// here (none runs on this machine, or it runs in another PID namespace),
// so that no runner of it can be seen either. It fails only when root
// cannot be listed.
func Servers(root string) (int, error) {
	seen, err := scan(rootOf(root), make([]byte, MaxArgsBytes))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range seen {
		if server, _ := isLiveServer(p); server {
			n++
		}
	}
	return n, nil
}

// Runners lists the Ollama runners under root ("" means /proc), of both
// generations, sorted by PID, each with its parent checked. Discovery
// processes are not runners. It fails only when root cannot be listed;
// processes that vanish or cannot be read during the pass are left out.
func Runners(root string) ([]Runner, error) {
	root = rootOf(root)
	buf := make([]byte, MaxArgsBytes)
	seen, err := scan(root, buf)
	if err != nil {
		return nil, err
	}
	var out []Runner
	for _, p := range seen {
		if p.Role != RoleRunner {
			continue
		}
		var server, known bool
		if parent, ok := seen[p.PPID]; ok {
			server, known = isLiveServer(parent)
		} else {
			// Not an ollama process in this pass (or one started after
			// the listing, which cannot be the runner's first parent).
			server, known = parentIsServer(root, p.PPID, buf)
		}
		r := Runner{Process: p, Orphaned: known && !server}
		if server {
			r.ServerPID = p.PPID
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Runner) int { return a.PID - b.PID })
	return out, nil
}

// RunnersFor lists the runners under root serving the weights blob
// ("sha256:<hex>", or a blob path: see BlobOf); nil for a blob that is not
// one.
func RunnersFor(root, blob string) ([]Runner, error) {
	blob = BlobOf(blob)
	if blob == "" {
		return nil, nil
	}
	rs, err := Runners(root)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(rs, func(r Runner) bool { return r.Blob != blob }), nil
}

// isPID reports whether a procfs entry name is a process ID.
func isPID(name string) bool {
	if name == "" || name[0] == '0' || len(name) > 10 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] < '0' || name[i] > '9' {
			return false
		}
	}
	return true
}
