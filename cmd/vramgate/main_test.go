package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const gib = 1 << 30

// syncBuffer is a bytes.Buffer safe for the gate's log and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newSim is a simulator with two models of 2 and 3 GiB.
func newSim(t *testing.T, cfg vramguardtest.Config) *vramguardtest.Server {
	t.Helper()
	if cfg.Models == nil {
		cfg.Models = []vramguardtest.ModelConfig{
			{Name: "tiny", Size: 2 * gib, Chunks: 3, LoadLatency: 20 * time.Millisecond},
			{Name: "small", Size: 3 * gib, Chunks: 3, LoadLatency: 20 * time.Millisecond},
		}
	}
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// running is a gate started in-process.
type running struct {
	URL      string
	Stderr   *syncBuffer
	LeaseDir string
	cancel   context.CancelFunc
	done     chan int
	code     int
	stopped  bool
}

// stop ends the gate as SIGTERM does and returns its exit status.
func (g *running) stop(t testing.TB) int {
	t.Helper()
	if g.stopped {
		return g.code
	}
	g.cancel()
	select {
	case g.code = <-g.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the gate did not stop within 30 s; its log:\n%s", g.Stderr)
	}
	g.stopped = true
	return g.code
}

// startGate runs the gate in front of upstream with args after the
// test's own (-listen 127.0.0.1:0, a lease directory of the test's,
// -gpu=false unless reader is set).
func startGate(t testing.TB, upstream string, reader vramguard.VRAMReader, args ...string) *running {
	t.Helper()
	return startGateEnv(t, nil, upstream, reader, args...)
}

// startGateEnv is startGate with the environment env (nil: empty).
func startGateEnv(t testing.TB, env map[string]string, upstream string, reader vramguard.VRAMReader, args ...string) *running {
	t.Helper()
	g := &running{Stderr: &syncBuffer{}, LeaseDir: leaseDir(t), done: make(chan int, 1)}
	addr := make(chan string, 1)
	c := &cmd{stdout: io.Discard, stderr: g.Stderr, getenv: func(k string) string { return env[k] },
		ready: func(a string) { addr <- a }}
	base := []string{"-listen", "127.0.0.1:0", "-ollama", upstream, "-lease-dir", g.LeaseDir}
	if reader == nil {
		base = append(base, "-gpu=false")
	} else {
		c.newReader = func(context.Context) (vramguard.VRAMReader, error) { return reader, nil }
	}
	var ctx context.Context
	ctx, g.cancel = context.WithCancel(context.Background())
	go func() { g.done <- c.main(ctx, append(base, args...)) }()
	select {
	case a := <-addr:
		g.URL = "http://" + a
	case code := <-g.done:
		g.cancel()
		t.Fatalf("the gate exited with %d before it listened:\n%s", code, g.Stderr)
	case <-time.After(20 * time.Second):
		g.cancel()
		t.Fatalf("the gate did not listen within 20 s:\n%s", g.Stderr)
	}
	t.Cleanup(func() {
		if code := g.stop(t); code != 0 {
			t.Errorf("the gate exited with %d:\n%s", code, g.Stderr)
		}
	})
	return g
}

// leaseDir is a lease directory of the test's own, mode 0700 as
// vramguard requires.
func leaseDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "leases")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// apiClient is Ollama's own client pointed at base, as a program that does
// not import vramguard has.
func apiClient(t testing.TB, base string) *api.Client {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return api.NewClient(u, &http.Client{Transport: tr})
}

// load loads model through c with a keep-alive of a minute.
func load(t *testing.T, c *api.Client, model string) {
	t.Helper()
	ka := &api.Duration{Duration: time.Minute}
	if err := c.Generate(t.Context(), &api.GenerateRequest{Model: model, Prompt: "hi", KeepAlive: ka}, func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatalf("generate %s: %v", model, err)
	}
}

// post sends a POST to the gate and returns the reply as it begins, its
// body closed at the test's end: for a stream read as it comes.
func post(t *testing.T, u, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "POST", u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// do sends one request to the gate and returns the status, headers and body.
func do(t *testing.T, method, u, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, u, err)
	}
	return resp.StatusCode, resp.Header, b
}

