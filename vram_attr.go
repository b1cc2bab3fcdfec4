package vramguard

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ClassifyCommand tells what a process is from its command line (argv, as
// in /proc/<pid>/cmdline): RoleOllamaServer for `ollama serve`,
// RoleOllamaRunner for `ollama runner ...` and the older
// `ollama_llama_server`, RoleOther for anything else, and RoleUnknown when
// args is empty or is a bare `ollama` path without arguments (nvidia-smi
// reports only the executable, which is the same for server and runner).
//
// It is exported for VRAMReader implementations of other vendors.
func ClassifyCommand(args []string) ProcessRole {
	if len(args) == 0 || strings.TrimSpace(args[0]) == "" {
		return RoleUnknown
	}
	// Some programs rewrite their argv into one space-separated string.
	if len(args) == 1 && strings.ContainsRune(args[0], ' ') && !vramIsOllamaExe(args[0]) {
		if f := strings.Fields(args[0]); vramIsOllamaExe(f[0]) {
			args = f
		}
	}
	exe := vramExeName(args[0])
	switch {
	case exe == "ollama_llama_server":
		return RoleOllamaRunner
	case !strings.HasPrefix(exe, "ollama"):
		return RoleOther
	case len(args) == 1:
		return RoleUnknown
	}
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "-") { // global flags before the subcommand
			continue
		}
		switch a {
		case "serve":
			return RoleOllamaServer
		case "runner":
			return RoleOllamaRunner
		}
		return RoleOther // the CLI client (`ollama run`, `ollama pull`, ...)
	}
	return RoleOther
}

// vramExeName returns the base name of an executable path, on either kind of
// separator (nvidia-smi on Windows reports C:\...\ollama.exe), without
// ".exe" or the " (deleted)" Linux appends after an upgrade.
func vramExeName(path string) string {
	path = strings.TrimSuffix(strings.TrimSpace(path), " (deleted)")
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		path = path[i+1:]
	}
	return strings.TrimSuffix(strings.ToLower(path), ".exe")
}

func vramIsOllamaExe(path string) bool {
	return strings.HasPrefix(vramExeName(path), "ollama")
}

// FindOrphans returns the Ollama runners in snap that hold GPU memory
// although Ollama's /api/ps lists no model (loaded is how many models it
// lists). A runner appears once even when it spans several devices; its
// UsedBytes is then the sum, and UsedKnown is true only if every device
// reported it. The result is sorted by memory, largest first.
//
// Only loaded <= 0 is conclusive: when Ollama lists models, a snapshot
// cannot tell which runner serves which (the runner's command line names a
// blob path, /api/ps a model name), so FindOrphans returns nil even if there
// are more runners than models. Processes whose command is not visible
// (RoleUnknown) are never reported. After a runner crash /api/ps may still
// list the dead model; that case needs a reload, not a kill.
//
// FindOrphans only reports; killing is up to the caller (KillProcess).
func FindOrphans(snap *VRAMSnapshot, loaded int) []GPUProcess {
	if snap == nil || loaded > 0 {
		return nil
	}
	var out []GPUProcess
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if p.Role != RoleOllamaRunner || (p.UsedKnown && p.UsedBytes == 0) {
				continue
			}
			i := slices.IndexFunc(out, func(q GPUProcess) bool { return q.PID == p.PID })
			if i < 0 {
				out = append(out, p)
				continue
			}
			out[i].UsedBytes = vramSatAdd(out[i].UsedBytes, p.UsedBytes)
			out[i].UsedKnown = out[i].UsedKnown && p.UsedKnown
		}
	}
	vramSortHolders(out)
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
		return newError(op, "", KindNotFound, fmt.Errorf("pid %d: %w", pid, err))
	default:
		return newError(op, "", KindUnavailable, fmt.Errorf("pid %d: %w", pid, err))
	}
}

// vramInitPIDNamespace is the inode of the initial PID namespace
// (PROC_PID_INIT_INO), fixed since Linux 3.8.
const vramInitPIDNamespace = "pid:[4026531836]"

// vramCmdlineMax bounds how much of a command line is read.
const vramCmdlineMax = 4 << 10

// vramProcFS reads command lines of GPU processes from procfs.
type vramProcFS struct {
	root string
	// off is set when this program runs in a child PID namespace (a
	// container without --pid=host): the driver reports host PIDs, which
	// there name other processes or none.
	off bool
}

// newVRAMProcFS returns a reader for procfs mounted at root ("" means
// /proc). It checks root/self/ns/pid once; if that link cannot be read the
// namespace is taken to be the host's.
func newVRAMProcFS(root string) vramProcFS {
	if root == "" {
		root = "/proc"
	}
	ns, err := os.Readlink(filepath.Join(root, "self", "ns", "pid"))
	return vramProcFS{root: root, off: err == nil && ns != vramInitPIDNamespace}
}

// args returns the command line of pid, or nil when it is not visible
// (another namespace, exited, kernel thread, hidepid).
func (p vramProcFS) args(pid uint32) []string {
	if p.off || pid == 0 {
		return nil
	}
	f, err := os.Open(filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10), "cmdline"))
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, vramCmdlineMax))
	if err != nil {
		return nil
	}
	s := strings.TrimRight(string(b), "\x00")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\x00")
}

// describe fills in Command and Role of proc from procfs, falling back to
// name (what the source itself reports, possibly empty).
func (p vramProcFS) describe(proc *GPUProcess, name string) {
	args := p.args(proc.PID)
	if args == nil && name != "" {
		args = []string{name}
	}
	proc.Command = strings.Join(args, " ")
	proc.Role = ClassifyCommand(args)
}

// vramSortHolders sorts processes by memory, largest first, unknown
// figures last, then by PID.
func vramSortHolders(ps []GPUProcess) {
	slices.SortFunc(ps, func(a, b GPUProcess) int {
		if a.UsedKnown != b.UsedKnown {
			if a.UsedKnown {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.UsedBytes, a.UsedBytes), cmp.Compare(a.PID, b.PID))
	})
}

func vramSatAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// vramFormatBytes formats n in binary units for messages.
func vramFormatBytes(n uint64) string {
	const (
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case n >= gib:
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	case n >= mib:
		return fmt.Sprintf("%.1f MiB", float64(n)/mib)
	default:
		return fmt.Sprintf("%d B", n)
	}
}
