package procs

import (
	"bytes"
	"fmt"
	"strings"
)

// Role is what a process is to Ollama.
type Role uint8

// The roles. The zero value, RoleUnknown, is for a command line that says
// too little: none at all, or a bare executable path (nvidia-smi reports
// only that, and `ollama serve` and `ollama runner` share one binary).
const (
	RoleUnknown   Role = iota
	RoleOther          // not Ollama's (a user's own llama-server included)
	RoleServer         // `ollama serve`
	RoleRunner         // a process serving one loaded model
	RoleDiscovery      // a short-lived GPU discovery process; never holds a model
	RoleClient         // the ollama CLI: `ollama run`, `ollama pull`, `ollama --version`, ...
)

func (r Role) String() string {
	switch r {
	case RoleUnknown:
		return "unknown"
	case RoleOther:
		return "other"
	case RoleServer:
		return "server"
	case RoleRunner:
		return "runner"
	case RoleDiscovery:
		return "discovery"
	case RoleClient:
		return "client"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// Generation is the family of a runner or discovery process.
type Generation uint8

// The generations.
const (
	GenUnknown      Generation = iota
	GenLegacy                  // `ollama_llama_server` (Ollama before v0.5)
	GenOllamaRunner            // `ollama runner` (v0.5 to v0.24; the MLX runner after)
	GenLlamaServer             // llama.cpp's `llama-server` (v0.30 and later)
)

func (g Generation) String() string {
	switch g {
	case GenUnknown:
		return "unknown"
	case GenLegacy:
		return "ollama_llama_server"
	case GenOllamaRunner:
		return "ollama runner"
	case GenLlamaServer:
		return "llama-server"
	}
	return fmt.Sprintf("Generation(%d)", uint8(g))
}

// Info is what a command line says about a process.
type Info struct {
	Role Role
	// Generation is the runner family of a runner, a discovery process or
	// a bare lib/ollama llama-server path; GenUnknown for anything else.
	Generation Generation
	// ModelPath is the value of --model (or -m) as given; "" if none.
	ModelPath string
	// Blob is the weights blob's digest, "sha256:<64 hex>", when ModelPath's
	// base name is an Ollama blob (see BlobOf); "" otherwise.
	Blob string
	// Model is the model's name when the command line carries one instead
	// of a path: Ollama's MLX runner (`ollama runner --model qwen3:latest`).
	Model string
}

// Classify tells what a process is from its command line (argv, as in
// /proc/<pid>/cmdline). A command line rewritten into one space-separated
// string is split again when its first word is an Ollama executable.
//
// Runners of both generations are RoleRunner: `ollama runner` with --model
// (or without it and without --ollama-engine), `ollama_llama_server`, and a
// `llama-server` with --model (or -m) whose executable lives in a lib/ollama
// folder or whose model is an Ollama blob (`.../blobs/sha256-<hex>`, or a
// split model's `.../blobs/.ollama-split-*/` alias). A llama-server serving
// any other file is RoleOther. `llama-server --list-devices`, a
// llama-server with no model to serve, `ollama runner --ollama-engine`
// without --model and `ollama gpu-discover` are RoleDiscovery.
func Classify(args []string) Info {
	if len(args) == 0 || strings.TrimSpace(args[0]) == "" {
		return Info{}
	}
	if len(args) == 1 && strings.ContainsRune(args[0], ' ') && !knownExe(args[0]) {
		if f := strings.Fields(args[0]); knownExe(f[0]) {
			args = f
		}
	}
	switch exe := exeName(args[0]); {
	case exe == "ollama_llama_server":
		info := Info{Role: RoleRunner, Generation: GenLegacy}
		if path, ok := modelFlag(args[1:]); ok {
			info.setModel(path, false)
		}
		return info
	case exe == "llama-server":
		return classifyLlamaServer(args)
	case strings.HasPrefix(exe, "ollama"):
		return classifyOllama(args)
	}
	return Info{Role: RoleOther}
}

// classifyOllama classifies a command line whose executable is ollama.
func classifyOllama(args []string) Info {
	if len(args) == 1 {
		return Info{} // nvidia-smi's form: server or runner, who knows
	}
	for i, a := range args[1:] {
		if strings.HasPrefix(a, "-") { // global flags before the subcommand
			continue
		}
		rest := args[i+2:]
		switch a {
		case "serve":
			return Info{Role: RoleServer}
		case "gpu-discover":
			return Info{Role: RoleDiscovery, Generation: GenOllamaRunner}
		case "runner":
			path, ok := modelFlag(rest)
			if !ok && hasFlag(rest, "--ollama-engine") {
				// Ollama v0.12 to v0.24 probe the GPUs with a runner that
				// loads no model. Ollama never starts a runner with neither
				// flag, so that is taken for a runner whose argv we cannot
				// fully see.
				return Info{Role: RoleDiscovery, Generation: GenOllamaRunner}
			}
			info := Info{Role: RoleRunner, Generation: GenOllamaRunner}
			if ok {
				info.setModel(path, true)
			}
			return info
		}
		return Info{Role: RoleClient}
	}
	return Info{Role: RoleClient} // only flags: `ollama --version`
}

// llamaServerSources are llama-server's flags that name a model to serve
// other than --model: a user's own server, not Ollama's.
var llamaServerSources = []string{
	"-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url",
	"-dr", "--docker-repo", "--models-dir", "--models-preset",
}

// classifyLlamaServer classifies a command line whose executable is
// llama-server.
func classifyLlamaServer(args []string) Info {
	info := Info{Generation: GenLlamaServer}
	ours := inLibOllama(args[0])
	rest := args[1:]
	switch {
	case len(rest) == 0:
		if ours {
			info.Role = RoleUnknown // runner or discovery: nvidia-smi's form
		} else {
			info.Role, info.Generation = RoleOther, GenUnknown
		}
		return info
	case hasFlag(rest, "--list-devices"):
		info.Role = RoleDiscovery
		return info
	}
	path, ok := modelFlag(rest)
	if !ok {
		for _, f := range llamaServerSources {
			if hasFlag(rest, f) {
				return Info{Role: RoleOther}
			}
		}
		// No model to serve: Ollama's discovery start (v0.30+). Wherever
		// it lives, such a process serves nothing: never a runner.
		info.Role = RoleDiscovery
		return info
	}
	info.setModel(path, false)
	if ours || isOllamaModelPath(path) {
		info.Role = RoleRunner
		return info
	}
	info.Role, info.Generation = RoleOther, GenUnknown
	return info
}

// setModel records the --model value. named says that a value which is no
// path is a model name (the MLX runner's form).
func (info *Info) setModel(path string, named bool) {
	info.ModelPath = path
	info.Blob = BlobOf(path)
	if named && info.Blob == "" && path != "" && !looksLikePath(path) {
		info.Model = path
	}
}

// modelFlag returns the value of --model or -m (also --model=V, -m=V), the
// last one when given twice, as llama.cpp's and Ollama's flag parsers do.
func modelFlag(args []string) (string, bool) {
	var path string
	var found bool
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--model" || a == "-m":
			if i+1 < len(args) {
				path, found = args[i+1], true
				i++
			}
		case strings.HasPrefix(a, "--model="):
			path, found = a[len("--model="):], true
		case strings.HasPrefix(a, "-m="):
			path, found = a[len("-m="):], true
		}
	}
	return path, found
}