func TestUsage(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"non-loopback without the flag", []string{"-listen", "0.0.0.0:0"}, 2, "not a loopback address"},
		{"non-loopback without a token", []string{"-listen", "0.0.0.0:0", "-allow-remote"}, 2, "needs a token"},
		{"not host:port", []string{"-listen", "nowhere"}, 2, "want host:port"},
		{"bad -ollama", []string{"-ollama", "ftp://x"}, 2, "-ollama"},
		{"argument", []string{"extra"}, 2, "unexpected argument"},
		{"small -max-body", []string{"-max-body", "10"}, 2, "-max-body"},
		{"negative -max-loaded", []string{"-max-loaded", "-1"}, 2, "-max-loaded"},
		{"-lease-max over an hour", []string{"-lease-max", "61m"}, 2, "-lease-max 1h1m0s: want at most 1h"},
		{"Ollama does not answer", []string{"-ollama", "127.0.0.1:1"}, 1, "does not answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr syncBuffer
			c := &cmd{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" },
				ready: func(string) { t.Error("the gate listened") }}
			args := append([]string{"-listen", "127.0.0.1:0", "-ollama", sim.URL().String(), "-gpu=false", "-lease-dir", leaseDir(t)}, tc.args...)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if code := c.main(ctx, args); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr %q does not say %q", stderr.String(), tc.want)
			}
		})
	}
	t.Run("non-loopback with -allow-remote and a token", func(t *testing.T) {
		if err := checkListen("0.0.0.0:0", true, true); err != nil {
			t.Fatal(err)
		}
		for _, a := range []string{"127.0.0.1:1", "[::1]:1", "localhost:1"} {
			if err := checkListen(a, false, false); err != nil {
				t.Errorf("%s: %v", a, err)
			}
		}
	})
}

// A program on Ollama's own client works through the gate unchanged: the
// same chunks, the same /api/ps, /api/tags, /api/version.
func TestPassThrough(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	direct, through := sim.APIClient(), apiClient(t, g.URL)
	collect := func(c *api.Client) []string {
		var got []string
		err := c.Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "a castle"}, func(r api.GenerateResponse) error {
			got = append(got, r.Response)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	a, b := collect(direct), collect(through)
	if strings.Join(a, "|") != strings.Join(b, "|") || len(a) < 3 {
		t.Fatalf("through the gate %q, straight %q", b, a)
	}
	ps, err := through.ListRunning(t.Context())
	if err != nil || len(ps.Models) != 1 || ps.Models[0].Name != "tiny:latest" {
		t.Fatalf("/api/ps through the gate: %+v, %v", ps, err)
	}
	tags, err := through.List(t.Context())
	if err != nil || len(tags.Models) != 2 {
		t.Fatalf("/api/tags through the gate: %+v, %v", tags, err)
	}
	if v, err := through.Version(t.Context()); err != nil || v == "" {
		t.Fatalf("/api/version through the gate: %q, %v", v, err)
	}
	if err := through.Heartbeat(t.Context()); err != nil {
		t.Fatalf("HEAD / through the gate: %v", err)
	}
}

// `ollama stop` sends an unload: Ollama answers at once, before the
// runner is gone; the gate answers only once /api/ps no longer lists the
// model. (An unload that Ollama loses during a load needs the runner
// process check, which only a real server allows: see the integration
// suite's TestGateStopDuringLoad.)
func TestUnloadAnsweredWhenGone(t *testing.T) {
	for _, version := range []string{"0.6.5", "0.17.4"} {
		t.Run(version, func(t *testing.T) {
			sim := newSim(t, vramguardtest.Config{Version: version, UnloadDelay: 200 * time.Millisecond})
			g := startGate(t, sim.URL().String(), nil)
			load(t, sim.APIClient(), "tiny")
			var reply api.GenerateResponse
			err := apiClient(t, g.URL).Generate(t.Context(), &api.GenerateRequest{Model: "tiny", KeepAlive: &api.Duration{}}, func(r api.GenerateResponse) error {
				reply = r
				return nil
			})
			if err != nil {
				t.Fatalf("unload through the gate: %v", err)
			}
			if sim.Listed("tiny") {
				t.Fatal("the unload was answered while /api/ps still lists tiny")
			}
			if reply.DoneReason != "unload" || !reply.Done {
				t.Fatalf("reply %+v, want done_reason unload", reply)
			}
			// Straight to the server, the same request is answered while
			// the runner is still listed.
			load(t, sim.APIClient(), "tiny")
			err = sim.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", KeepAlive: &api.Duration{}}, func(api.GenerateResponse) error { return nil })
			if err != nil || !sim.Listed("tiny") {
				t.Fatalf("the baseline: err %v, tiny listed %v (want listed: the test would prove nothing)", err, sim.Listed("tiny"))
			}
		})
	}
}

// The unload's reply says what was verified: the "vramgate" object and
// the X-Vramgate-Unload header.
func TestUnloadSaysWhatWasVerified(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	load(t, sim.APIClient(), "tiny")
	code, hdr, body := do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","keep_alive":0,"stream":false}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	var reply struct {
		Done       bool       `json:"done"`
		DoneReason string     `json:"done_reason"`
		Vramgate   unloadJSON `json:"vramgate"`
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		t.Fatal(err)
	}
	v := reply.Vramgate
	if !reply.Done || reply.DoneReason != "unload" || !v.Verified || v.Checked != "ps" || v.NoRunnerCheck == "" {
		t.Fatalf("reply %s", body)
	}
	if h := hdr.Get(unloadTrailer); !strings.HasPrefix(h, "verified; checked=ps") || !strings.Contains(h, "no runner check") {
		t.Fatalf("%s: %q", unloadTrailer, h)
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("stream:false answered as %q", ct)
	}
	// A chat unload, streamed, is answered in chat's shape.
	load(t, sim.APIClient(), "tiny")
	code, hdr, body = do(t, "POST", g.URL+"/api/chat", `{"model":"tiny","keep_alive":"0s"}`)
	if code != 200 || !strings.Contains(string(body), `"message":{`) || hdr.Get("Content-Type") != "application/x-ndjson" || sim.Listed("tiny") {
		t.Fatalf("chat unload: %d %q %s", code, hdr.Get("Content-Type"), body)
	}
	// An unknown model is Ollama's 404.
	if code, _, body = do(t, "POST", g.URL+"/api/generate", `{"model":"nope","keep_alive":0}`); code != 404 {
		t.Fatalf("unload of an unknown model: %d %s", code, body)
	}
}

