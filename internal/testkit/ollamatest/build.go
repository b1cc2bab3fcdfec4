package ollamatest

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Environment variables read by this package.
const (
	// EnvBin names an ollama binary to run instead of building one.
	EnvBin = "VRAMGUARD_OLLAMA_BIN"
	// EnvHost names an already running server (host:port or URL). The
	// harness then starts and stops nothing.
	EnvHost = "VRAMGUARD_OLLAMA_HOST"
	// EnvVersions is a comma-separated list of versions to test.
	EnvVersions = "VRAMGUARD_OLLAMA_VERSIONS"
	// EnvCache overrides the folder where built binaries are cached.
	EnvCache = "VRAMGUARD_OLLAMA_CACHE"
)

// DefaultVersions are the Ollama versions tested when EnvVersions is unset:
// the oldest supported release (0.6.5), the last two with the runner built
// into ollama itself (0.17.4, 0.24.0), and the newest served release
// (0.34.4), which runs models in llama.cpp's llama-server: the tests give it
// the stand-in of internal/testkit/standin (see UsesLlamaServer).
const DefaultVersions = "0.6.5,0.17.4,0.24.0,0.34.4"

// CustomVersion is the version label Versions reports when EnvBin or
// EnvHost is set and EnvVersions is not: the server is whatever the user
// pointed at.
const CustomVersion = "custom"

// modulePath is where the server is built from.
const modulePath = "github.com/ollama/ollama"

//go:embed cshim/miniaudio/miniaudio.h
var miniaudioShim []byte

// Versions returns the versions to test, from EnvVersions or the defaults.
// With EnvBin or EnvHost set and EnvVersions unset it returns a single
// CustomVersion.
func Versions() []string {
	s := os.Getenv(EnvVersions)
	if s == "" {
		if os.Getenv(EnvBin) != "" || os.Getenv(EnvHost) != "" {
			return []string{CustomVersion}
		}
		s = DefaultVersions
	}
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimPrefix(strings.TrimSpace(v), "v"); v != "" {
			out = append(out, v)
		}
	}
	return out
}

