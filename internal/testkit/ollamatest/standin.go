package ollamatest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// standinPkg is the stand-in llama-server command (package
// internal/testkit/standin).
const standinPkg = "github.com/vramguard/vramguard/internal/testkit/standin/llama-server"

// standinName is the file name Ollama v0.30+ looks for.
const standinName = "llama-server"

// The stand-in's files in a server's temporary folder: Ollama v0.30+ looks
// for llama-server in <working dir>/build/lib/ollama (after the folders of
// its own executable, where a packaged Ollama keeps the real one), and the
// stand-in reads its knobs from knobsFile and logs to eventsFile.
const (
	standinDir = "build/lib/ollama"
	knobsFile  = "standin-knobs.json"
	eventsFile = "standin-events.jsonl"
)

var standinBuild struct {
	sync.Mutex
	path string
}

// StandinBinary returns the path of the stand-in llama-server built from
// this module's source, building it on the first call of the process (go
// build is incremental, so that is quick when nothing changed). The binary
// is built into a temporary folder and renamed into
// CacheDir()/standin/llama-server, so that concurrent test processes and
// running servers never see a partly written file.
func StandinBinary(ctx context.Context) (string, error) {
	standinBuild.Lock()
	defer standinBuild.Unlock()
	if standinBuild.path != "" {
		return standinBuild.path, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("ollamatest: building the stand-in llama-server needs the go command: %w", err)
	}
	root, err := CacheDir()
	if err != nil {
		return "", fmt.Errorf("ollamatest: cache dir: %w", err)
	}
	dir := filepath.Join(root, "standin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("ollamatest: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", fmt.Errorf("ollamatest: %w", err)
	}
	defer os.RemoveAll(tmp)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", filepath.Join(tmp, standinName), standinPkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ollamatest: go build %s: %w\n%s", standinPkg, err, tail(out.Bytes(), 4000))
	}
	path := filepath.Join(dir, standinName)
	if err := os.Rename(filepath.Join(tmp, standinName), path); err != nil {
		return "", fmt.Errorf("ollamatest: %w", err)
	}
	standinBuild.path = path
	return path, nil
}

// installStandin copies the stand-in into dir/build/lib/ollama.
func installStandin(bin, dir string) error {
	dst := filepath.Join(dir, standinDir)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	in, err := os.Open(bin)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(filepath.Join(dst, standinName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// UsesStandin reports whether the server runs its models in the stand-in
// llama-server: it was started by this package for a version from 0.30 on.
// Results of such a server are Ollama's own scheduler, keep-alive, unload
// and /api/ps over a runner that only imitates llama.cpp.
func (s *Server) UsesStandin() bool { return s.standin }

// SetRunnerKnobs sets how the stand-in llama-server behaves from its next
// request or start on (load time, time per token, crashes, out of memory,
// hangs, reported size). It fails with ErrExternal for an external server
// and with an error for a server that does not use the stand-in.
func (s *Server) SetRunnerKnobs(k standin.Knobs) error {
	if s.external {
		return ErrExternal
	}
	if !s.standin {
		return fmt.Errorf("ollamatest: ollama %s does not run the stand-in llama-server", s.version)
	}
	return standin.WriteKnobs(filepath.Join(s.dir, knobsFile), k)
}

// RunnerEvents returns what the stand-in llama-servers of this server
// recorded so far: their starts (with argv) and the requests they received.
func (s *Server) RunnerEvents() ([]standin.Event, error) {
	if s.external {
		return nil, ErrExternal
	}
	if !s.standin {
		return nil, fmt.Errorf("ollamatest: ollama %s does not run the stand-in llama-server", s.version)
	}
	return standin.ReadEvents(filepath.Join(s.dir, eventsFile))
}