// A generation sent with keep_alive 0 ends with the model verified gone
// before its done line reaches the client; the trailer says so.
func TestKeepAliveZeroHoldsTheDoneLine(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{Version: "0.17.4", UnloadDelay: 150 * time.Millisecond})
	g := startGate(t, sim.URL().String(), nil)
	resp := post(t, g.URL+"/api/generate", `{"model":"tiny","prompt":"hi","keep_alive":0}`)
	br := bufio.NewReader(resp.Body)
	lines := 0
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			lines++
			if isDoneLine(line) && sim.Listed("tiny") {
				t.Fatal("the done line arrived while /api/ps still lists tiny")
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if lines != 4 { // 3 chunks and the done line
		t.Fatalf("%d lines, want 4", lines)
	}
	if tr := resp.Trailer.Get(unloadTrailer); !strings.HasPrefix(tr, "verified") {
		t.Fatalf("trailer %s = %q", unloadTrailer, tr)
	}
}

// POST /api/unload: one model, all, and bad bodies.
func TestUnloadRoute(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	load(t, sim.APIClient(), "tiny")
	load(t, sim.APIClient(), "small")
	code, _, body := do(t, "POST", g.URL+"/api/unload", `{"model":"tiny"}`)
	if code != 200 || !strings.Contains(string(body), `"verified":true`) || sim.Listed("tiny") || !sim.Listed("small") {
		t.Fatalf("unload tiny: %d %s", code, body)
	}
	load(t, sim.APIClient(), "tiny")
	code, _, body = do(t, "POST", g.URL+"/api/unload", `{"all":true}`)
	var ans struct {
		Unloaded []unloadJSON `json:"unloaded"`
		Verified bool         `json:"verified"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || code != 200 || !ans.Verified || len(ans.Unloaded) != 2 || sim.Listed("tiny") || sim.Listed("small") {
		t.Fatalf("unload all: %d %s (%v)", code, body, err)
	}
	for _, bad := range []string{``, `{`, `{}`, `{"model":"tiny","all":true}`} {
		if code, _, body := do(t, "POST", g.URL+"/api/unload", bad); code != 400 || !strings.Contains(string(body), `"error"`) {
			t.Errorf("body %q: %d %s, want 400 with an error", bad, code, body)
		}
	}
}

// Hostile bodies: too large (413), malformed (400); neither reaches the
// server nor loads anything.
func TestHostileBodies(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil, "-max-body", "4096")
	big := `{"model":"tiny","prompt":"` + strings.Repeat("x", 8192) + `"}`
	for _, tc := range []struct {
		path, body string
		code       int
	}{
		{"/api/generate", big, 413},
		{"/api/chat", big, 413},
		{"/vramgate/leases", big, 413},
		{"/api/generate", `{"model":"tiny","prompt":`, 400},
		{"/api/chat", `[1,2]`, 400},
		{"/api/generate", `{"model":"tiny","keep_alive":{}}`, 400},
		{"/vramgate/leases", `{"model":1}`, 400},
	} {
		code, _, body := do(t, "POST", g.URL+tc.path, tc.body)
		if code != tc.code || !strings.Contains(string(body), `"error":"vramgate: `) {
			t.Errorf("POST %s %.40q: %d %s, want %d", tc.path, tc.body, code, body, tc.code)
		}
	}
	if n := sim.Requests("tiny"); n != 0 || sim.Listed("tiny") {
		t.Fatalf("%d requests reached the server", n)
	}
}

// A client that disconnects in the middle of a keep_alive 0 generation
// leaves nothing loaded: the gate unloads the model, verified.
func TestDisconnectMidStream(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "tiny", Size: 2 * gib, Chunks: 50, TokenLatency: 20 * time.Millisecond},
	}})
	g := startGate(t, sim.URL().String(), nil)
	ctx, cancel := context.WithCancel(t.Context())
	c := apiClient(t, g.URL)
	n := 0
	err := c.Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: "hi", KeepAlive: &api.Duration{}}, func(api.GenerateResponse) error {
		if n++; n == 3 {
			cancel()
		}
		return nil
	})
	if err == nil {
		t.Fatal("the cut generation returned nil")
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer wcancel()
	if err := sim.WaitFor(wctx, func() bool { return !sim.Listed("tiny") && sim.InFlight("tiny") == 0 }); err != nil {
		t.Fatalf("tiny still loaded after the client left: %v", err)
	}
}

