package gpu

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/procs"
)

// ClassifyCommand tells what a process is from its command line (argv, as
// in /proc/<pid>/cmdline):
//
//   - RoleOllamaServer for `ollama serve`;
//   - RoleOllamaRunner for the runners of both generations: `ollama runner
//     --model ...` (Ollama up to v0.24, and its MLX runner after), the older
//     `ollama_llama_server`, and `llama-server --model ...` (v0.30 and later)
//     when the llama-server lives in a lib/ollama folder or serves an Ollama
//     blob (`.../blobs/sha256-<hex>`);
//   - RoleOllamaDiscovery for Ollama's GPU probes: `llama-server
//     --list-devices`, a llama-server with no model, `ollama runner
//     --ollama-engine` without --model, `ollama gpu-discover`;
//   - RoleUnknown when args is empty or is a bare `ollama` (or lib/ollama
//     llama-server) path without arguments: nvidia-smi reports only the
//     executable, which is the same for server, runner and probe;
//   - RoleOther for anything else: the ollama CLI client, and a user's own
//     llama-server serving a .gguf file of theirs.
//
// It is exported for vramguard.VRAMReader implementations of other
// vendors.
func ClassifyCommand(args []string) vramguard.ProcessRole {
	return roleOf(procs.Classify(args).Role)
}

// roleOf maps the roles of internal/procs to the public ones.
func roleOf(r procs.Role) vramguard.ProcessRole {
	switch r {
	case procs.RoleServer:
		return vramguard.RoleOllamaServer
	case procs.RoleRunner:
		return vramguard.RoleOllamaRunner
	case procs.RoleDiscovery:
		return vramguard.RoleOllamaDiscovery
	case procs.RoleOther, procs.RoleClient:
		return vramguard.RoleOther
	}
	return vramguard.RoleUnknown
}

// FindOrphans returns the Ollama runners in snap that hold GPU memory no
// live Ollama server will free: those whose server is gone (Orphaned, as
// the procfs readers fill it in), always; and, when loaded <= 0, every
// runner, since Ollama's /api/ps then lists no model (loaded is how many
// models it lists). A runner appears once even when it spans several
// devices; its UsedBytes is then the sum, and UsedKnown is true only if
// every device reported it. The result is sorted by memory, largest first.
//
// With loaded > 0 a runner whose server is alive is never reported, even
// if there are more runners than models: use NameRunners to
// see which model each serves. Discovery processes (RoleOllamaDiscovery)
// and processes whose command is not visible (RoleUnknown) are never
// reported. After a runner crash /api/ps may still list the dead model;
// that case needs a reload, not a kill. A loaded <= 0 taken just before a
// load shows up in /api/ps makes the loading runner look orphaned: Ollama
// lists a model only once its load has ended.
//
// FindOrphans only reports; killing is up to the caller (KillProcess).
func FindOrphans(snap *vramguard.VRAMSnapshot, loaded int) []vramguard.GPUProcess {
	if snap == nil {
		return nil
	}
	var out []vramguard.GPUProcess
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if p.Role != vramguard.RoleOllamaRunner || (p.UsedKnown && p.UsedBytes == 0) || (loaded > 0 && !p.Orphaned) {
				continue
			}
			i := slices.IndexFunc(out, func(q vramguard.GPUProcess) bool { return q.PID == p.PID })
			if i < 0 {
				out = append(out, p)
				continue
			}
			out[i].UsedBytes = satAdd(out[i].UsedBytes, p.UsedBytes)
			out[i].UsedKnown = out[i].UsedKnown && p.UsedKnown
			out[i].Orphaned = out[i].Orphaned || p.Orphaned
		}
	}
	sortHolders(out)
	return out
}