// hasFlag reports whether args holds flag, alone or as flag=value.
func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || (strings.HasPrefix(a, flag) && len(a) > len(flag) && a[len(flag)] == '=') {
			return true
		}
	}
	return false
}

// BlobOf returns the digest "sha256:<64 lower-case hex>" of an Ollama blob
// path, whose base name is sha256-<hex> (or sha256:<hex>, as older Ollama
// versions and Windows paths name them), on either kind of separator; ""
// when path names no blob. A bare digest is accepted as well.
func BlobOf(path string) string {
	path = strings.TrimSpace(path)
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		path = path[i+1:]
	}
	const prefix = "sha256"
	if len(path) != len(prefix)+1+64 || !strings.EqualFold(path[:len(prefix)], prefix) ||
		(path[len(prefix)] != '-' && path[len(prefix)] != ':') {
		return ""
	}
	hex := path[len(prefix)+1:]
	for i := 0; i < len(hex); i++ {
		c := hex[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return ""
		}
	}
	return "sha256:" + strings.ToLower(hex)
}

// isOllamaModelPath reports whether path is in an Ollama models folder: a
// blob (`.../blobs/sha256-<hex>`) or the alias of a split model's first
// shard (`.../blobs/.ollama-split-<manifest>-<rand>/model-00001-of-N.gguf`).
func isOllamaModelPath(path string) bool {
	dir, base := splitPath(path)
	parent, dirBase := splitPath(dir)
	switch {
	case BlobOf(base) != "" && dirBase == "blobs":
		return true
	case strings.HasPrefix(dirBase, ".ollama-split-"):
		_, grand := splitPath(parent)
		return grand == "blobs"
	}
	return false
}

// inLibOllama reports whether exe lives in a lib/ollama folder, where Ollama
// v0.30 and later install their llama-server (also build/lib/ollama and
// dist/<os>-<arch>/lib/ollama in a source tree).
func inLibOllama(exe string) bool {
	dir, _ := splitPath(strings.TrimSuffix(strings.TrimSpace(exe), " (deleted)"))
	parent, d := splitPath(dir)
	_, p := splitPath(parent)
	return strings.EqualFold(d, "ollama") && strings.EqualFold(p, "lib")
}

// splitPath splits path at its last separator of either kind, ignoring
// trailing separators.
func splitPath(path string) (dir, base string) {
	path = strings.TrimRight(path, `/\`)
	i := strings.LastIndexAny(path, `/\`)
	if i < 0 {
		return "", path
	}
	return path[:i], path[i+1:]
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

// exeName returns the base name of an executable path, on either kind of
// separator (nvidia-smi on Windows reports C:\...\ollama.exe), lower case,
// without ".exe" or the " (deleted)" Linux appends after an upgrade.
func exeName(path string) string {
	path = strings.TrimSuffix(strings.TrimSpace(path), " (deleted)")
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		path = path[i+1:]
	}
	return strings.TrimSuffix(strings.ToLower(path), ".exe")
}

// knownExe reports whether path is an executable this package classifies.
func knownExe(path string) bool {
	e := exeName(path)
	return strings.HasPrefix(e, "ollama") || e == "llama-server"
}

// MaybeOllama reports whether a process named comm (/proc/<pid>/stat's
// second field, at most 15 bytes of the executable's base name) could be
// an Ollama server, runner or discovery process: ollama*, llama-server.
func MaybeOllama(comm string) bool {
	const o = "ollama"
	return len(comm) >= len(o) && strings.EqualFold(comm[:len(o)], o) || strings.EqualFold(comm, "llama-server")
}

// maybeOllama is MaybeOllama on bytes.
func maybeOllama(comm []byte) bool {
	const o = "ollama"
	return len(comm) >= len(o) && bytes.EqualFold(comm[:len(o)], []byte(o)) || bytes.EqualFold(comm, []byte("llama-server"))
}