// A phase of another vramguard program keeps its model: with one slot
// (-max-loaded 1), a chat client's request for another model gets 503
// with Retry-After and a body naming the holder; the phase's next step is
// a reuse. With the phase over, the same request is admitted: the gate
// unloads the idle model (verified) and the load goes on.
func TestPhaseLeaseRefusesALoad(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil, "-max-loaded", "1", "-retry-after", "7s")
	other, err := vramguard.NewClient(vramguard.Options{Host: sim.URL().String(), Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ph, err := other.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pg := ph.Guard()
	step := func() *vramguard.Generation {
		gen, err := pg.Generate(t.Context(), &vramguard.GenerateRequest{Model: "tiny", Prompt: "a castle"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return gen
	}
	if gen := step(); !gen.Loaded {
		t.Fatal("the phase's first step did not load tiny")
	}
	code, hdr, body := do(t, "POST", g.URL+"/api/chat", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`, clientHeader, "chat-ui")
	if code != 503 {
		t.Fatalf("status %d, want 503: %s", code, body)
	}
	if ra := hdr.Get("Retry-After"); ra != "7" {
		t.Fatalf("Retry-After %q, want 7 (the phase's lease has no end)", ra)
	}
	var ref refusal
	if err := json.Unmarshal(body, &ref); err != nil {
		t.Fatal(err)
	}
	if ref.Reason != "leased" || len(ref.Blockers) != 1 || ref.Blockers[0].Kind != "lease" || ref.Blockers[0].Model != "tiny:latest" ||
		!strings.Contains(ref.Blockers[0].Holder, "phase prompts") || ref.RetryAfterKnown {
		t.Fatalf("refusal %s", body)
	}
	if sim.Listed("small") || sim.Requests("small") != 0 {
		t.Fatal("the refused request reached the server")
	}
	if gen := step(); gen.Loaded {
		t.Fatal("the phase's next step reloaded tiny")
	}
	if _, err := ph.End(t.Context()); err != nil {
		t.Fatal(err)
	}
	load(t, sim.APIClient(), "tiny") // resident again, now unleased
	code, hdr, body = do(t, "POST", g.URL+"/api/chat", `{"model":"small","messages":[{"role":"user","content":"hi"}],"stream":false}`, clientHeader, "chat-ui")
	if code != 200 || sim.Listed("tiny") || !sim.Listed("small") {
		t.Fatalf("after the phase: %d %s (tiny listed %v)", code, body, sim.Listed("tiny"))
	}
	if a := hdr.Get("X-Vramgate-Admission"); !strings.Contains(a, "unloaded to make room: tiny") || !strings.Contains(a, "not checked: memory (no GPU reader)") {
		t.Fatalf("X-Vramgate-Admission %q", a)
	}
}

// GET /vramgate/can-load answers as the admission would, and changes
// nothing.
func TestCanLoad(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil, "-max-loaded", "1")
	load(t, sim.APIClient(), "tiny")
	code, _, body := do(t, "GET", g.URL+"/vramgate/can-load?model=tiny", "")
	if code != 200 || !strings.Contains(string(body), `"resident": true`) && !strings.Contains(string(body), `"resident":true`) {
		t.Fatalf("resident model: %d %s", code, body)
	}
	code, _, body = do(t, "GET", g.URL+"/vramgate/can-load?model=small", "")
	if code != 200 || !strings.Contains(string(body), "would unload tiny") || !sim.Listed("tiny") {
		t.Fatalf("can-load small: %d %s (tiny listed %v)", code, body, sim.Listed("tiny"))
	}
	code, _, body = do(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"batch","ttl":"1m"}`)
	if code != 201 {
		t.Fatalf("lease: %d %s", code, body)
	}
	code, hdr, body := do(t, "GET", g.URL+"/vramgate/can-load?model=small", "")
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), "vramgate lease of batch") || !strings.Contains(string(body), `"retry_after_known":true`) {
		t.Fatalf("can-load small with tiny leased: %d %s", code, body)
	}
	if code, _, _ := do(t, "GET", g.URL+"/vramgate/can-load", ""); code != 400 {
		t.Fatalf("can-load without a model: %d", code)
	}
	if sim.Loads("small") != 0 || !sim.Listed("tiny") {
		t.Fatal("can-load changed something")
	}
}

// Leases over HTTP: taken, listed, honoured by other vramguard programs
// and by the gate's own unloads, extended, released only with their id,
// and ended at their TTL when the client does not come back.
func TestHTTPLeases(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil, "-lease-max", "2m")
	other, err := vramguard.NewClient(vramguard.Options{Host: sim.URL().String(), Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	load(t, sim.APIClient(), "tiny")
	code, _, body := do(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"render-box","ttl":"1m"}`)
	var l leaseAnswer
	if err := json.Unmarshal(body, &l); err != nil || code != 201 || len(l.ID) != 32 || l.Model != "tiny:latest" || l.Holder != "render-box" {
		t.Fatalf("take: %d %s", code, body)
	}
	if _, err := other.UnloadModel(t.Context(), "tiny"); !errorsIsLeased(err) {
		t.Fatalf("another program's unload of the leased model: %v, want ErrLeased", err)
	}
	code, _, body = do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","keep_alive":0}`)
	if code != 409 || !strings.Contains(string(body), "render-box") || !sim.Listed("tiny") {
		t.Fatalf("unload through the gate of the leased model: %d %s", code, body)
	}
	code, _, body = do(t, "GET", g.URL+"/vramgate/leases", "")
	if code != 200 || !strings.Contains(string(body), "render-box") || strings.Contains(string(body), l.ID) {
		t.Fatalf("list: %d %s", code, body)
	}
	// Another id, or none: 404; another holder's lease cannot be released.
	for _, id := range []string{"0123456789abcdef0123456789abcdef", "x"} {
		if code, _, _ := do(t, "DELETE", g.URL+"/vramgate/leases/"+id, ""); code != 404 {
			t.Errorf("DELETE %s: %d, want 404", id, code)
		}
	}
	for _, bad := range []string{`{"model":"tiny","holder":"x","ttl":"3m"}`, `{"model":"tiny","holder":"x","ttl":0}`, `{"model":"tiny"}`, `{"holder":"x"}`, `{"model":"tiny","holder":"a\u0000b"}`} {
		if code, _, body := do(t, "POST", g.URL+"/vramgate/leases", bad); code != 400 {
			t.Errorf("take %s: %d %s, want 400", bad, code, body)
		}
	}
	code, _, body = do(t, "POST", g.URL+"/vramgate/leases/"+l.ID, `{"ttl":"200ms"}`)
	if code != 200 {
		t.Fatalf("extend: %d %s", code, body)
	}
	// The client vanishes: the lease ends at its TTL.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		_, err := other.UnloadModel(ctx, "tiny")
		if err == nil {
			break
		}
		if !errorsIsLeased(err) {
			t.Fatalf("unload after the TTL: %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the lease did not end at its TTL")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if code, _, _ := do(t, "DELETE", g.URL+"/vramgate/leases/"+l.ID, ""); code != 404 {
		t.Fatalf("DELETE of the expired lease: %d, want 404", code)
	}
	// Taken and released.
	code, _, body = do(t, "POST", g.URL+"/vramgate/leases", `{"model":"small","holder":"h"}`)
	if err := json.Unmarshal(body, &l); err != nil || code != 201 {
		t.Fatalf("take: %d %s", code, body)
	}
	if code, _, body := do(t, "DELETE", g.URL+"/vramgate/leases/"+l.ID, ""); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
}

func errorsIsLeased(err error) bool { return err != nil && strings.Contains(err.Error(), "leased") }

// With a GPU reader, a load that does not fit is refused with the
// holders named, and admitted when -make-room can make the room.
func TestMemoryAdmission(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 10 * gib, Models: []vramguardtest.ModelConfig{
		{Name: "tiny", Size: 2 * gib, Chunks: 1},
		{Name: "small", Size: 3 * gib, Chunks: 1},
	}})
	if err := sim.Reserve("python render.py", 4*gib); err != nil {
		t.Fatal(err)
	}
	g := startGate(t, sim.URL().String(), sim.GPU(), "-reserve", fmt.Sprint(1*gib))
	load(t, sim.APIClient(), "tiny") // 2 GiB: 4 GiB left; small needs its estimate (4.7 GiB) + 1
	code, hdr, body := do(t, "POST", g.URL+"/api/generate", `{"model":"small","prompt":"hi"}`, clientHeader, "script")
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), `"reason":"no room"`) || !strings.Contains(string(body), "python render.py") ||
		!strings.Contains(string(body), fmt.Sprintf(`{"kind":"reserve","holder":"vramgate -reserve","bytes":%d}`, 1*gib)) {
		t.Fatalf("no room: %d %s", code, body)
	}
	if sim.Requests("small") != 0 {
		t.Fatal("the refused load reached the server")
	}
	stop := g.stop(t)
	if stop != 0 {
		t.Fatalf("stop: %d", stop)
	}
	g2 := startGate(t, sim.URL().String(), sim.GPU(), "-reserve", fmt.Sprint(1*gib), "-make-room")
	code, hdr, body = do(t, "POST", g2.URL+"/api/generate", `{"model":"small","prompt":"hi","stream":false}`)
	if code != 200 || sim.Listed("tiny") || !sim.Listed("small") {
		t.Fatalf("make room: %d %s", code, body)
	}
	if a := hdr.Get("X-Vramgate-Admission"); !strings.Contains(a, "checked: memory") || !strings.Contains(a, "unloaded to make room: tiny") {
		t.Fatalf("X-Vramgate-Admission %q", a)
	}
}