var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$`)

// CacheDir returns the folder holding built binaries: EnvCache if set, else
// "vramguard/ollama" under os.UserCacheDir. Version v's binary is
// <CacheDir>/<v>/ollama.
func CacheDir() (string, error) {
	if d := os.Getenv(EnvCache); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "vramguard", "ollama"), nil
}

// majorMinor returns the first two numbers of a version such as "0.17.4".
func majorMinor(v string) (major, minor int) {
	n, _ := versionNumbers(v)
	return n[0], n[1]
}

// versionNumbers reads "0.17.4" (a "v" before it, and a "-rc1" or "+x"
// after a number, allowed) as its three numbers; ok is false unless all
// three are there and are numbers (those read still come back).
func versionNumbers(v string) (n [3]int, ok bool) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	ok = len(parts) == 3
	for i, p := range parts {
		if j := strings.IndexAny(p, "-+"); j >= 0 {
			p = p[:j]
		}
		x, err := strconv.Atoi(p)
		if err != nil {
			return n, false
		}
		n[i] = x
	}
	return n, ok
}

// needsShim reports whether building version v needs the system headers
// and the miniaudio stand-in: module zips drop llama.cpp's vendor folder,
// which v0.6.x did not yet use and v0.30.0 removed with the in-module
// engines.
func needsShim(v string) bool {
	major, minor := majorMinor(v)
	return major == 0 && minor >= 7 && minor < 30
}

// UsesLlamaServer reports whether Ollama version v runs models in a separate
// llama-server binary (v0.30.0 on) rather than in `ollama runner`. It is
// false for CustomVersion, whose generation is unknown.
func UsesLlamaServer(v string) bool {
	if !versionRE.MatchString(strings.TrimPrefix(v, "v")) {
		return false
	}
	major, minor := majorMinor(v)
	return major > 0 || minor >= 30
}

// systemHeaders are the Debian nlohmann-json3-dev and libstb-dev headers
// that newer versions include from vendor/.
var systemHeaders = []string{"nlohmann/json_fwd.hpp", "stb/stb_image.h"}

// Binary returns the path of a cached ollama binary for version (such as
// "0.17.4"), building it with `go install` from the Go module proxy first if
// it is not cached. Concurrent calls, also from other processes, build once:
// a lock file serialises them. Building takes minutes of CPU; ctx cancels it.
// logf, if not nil, receives progress lines. built reports whether this call
// built the binary.
func Binary(ctx context.Context, version string, logf func(format string, args ...any)) (path string, built bool, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	version = strings.TrimPrefix(version, "v")
	if !versionRE.MatchString(version) {
		return "", false, fmt.Errorf("ollamatest: bad version %q", version)
	}
	root, err := CacheDir()
	if err != nil {
		return "", false, fmt.Errorf("ollamatest: cache dir: %w", err)
	}
	dir := filepath.Join(root, version)
	path = filepath.Join(dir, "ollama")
	if isExecutable(path) {
		return path, false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, fmt.Errorf("ollamatest: %w", err)
	}
	unlock, err := lock(ctx, filepath.Join(dir, ".lock"), logf)
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if isExecutable(path) { // another process built it while we waited
		return path, false, nil
	}
	if err := build(ctx, version, dir, logf); err != nil {
		return "", false, err
	}
	return path, true, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// lock takes the lock file at path, polling so that ctx can cancel the wait.
func lock(ctx context.Context, path string, logf func(string, ...any)) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ollamatest: %w", err)
	}
	logged := false
	for {
		ok, err := tryLock(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("ollamatest: lock %s: %w", path, err)
		}
		if ok {
			// Closing the file releases the lock.
			return func() { f.Close() }, nil
		}
		if !logged {
			logf("ollamatest: waiting for another process building into %s", filepath.Dir(path))
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("ollamatest: waiting for build lock: %w", context.Cause(ctx))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// build runs `go install` into a temporary folder under dir and moves the
// binary into place, so that a failed or cancelled build leaves nothing a
// later call would mistake for a binary.
func build(ctx context.Context, version, dir string, logf func(string, ...any)) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if r := os.Getenv("GOROOT"); r != "" {
			goBin = filepath.Join(r, "bin", "go")
		} else {
			return fmt.Errorf("ollamatest: building ollama needs the go command: %w", err)
		}
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return fmt.Errorf("ollamatest: %w", err)
	}
	defer os.RemoveAll(tmp)

	env := append(os.Environ(),
		"GOBIN="+tmp,
		"CGO_ENABLED=1",
		"GOWORK=off",
		"GOFLAGS=-buildvcs=false", // a module zip has no VCS; drop flags like -mod=vendor
	)
	if needsShim(version) {
		if missing := missingHeaders(); len(missing) > 0 {
			return fmt.Errorf("ollamatest: building ollama %s needs the headers %s (Debian: apt-get install nlohmann-json3-dev libstb-dev, or run scripts/install-ollama.sh)",
				version, strings.Join(missing, ", "))
		}
		shim := filepath.Join(dir, "cshim")
		if err := os.MkdirAll(filepath.Join(shim, "miniaudio"), 0o755); err != nil {
			return fmt.Errorf("ollamatest: %w", err)
		}
		if err := os.WriteFile(filepath.Join(shim, "miniaudio", "miniaudio.h"), miniaudioShim, 0o644); err != nil {
			return fmt.Errorf("ollamatest: %w", err)
		}
		env = append(env, "CGO_CPPFLAGS="+strings.TrimSpace(os.Getenv("CGO_CPPFLAGS")+" -I"+shim))
	}

	logf("ollamatest: building ollama %s with go install (several minutes on few cores; run scripts/install-ollama.sh to build ahead)", version)
	start := time.Now()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, goBin, "install", modulePath+"@v"+version)
	cmd.Dir = tmp
	cmd.Env = env
	cmd.Stdout = &out
	cmd.Stderr = &out
	newGroup(cmd)
	// Cancelling must also stop the compilers go started.
	cmd.Cancel = func() error { return signalGroup(cmd.Process.Pid, true) }
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()
	_ = os.WriteFile(filepath.Join(dir, "build.log"), out.Bytes(), 0o644)
	if runErr != nil {
		if ctx.Err() != nil {
			runErr = fmt.Errorf("%w (%w)", context.Cause(ctx), runErr)
		}
		return fmt.Errorf("ollamatest: go install %s@v%s: %w\n%s", modulePath, version, runErr, tail(out.Bytes(), 4000))
	}
	if err := os.Rename(filepath.Join(tmp, "ollama"), filepath.Join(dir, "ollama")); err != nil {
		return fmt.Errorf("ollamatest: %w", err)
	}
	logf("ollamatest: built ollama %s in %s", version, time.Since(start).Round(time.Second))
	return nil
}

func missingHeaders() []string {
	var missing []string
	for _, h := range systemHeaders {
		found := false
		for _, inc := range []string{"/usr/include", "/usr/local/include"} {
			if _, err := os.Stat(filepath.Join(inc, h)); err == nil {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, h)
		}
	}
	return missing
}

// tail returns at most the last n bytes of b, starting at a line.
func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	b = b[len(b)-n:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return "...\n" + string(b)
}

// ErrExternal is returned by the process-level methods of a server that
// EnvHost points at: its processes are not the harness's to inspect or kill.
var ErrExternal = errors.New("ollamatest: server is external (" + EnvHost + ")")