// KillProcess kills the process pid (SIGKILL on Unix), for example an
// orphaned Ollama runner reported by FindOrphans. The library never calls
// it by itself.
//
// It refuses (KindInvalidInput) pid 0 and 1, the calling process, and
// pids beyond the range of a pid_t: kill(2) reads 0xFFFFFFFF as -1, which
// means every process the caller may signal. A process that no longer
// exists gives KindNotFound; any other failure (permission) KindUnavailable.
// A PID can be reused once its process exits: kill soon after the snapshot
// that named it.
func KillProcess(pid uint32) error {
	const op = "kill process"
	switch {
	case pid <= 1:
		return invalid(op, "", "refusing to kill pid %d", pid)
	case pid > math.MaxInt32:
		return invalid(op, "", "pid %d is out of range", pid)
	case int(pid) == os.Getpid():
		return invalid(op, "", "refusing to kill this process (pid %d)", pid)
	}
	p, err := os.FindProcess(int(pid))
	if err == nil {
		err = p.Kill()
		p.Release()
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrProcessDone):
		return newError(op, "", vramguard.KindNotFound, fmt.Errorf("pid %d: %w", pid, err))
	default:
		return newError(op, "", vramguard.KindUnavailable, fmt.Errorf("pid %d: %w", pid, err))
	}
}

// initPIDNamespace is the inode of the initial PID namespace
// (PROC_PID_INIT_INO), fixed since Linux 3.8.
const initPIDNamespace = "pid:[4026531836]"

// cmdlineMax bounds how much of a command line is read.
const cmdlineMax = procs.MaxArgsBytes

// procFS reads command lines of GPU processes from procfs.
type procFS struct {
	root string
	// off is set when this program runs in a child PID namespace (a
	// container without --pid=host): the driver reports host PIDs, which
	// there name other processes or none.
	off bool
}

// newProcFS returns a reader for procfs mounted at root ("" means
// /proc). It checks root/self/ns/pid once; if that link cannot be read the
// namespace is taken to be the host's.
func newProcFS(root string) procFS {
	if root == "" {
		root = "/proc"
	}
	ns, err := os.Readlink(filepath.Join(root, "self", "ns", "pid"))
	return procFS{root: root, off: err == nil && ns != initPIDNamespace}
}

// args returns the command line of pid, or nil when it is not visible
// (another namespace, exited, kernel thread, hidepid).
func (p procFS) args(pid uint32) []string {
	if p.off || pid == 0 || pid > math.MaxInt32 {
		return nil
	}
	args, err := procs.ReadArgs(p.root, int(pid))
	if err != nil {
		return nil
	}
	return args
}

// describe fills in Command, Role, Blob, Model and Orphaned of proc from
// procfs, falling back to name (what the source itself reports, possibly
// empty). Orphaned is checked only on a command line read from procfs: a
// PID the reader cannot see has no parent it can see either.
func (p procFS) describe(proc *vramguard.GPUProcess, name string) {
	args := p.args(proc.PID)
	visible := args != nil
	if args == nil && name != "" {
		args = []string{name}
	}
	proc.Command = strings.Join(args, " ")
	info := procs.Classify(args)
	proc.Role = roleOf(info.Role)
	proc.Blob = info.Blob
	if proc.Role == vramguard.RoleOllamaRunner {
		proc.Model = info.Model // Ollama's MLX runner names its model
	}
	if visible && proc.Role == vramguard.RoleOllamaRunner {
		proc.Orphaned = p.orphaned(proc.PID)
	}
}

// orphaned reports whether runner pid's parent is known not to be a live
// `ollama serve`.
func (p procFS) orphaned(pid uint32) bool {
	st, err := procs.ReadStat(p.root, int(pid))
	if err != nil {
		return false
	}
	server, known := procs.ParentIsServer(p.root, st.PPID)
	return known && !server
}

// sortHolders sorts processes by memory, largest first, unknown
// figures last, then by PID.
func sortHolders(ps []vramguard.GPUProcess) {
	slices.SortFunc(ps, func(a, b vramguard.GPUProcess) int {
		if a.UsedKnown != b.UsedKnown {
			if a.UsedKnown {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.UsedBytes, a.UsedBytes), cmp.Compare(a.PID, b.PID))
	})
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