// /metrics names the client of each request and why each load happened;
// /ready answers as vramwatch's.
func TestMetricsAndReady(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	c := apiClient(t, g.URL)
	load(t, c, "tiny")
	if code, _, body := do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","keep_alive":0}`, clientHeader, "chat-ui"); code != 200 {
		t.Fatalf("unload: %d %s", code, body)
	}
	if code, _, body := do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","prompt":"x","stream":false}`, clientHeader, "script"); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	code, _, body := do(t, "GET", g.URL+"/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`vramgate_requests_total{client="chat-ui",code="200",route="/api/generate"} 1`,
		`vramgate_loads_total{cause="first",client="unnamed",model="tiny:latest"} 1`,
		`vramgate_loads_total{cause="gate unload",client="script",model="tiny:latest"} 1`,
		`vramgate_unloads_total{client="chat-ui",model="tiny:latest",outcome="verified"} 1`,
		`vramguard_model_resident{model="tiny:latest"`,
		`vramguard_ollama_up{`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(g.Stderr.String(), "by=chat-ui") {
		t.Errorf("the reload's log line does not name the client whose unload it was:\n%s", g.Stderr)
	}
	code, _, body = do(t, "GET", g.URL+"/ready?model=tiny", "")
	if code != 200 || !strings.Contains(string(body), `"state": "resident"`) {
		t.Fatalf("/ready?model=tiny: %d %s", code, body)
	}
	if code, _, _ := do(t, "GET", g.URL+"/ready?bogus=1", ""); code != 400 {
		t.Fatalf("/ready with a bad query: %d", code)
	}
}

