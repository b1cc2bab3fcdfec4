package standin_test

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// binProc is the built stand-in binary running as a subprocess.
type binProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{}
	err    error // cmd.Wait's result, valid once exited is closed
}

var listeningRE = regexp.MustCompile(`main: HTTP server is listening, hostname: \S+, port: (\d+)`)

func startBinary(t *testing.T, e env, args ...string) *binProc {
	t.Helper()
	cmd := exec.Command(standinBinary(t), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VRAMGUARD_STANDIN_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range e {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &binProc{cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// url waits for the listening line on stderr and returns the server's URL.
func (p *binProc) url(t *testing.T) string {
	t.Helper()
	var port string
	waitFor(t, 30*time.Second, "the listening line", func() bool {
		if m := listeningRE.FindStringSubmatch(p.stderr.String()); m != nil {
			port = m[1]
			return true
		}
		return false
	})
	return "http://127.0.0.1:" + port
}

// exitCode waits for the process to end by itself.
func (p *binProc) exitCode(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("still running after %v; stderr:\n%s", d, p.stderr)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("wait: %v", p.err)
	}
	return 0
}

func TestBinaryCrashAfterTokens(t *testing.T) {
	k := fast
	k.CrashAfterTokens = 3
	e, _, _ := knobsEnv(t, k)
	p := startBinary(t, e, "--model", writeModel(t, 100), "--port", "0", "--host", "127.0.0.1", "-c", "256", "--no-webui")
	url := p.url(t)
	waitHealthy(t, url, 30*time.Second)

	code, s := readStream(t.Context(), t, url+"/completion", map[string]any{"prompt": "boom", "stream": true, "n_predict": 10})
	if code != http.StatusOK || len(s.tokens()) != 3 || len(s.events) != 3 || !isUnexpectedEOF(s.err) {
		t.Fatalf("status %d, %d events (%d tokens), err %v; want exactly 3 tokens, then an unexpected EOF", code, len(s.events), len(s.tokens()), s.err)
	}
	if code := p.exitCode(t, 10*time.Second); code != standin.ExitCrash {
		t.Fatalf("exit status %d, want %d", code, standin.ExitCrash)
	}
	if got := ollamaError(p.stderr.String()); got != "GGML_ASSERT(vramguard stand-in: crash_after_tokens = 3) failed" {
		t.Fatalf("Ollama would report %q; stderr:\n%s", got, p.stderr)
	}
}

func TestBinaryOOMAtLoad(t *testing.T) {
	e, _, _ := knobsEnv(t, standin.Knobs{LoadMS: 100, OOMAtLoad: true, ModelBytes: 6 << 30})
	p := startBinary(t, e, "--model", writeModel(t, 100), "--port", "0")
	url := p.url(t)
	// While it loads, it answers like llama-server.
	if code, body := get(t, url+"/health"); code != http.StatusServiceUnavailable || !strings.Contains(body, "Loading model") {
		t.Logf("/health during the 100 ms load: %d %q (the load may already have ended)", code, body)
	}
	if code := p.exitCode(t, 10*time.Second); code != standin.ExitLoad {
		t.Fatalf("exit status %d, want %d", code, standin.ExitLoad)
	}
	stderr := p.stderr.String()
	for _, want := range []string{
		"ggml_backend_cuda_buffer_type_alloc_buffer: allocating 6144.00 MiB on device 0: cudaMalloc failed: out of memory",
		"llama_model_load: error loading model: unable to allocate CUDA0 buffer",
		"main: exiting due to model loading error",
	} {
		if !strings.Contains(stderr, want+"\n") {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if got := ollamaError(stderr); !isOutOfMemory(got) || !strings.HasPrefix(got, "cudaMalloc failed: out of memory\n") {
		t.Fatalf("Ollama would report %q, not out of memory", got)
	}
}

func TestBinaryDiscovery(t *testing.T) {
	// What Ollama v0.34.4's discover/llama_server.go does: start without a
	// model, read stderr up to system_info, kill; then --list-devices.
	p := startBinary(t, env{}, "--port", "0", "--host", "127.0.0.1", "--no-webui", "--offline", "--verbose")
	waitFor(t, 30*time.Second, "system_info", func() bool { return strings.Contains(p.stderr.String(), "system_info:") })
	waitHealthy(t, p.url(t), 10*time.Second)
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command(standinBinary(t), "--list-devices", "--offline", "--verbose").CombinedOutput()
	if err != nil || string(out) != "Available devices:\n" {
		t.Fatalf("--list-devices: %v, output %q", err, out)
	}
}
