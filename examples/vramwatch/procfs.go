package main

import (
	"cmp"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
)

// Without a GPU reader no driver lists the runners, but /proc still does,
// and a runner's command line names the weights blob that gpu.NameRunners
// maps to a model. Package gpu reads /proc only for the processes a driver
// reports, so vramwatch makes that pass itself, with the public pieces:
// gpu.ClassifyCommand tells a runner from the rest, the --model flag names
// its weights, and the parent's command line tells whether its `ollama
// serve` still runs.

// cmdlineMax bounds the read of a command line: a process can make its
// argv as long as it likes, and a runner's --model comes early.
const cmdlineMax = 4 << 10

// procRunners lists the Ollama runners under the procfs root ("" means
// /proc), by PID, as GPU processes whose memory is not known: Command,
// Role, Blob, Model when the command line names one (Ollama's MLX runner)
// and Orphaned when the runner's parent is known not to be a live `ollama
// serve`. It fails only when root cannot be listed; processes that vanish
// or cannot be read meanwhile are left out.
func procRunners(root string) ([]vramguard.GPUProcess, error) {
	if root == "" {
		root = "/proc"
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	// The processes whose name could be Ollama's: runners and, nearly
	// always, their servers.
	seen := make(map[int]procEntry)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		p, err := readProc(root, pid)
		if err != nil || !maybeOllama(p.comm) {
			continue
		}
		if p.args, err = readArgs(root, pid); err == nil {
			seen[pid] = p
		}
	}
	var out []vramguard.GPUProcess
	for pid, p := range seen {
		if gpu.ClassifyCommand(p.args) != vramguard.RoleOllamaRunner {
			continue
		}
		blob, model := weightsOf(p.args)
		out = append(out, vramguard.GPUProcess{
			PID: uint32(pid), Command: strings.Join(p.args, " "), Role: vramguard.RoleOllamaRunner,
			Blob: blob, Model: model, Orphaned: serverGone(root, p.ppid, seen),
		})
	}
	slices.SortFunc(out, func(a, b vramguard.GPUProcess) int { return cmp.Compare(a.PID, b.PID) })
	return out, nil
}

// procEntry is what /proc says about one process.
type procEntry struct {
	ppid  int    // 0 when the parent is outside this PID namespace
	state byte   // 'R', 'S', 'Z' (zombie), ...
	comm  string // the executable's base name, at most 15 bytes
	args  []string
}

// readProc reads root/<pid>/stat.
func readProc(root string, pid int) (procEntry, error) {
	b, err := readHead(filepath.Join(root, strconv.Itoa(pid), "stat"), 512)
	if err != nil {
		return procEntry{}, err
	}
	return parseStat(string(b))
}

// parseStat parses the start of a stat line: "pid (comm) state ppid ...",
// where comm may hold spaces and parentheses and ends at the last ')'.
func parseStat(s string) (procEntry, error) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procEntry{}, errBadStat
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return procEntry{}, errBadStat
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procEntry{}, errBadStat
	}
	return procEntry{ppid: ppid, state: f[0][0], comm: s[open+1 : end]}, nil
}

var errBadStat = errors.New("malformed stat line")

// readArgs reads the command line of pid, split at its NUL bytes; nil when
// it is empty (a zombie, a kernel thread).
func readArgs(root string, pid int) ([]string, error) {
	b, err := readHead(filepath.Join(root, strconv.Itoa(pid), "cmdline"), cmdlineMax)
	if err != nil {
		return nil, err
	}
	s := strings.TrimRight(string(b), "\x00")
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, "\x00"), nil
}

// readHead reads at most n bytes of the file at path.
func readHead(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// maybeOllama reports whether a process named comm could be an Ollama
// server, runner or probe: ollama*, ollama_llama_server, llama-server.
func maybeOllama(comm string) bool {
	return strings.HasPrefix(strings.ToLower(comm), "ollama") || strings.EqualFold(comm, "llama-server")
}

// serverGone reports whether a runner's parent is known not to be a live
// `ollama serve`: gone, a zombie, or another program (init, or a
// subreaper that adopted the runner when its server died). A parent that
// cannot be checked (outside this PID namespace, unreadable) is not.
func serverGone(root string, ppid int, seen map[int]procEntry) bool {
	if ppid <= 0 {
		return false
	}
	p, ok := seen[ppid]
	if !ok {
		// Not an Ollama process in this pass: init, a shell, or gone.
		p, err := readProc(root, ppid)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return true
		case err != nil:
			return false
		}
		return !maybeOllama(p.comm)
	}
	switch {
	case p.state == 'Z' || p.state == 'X':
		return true
	case p.args == nil:
		return false
	}
	return gpu.ClassifyCommand(p.args) != vramguard.RoleOllamaServer
}

// weightsOf returns what a runner's command line says it serves: the
// weights blob ("sha256:<hex>") its --model names, or, for Ollama's MLX
// runner (`ollama runner --model qwen3:latest`), the model's name.
func weightsOf(args []string) (blob, model string) {
	if len(args) == 1 {
		args = strings.Fields(args[0]) // a command line rewritten into one string
	}
	if len(args) == 0 {
		return "", ""
	}
	path := ""
	for i := 1; i < len(args); i++ { // the last --model wins, as in both runners' flag parsers
		switch a := args[i]; {
		case (a == "--model" || a == "-m") && i+1 < len(args):
			path = args[i+1]
			i++
		case strings.HasPrefix(a, "--model="):
			path = strings.TrimPrefix(a, "--model=")
		case strings.HasPrefix(a, "-m="):
			path = strings.TrimPrefix(a, "-m=")
		}
	}
	if blob = blobOf(path); blob != "" || path == "" {
		return blob, ""
	}
	exe := strings.ToLower(args[0][strings.LastIndexAny(args[0], `/\`)+1:])
	if (exe == "ollama" || exe == "ollama.exe") && !looksLikePath(path) {
		return "", path
	}
	return "", ""
}

// looksLikePath reports whether s reads as a file path rather than a model
// name such as "qwen3:latest" or "hf.co/org/repo:Q4_K_M".
func looksLikePath(s string) bool {
	switch {
	case strings.HasPrefix(s, "/"), strings.HasPrefix(s, `\`), strings.HasPrefix(s, "."), strings.HasPrefix(s, "~"):
		return true
	case len(s) >= 3 && s[1] == ':' && (s[2] == '\\' || s[2] == '/'): // C:\...
		return true
	}
	return strings.HasSuffix(strings.ToLower(s), ".gguf")
}

// blobOf returns the digest of an Ollama blob path, whose base name is
// sha256-<64 hex> (sha256:<hex> in older versions); "" for any other path.
func blobOf(path string) string {
	base := path[strings.LastIndexAny(path, `/\`)+1:]
	hex, ok := strings.CutPrefix(base, "sha256-")
	if !ok {
		hex, ok = strings.CutPrefix(base, "sha256:")
	}
	if !ok || len(hex) != 64 || strings.Trim(strings.ToLower(hex), "0123456789abcdef") != "" {
		return ""
	}
	return "sha256:" + strings.ToLower(hex)
}