// A clean stop unloads, verified, what loaded through the gate, and
// releases the HTTP leases; -keep-on-exit leaves the models.
func TestStop(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	load(t, apiClient(t, g.URL), "tiny")
	load(t, sim.APIClient(), "small") // not through the gate
	if code, _, body := do(t, "POST", g.URL+"/vramgate/leases", `{"model":"small","holder":"h"}`); code != 201 {
		t.Fatalf("lease: %d %s", code, body)
	}
	if code := g.stop(t); code != 0 {
		t.Fatalf("stop: %d\n%s", code, g.Stderr)
	}
	if !strings.Contains(g.Stderr.String(), "vramgate: stopping: no new requests; those in flight have 10s to end\n") {
		t.Errorf("the stop was not announced:\n%s", g.Stderr)
	}
	if sim.Listed("tiny") || !sim.Listed("small") {
		t.Fatalf("after the stop: tiny listed %v (want gone), small %v (want kept)", sim.Listed("tiny"), sim.Listed("small"))
	}
	other, err := vramguard.NewClient(vramguard.Options{Host: sim.URL().String(), Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.UnloadModel(t.Context(), "small"); err != nil {
		t.Fatalf("the HTTP lease outlived the gate: %v", err)
	}

	g2 := startGate(t, sim.URL().String(), nil, "-keep-on-exit")
	load(t, apiClient(t, g2.URL), "tiny")
	if code := g2.stop(t); code != 0 || !sim.Listed("tiny") {
		t.Fatalf("-keep-on-exit: exit %d, tiny listed %v", code, sim.Listed("tiny"))
	}
}

// The README's set-up is what the gate does: its two lines start it with
// the defaults, and the line shown is what it prints then.
func TestREADME(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	sec, _, _ := strings.Cut(readme[strings.Index(readme, "## For programs that do not use vramguard"):], "\n## Observability")
	if !strings.Contains(sec, "go run ./cmd/vramgate -ollama 127.0.0.1:11435\n") || !strings.Contains(sec, "OLLAMA_HOST=127.0.0.1:11435 ollama serve\n") {
		t.Fatal("the README's two lines changed: update this test with them")
	}
	cfg, err := (&cmd{stderr: io.Discard}).parse([]string{"-ollama", "127.0.0.1:11435"})
	if err != nil {
		t.Fatal(err)
	}
	up, err := parseUpstream(cfg.ollama)
	if err != nil {
		t.Fatal(err)
	}
	if line := startLine(cfg.listen, up.String()); !strings.Contains(sec, "\n"+line+"\n") {
		t.Fatalf("the README does not show the line the gate prints:\n%s", line)
	}
	// The line the test gates print is startLine's.
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	if first, _, _ := strings.Cut(g.Stderr.String(), "\n"); first != startLine(strings.TrimPrefix(g.URL, "http://"), sim.URL().String()) {
		t.Fatalf("the gate printed %q", first)
	}
}

// A vramguard program pointed at the gate names the gate's address in its
// leases: the gate honours them as its upstream's (with -listen
// 127.0.0.1:0 the address is the port the listener got).
func TestLeaseOfAProgramBehindTheGate(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	behind, err := vramguard.NewClient(vramguard.Options{Host: g.URL, Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer behind.Close()
	load(t, sim.APIClient(), "tiny")
	l, err := behind.HoldModel(t.Context(), "tiny", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	code, _, body := do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","keep_alive":0}`)
	if code != 409 || !sim.Listed("tiny") || !strings.Contains(string(body), "leased") {
		t.Fatalf("unload through the gate of a model leased behind it: %d %s (listed %v)", code, body, sim.Listed("tiny"))
	}
}

// An unload sent while a load through the gate is still running waits for
// that load to end, then unloads, verified: on a server whose runners
// this machine cannot see (the test double, a container, a remote host)
// /api/ps alone would call it gone, and Ollama 0.17 on loses the unload.
func TestUnloadDuringALoadThroughTheGate(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{Version: "0.17.4", Models: []vramguardtest.ModelConfig{
		{Name: "tiny", Size: 2 * gib, Chunks: 2, LoadLatency: 300 * time.Millisecond},
	}})
	g := startGate(t, sim.URL().String(), nil)
	c := apiClient(t, g.URL)
	gen := make(chan error, 1)
	go func() {
		gen <- c.Generate(context.Background(), &api.GenerateRequest{Model: "tiny", Prompt: "hi", KeepAlive: &api.Duration{Duration: 5 * time.Minute}},
			func(api.GenerateResponse) error { return nil })
	}()
	for deadline := time.Now().Add(10 * time.Second); sim.Requests("tiny") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the load did not reach the server")
		}
	}
	if sim.Listed("tiny") {
		t.Fatal("tiny is listed already: the unload would not be sent during the load")
	}
	code, hdr, body := do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","keep_alive":0}`)
	if code != 200 || !strings.HasPrefix(hdr.Get(unloadTrailer), "verified") {
		t.Fatalf("unload during the load: %d %q %s", code, hdr.Get(unloadTrailer), body)
	}
	if err := <-gen; err != nil {
		t.Logf("the loading generation: %v", err)
	}
	if sim.Listed("tiny") {
		t.Fatal("tiny is resident after the unload was answered")
	}
}

// With one slot, a load that would need the slot of a model a request
// through the gate is using is refused (503, "in use"), and that request
// goes on undisturbed.
func TestSlotOfAModelInUse(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "tiny", Size: 2 * gib, Chunks: 2},
		{Name: "small", Size: 3 * gib, Chunks: 40, TokenLatency: 10 * time.Millisecond},
	}})
	g := startGate(t, sim.URL().String(), nil, "-max-loaded", "1")
	c := apiClient(t, g.URL)
	load(t, c, "small")
	n := 0
	gen := make(chan error, 1)
	go func() {
		gen <- c.Generate(context.Background(), &api.GenerateRequest{Model: "small", Prompt: "hi"}, func(api.GenerateResponse) error {
			n++
			return nil
		})
	}()
	for deadline := time.Now().Add(10 * time.Second); sim.InFlight("small") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream on small did not reach the server")
		}
	}
	code, hdr, body := do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","prompt":"hi"}`)
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), `"reason":"in use"`) || !strings.Contains(string(body), "requests through the gate") {
		t.Fatalf("load beside a model in use: %d %s", code, body)
	}
	if err := <-gen; err != nil || n != 41 {
		t.Fatalf("the stream on small: %v after %d chunks", err, n)
	}
	if !sim.Listed("small") || sim.Requests("tiny") != 0 {
		t.Fatal("small was evicted, or tiny reached the server")
	}
}

