package standin_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// binDir holds the stand-in binary the subprocess tests build once.
var binDir string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
	}))
}

var buildOnce struct {
	sync.Mutex
	path string
	err  error
	done bool
}

// standinBinary builds ./llama-server once per test process.
func standinBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Lock()
	defer buildOnce.Unlock()
	if !buildOnce.done {
		buildOnce.done = true
		buildOnce.path, buildOnce.err = buildStandin()
	}
	if buildOnce.err != nil {
		t.Fatalf("build stand-in: %v", buildOnce.err)
	}
	return buildOnce.path
}

func buildStandin() (string, error) {
	dir, err := os.MkdirTemp("", "standin-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
	path := filepath.Join(dir, "llama-server")
	cmd := exec.Command("go", "build", "-o", path, "github.com/vramguard/vramguard/internal/testkit/standin/llama-server")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v\n%s", err, out)
	}
	return path, nil
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a stand-in running in-process through standin.Run.
type proc struct {
	url            string
	stdout, stderr *syncBuffer
	cancel         context.CancelFunc
	exited         chan struct{}
	code           int // valid once exited is closed
}

// env is what a test's stand-in sees from the environment.
type env map[string]string

func (e env) get(k string) string { return e[k] }

// startProc runs the stand-in in-process on a free port of 127.0.0.1 and
// stops it (joining all its goroutines) when the test ends.
func startProc(t *testing.T, e env, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{stdout: &syncBuffer{}, stderr: &syncBuffer{}, cancel: cancel, exited: make(chan struct{})}
	addr := make(chan net.Addr, 1)
	go func() {
		defer close(p.exited)
		p.code = standin.Run(ctx, standin.Config{
			Args:     append([]string{"--host", "127.0.0.1", "--port", "0"}, args...),
			Stdout:   p.stdout,
			Stderr:   p.stderr,
			Getenv:   e.get,
			OnListen: func(a net.Addr) { addr <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-p.exited
	})
	select {
	case a := <-addr:
		p.url = "http://" + a.String()
	case <-p.exited:
		// A stand-in that listened and exited at once (a load that fails
		// with no load time) has both ready: it did listen.
		select {
		case a := <-addr:
			p.url = "http://" + a.String()
		default:
			t.Fatalf("stand-in exited with %d before listening; stderr:\n%s", p.code, p.stderr)
		}
	}
	return p
}

// wait returns the exit status, failing the test if it takes over d.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(d):
		t.Fatalf("stand-in still running after %v; stderr:\n%s", d, p.stderr)
		return -1
	}
}

// client returns an HTTP client without keep-alive, so that no idle
// connection outlives a test.
func client() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := client().Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func post(t *testing.T, url string, body any) (int, string) {
	t.Helper()
	res, err := client().Post(url, "application/json", bytes.NewReader(mustJSON(t, body)))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	if s, ok := v.(string); ok {
		return []byte(s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitHealthy polls /health until it answers 200.
func waitHealthy(t *testing.T, url string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		res, err := client().Get(url + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health not 200 after %v (last: %v)", d, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stream is the parsed server-sent events of one response.
type stream struct {
	events []map[string]any // decoded "data:" payloads, [DONE] excluded
	done   bool             // a "data: [DONE]" arrived
	err    error            // the read error that ended the stream, if any
}

// readStream POSTs body to url and reads the event stream to its end.
func readStream(ctx context.Context, t *testing.T, url string, body any) (int, stream) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(mustJSON(t, body)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := client().Do(req)
	if err != nil {
		return 0, stream{err: err}
	}
	defer res.Body.Close()
	var s stream
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			s.done = true
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("bad event %q: %v", line, err)
		}
		s.events = append(s.events, m)
	}
	s.err = sc.Err()
	return res.StatusCode, s
}

// tokens returns the content of the non-final /completion events.
func (s stream) tokens() []string {
	var out []string
	for _, e := range s.events {
		if e["stop"] == false {
			out = append(out, e["content"].(string))
		}
	}
	return out
}

// final returns the /completion event with "stop": true.
func (s stream) final(t *testing.T) map[string]any {
	t.Helper()
	for _, e := range s.events {
		if e["stop"] == true {
			return e
		}
	}
	t.Fatalf("no final event in %d events (err %v)", len(s.events), s.err)
	return nil
}

// writeModel writes a file that stands for a model and returns its path.
func writeModel(t *testing.T, size int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sha256-0123456789abcdef")
	if err := os.WriteFile(path, bytes.Repeat([]byte{7}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// knobsEnv writes k to a fresh knobs file and returns the environment
// naming it, with an event log next to it.
func knobsEnv(t *testing.T, k standin.Knobs) (env, string, string) {
	t.Helper()
	dir := t.TempDir()
	knobs, log := filepath.Join(dir, "knobs.json"), filepath.Join(dir, "events.jsonl")
	if err := standin.WriteKnobs(knobs, k); err != nil {
		t.Fatal(err)
	}
	return env{standin.EnvControl: knobs, standin.EnvLog: log}, knobs, log
}

func isUnexpectedEOF(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || (err != nil && strings.Contains(err.Error(), "unexpected EOF"))
}