// A load of a model the server does not have makes no room: Ollama's own
// 404 answers it, and nothing resident is unloaded; can-load says 404.
func TestUnknownModelMakesNoRoom(t *testing.T) {
	for _, reader := range []bool{false, true} {
		t.Run(fmt.Sprintf("reader=%v", reader), func(t *testing.T) { unknownModelMakesNoRoom(t, reader) })
	}
}

func unknownModelMakesNoRoom(t *testing.T, reader bool) {
	sim := newSim(t, vramguardtest.Config{})
	var r vramguard.VRAMReader
	if reader {
		r = sim.GPU() // the estimate is the existence check
	}
	g := startGate(t, sim.URL().String(), r, "-max-loaded", "1", "-make-room")
	load(t, sim.APIClient(), "tiny")
	code, hdr, body := do(t, "POST", g.URL+"/api/generate", `{"model":"nosuch","prompt":"hi"}`)
	if code != 404 || !sim.Listed("tiny") || !strings.Contains(hdr.Get("X-Vramgate-Admission"), "not found") {
		t.Fatalf("load of an unknown model: %d %q %s (tiny listed %v)", code, hdr.Get("X-Vramgate-Admission"), body, sim.Listed("tiny"))
	}
	if code, _, body := do(t, "GET", g.URL+"/vramgate/can-load?model=nosuch", ""); code != 404 {
		t.Fatalf("can-load of an unknown model: %d %s", code, body)
	}
}

// POST /api/unload {"all": true} with a leased model: the others go,
// verified; the leased one is named as left, and the answer does not say
// that everything was verified gone.
func TestUnloadAllLeavesLeased(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	load(t, sim.APIClient(), "tiny")
	load(t, sim.APIClient(), "small")
	if code, _, body := do(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"h"}`); code != 201 {
		t.Fatalf("lease: %d %s", code, body)
	}
	code, hdr, body := do(t, "POST", g.URL+"/api/unload", `{"all":true}`)
	var ans struct {
		Left     []string `json:"left"`
		Verified bool     `json:"verified"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || code != 200 || ans.Verified || len(ans.Left) != 1 || ans.Left[0] != "tiny:latest" {
		t.Fatalf("unload all: %d %s (%v)", code, body, err)
	}
	if !sim.Listed("tiny") || sim.Listed("small") || !strings.Contains(hdr.Get(unloadTrailer), "1 left") {
		t.Fatalf("after: tiny listed %v, small %v, %s %q", sim.Listed("tiny"), sim.Listed("small"), unloadTrailer, hdr.Get(unloadTrailer))
	}
}

// An explicit -lease-dir the gate cannot use stops the start with the
// reason (exit 1: the flag is well formed, the directory is not usable);
// the default directory, when unusable, only degrades, with a WARN line
// at start.
func TestLeaseDirAtStart(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, dir, want string }{
		{"mode 0755", open, "mode"},
		{"a file", file, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr syncBuffer
			c := &cmd{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" },
				ready: func(string) { t.Error("the gate listened") }}
			code := c.main(t.Context(), []string{"-listen", "127.0.0.1:0", "-ollama", sim.URL().String(), "-gpu=false", "-lease-dir", tc.dir})
			if code != 1 || !strings.Contains(stderr.String(), "-lease-dir "+tc.dir+" cannot be used") || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant 1 and the reason (%q)", code, stderr.String(), tc.want)
			}
		})
	}
	t.Run("default", func(t *testing.T) {
		// The default is $XDG_RUNTIME_DIR/vramguard/leases: made unusable
		// by a file where its vramguard directory would be.
		xdg := t.TempDir()
		if err := os.WriteFile(filepath.Join(xdg, "vramguard"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("XDG_RUNTIME_DIR", xdg)
		g := &running{Stderr: &syncBuffer{}, done: make(chan int, 1)}
		addr := make(chan string, 1)
		c := &cmd{stdout: io.Discard, stderr: g.Stderr, getenv: func(string) string { return "" }, ready: func(a string) { addr <- a }}
		ctx, cancel := context.WithCancel(t.Context())
		g.cancel = cancel
		go func() {
			g.done <- c.main(ctx, []string{"-listen", "127.0.0.1:0", "-ollama", sim.URL().String(), "-gpu=false"})
		}()
		select {
		case <-addr:
		case code := <-g.done:
			t.Fatalf("the gate exited with %d: the default lease directory must only degrade:\n%s", code, g.Stderr)
		}
		if code := g.stop(t); code != 0 || !strings.Contains(g.Stderr.String(), `level=WARN msg="host-wide leases off`) {
			t.Fatalf("exit %d; want 0 and a WARN line at start:\n%s", code, g.Stderr)
		}
	})
}
