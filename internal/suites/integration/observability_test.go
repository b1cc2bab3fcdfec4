package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramprom"
)

// scrapeInterval is the Prometheus server's scrape interval; waits for a
// series are bounded by scrapeWaits of them.
const (
	scrapeInterval = time.Second
	scrapeWaits    = 30
)

// modelAName is ModelA as /api/ps and the metrics name it.
var modelAName = vramguard.NormalizeModelName(modelA)

// A real Prometheus server scrapes vramwatch -listen (the process-side
// view: /api/ps and /proc) and, in this process, a vramprom collector whose
// hooks are on the test's client and whose GPU follows the server's
// /api/ps (vramguardtest.PSGPU: no GPU here). A load and a verified unload
// of the test's client reach Prometheus as residency rising and falling,
// a load and a verified unload counted, and device memory by holder that
// adds up to the device's total.
func TestPrometheusScrapes(t *testing.T) {
	prom := prometheusBinary(t)
	bin := buildVramwatch(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		watch := startVramwatch(t, bin, s)

		const total = 16 << 30
		col, err := vramprom.New(vramprom.Config{VRAM: &vramguardtest.PSGPU{Client: s.Client(), Total: total}})
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(col)
		c := newClient(t, s, vramguard.Options{Hooks: col.Hooks()})
		stop := col.Watch(c)
		t.Cleanup(stop)
		own := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.Cleanup(own.Close)

		p := startPrometheus(t, prom, map[string]string{"vramwatch": watch.Host, "inprocess": own.Listener.Addr().String()})
		p.await(t, `up == 1`, "both targets up", func(v []sample) bool { return len(v) == 2 })

		if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		m := fmt.Sprintf(`model=%q`, modelAName)
		p.await(t, `vramguard_model_resident{job="vramwatch",`+m+`}`, "vramwatch sees the model resident", value(func(x float64) bool { return x == 1 }))
		p.await(t, `vramwatch_runner_processes{job="vramwatch",`+m+`,server_gone="false"}`, "vramwatch sees its runner process", value(func(x float64) bool { return x == 1 }))
		p.await(t, `vramguard_model_loads_total{job="inprocess",`+m+`,reload_cause="none"}`, "the load counted", value(func(x float64) bool { return x >= 1 }))
		p.await(t, `vramguard_device_memory_bytes{job="inprocess",kind="runner",holder=`+strconv.Quote(modelAName)+`}`, "the runner's device memory", value(func(x float64) bool { return x > 0 }))
		p.await(t, `sum(vramguard_device_memory_bytes{job="inprocess",device="0"})`, "holders adding up to the device's total", value(func(x float64) bool { return x == total }))

		rep, err := c.UnloadModel(t.Context(), modelA)
		if err != nil || !rep.Verified {
			t.Fatalf("UnloadModel: %+v, %v", rep, err)
		}
		p.await(t, `vramguard_model_unloads_total{job="inprocess",`+m+`,cause="unload",outcome="verified"}`, "the verified unload counted", value(func(x float64) bool { return x >= 1 }))
		p.await(t, `vramguard_model_resident{job="vramwatch",`+m+`}`, "the model gone from vramwatch's gauge", func(v []sample) bool { return len(v) == 0 })
		p.await(t, `vramwatch_runner_processes{job="vramwatch",`+m+`}`, "its runner gone", func(v []sample) bool { return len(v) == 0 })
		p.await(t, `vramguard_device_memory_bytes{job="inprocess",kind="free"}`, "the device all free", value(func(x float64) bool { return x == total }))
	})
}

// vramwatch -listen's /ready against each real server: resident and
// verified against its runner process after a load, absent after a
// verified unload, loading while a load is held (its runner stopped with
// SIGSTOP: Ollama lists a model only once it is loaded), and never "enough
// free memory" without a GPU reader.
func TestReadyOnRealServers(t *testing.T) {
	bin := buildVramwatch(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "the runner check reads this machine's processes, and the test stops a runner")
		w := startVramwatch(t, bin, s)
		c := newClient(t, s, vramguard.Options{})

		if _, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		r := w.ready(t, "model="+modelA, http.StatusOK)
		pids, err := s.RunnerPIDs()
		if err != nil {
			t.Fatal(err)
		}
		if m := r.Model; m.State != "resident" || !m.Verified || m.Checked != "ps+runner-processes" || len(m.RunnerPIDs) != 1 ||
			!slices.Contains(pids, int(m.RunnerPIDs[0])) || m.ExpiresAt == nil || !m.ExpiresAt.After(time.Now().Add(50*time.Minute)) {
			t.Errorf("after a load: model %+v; want resident, verified by runner %v, expiring in about an hour", m, pids)
		}
		r = w.ready(t, "model="+modelA+"&free=1", http.StatusServiceUnavailable)
		if d := r.Device; d == nil || d.Enough || d.Free != nil || !slices.Contains(r.Reasons, "no GPU reader: device memory not measured") {
			t.Errorf("free=1 without a GPU reader: device %+v, reasons %q", d, r.Reasons)
		}

		rep, err := c.UnloadModel(t.Context(), modelA)
		if err != nil || !rep.Verified {
			t.Fatalf("UnloadModel: %+v, %v", rep, err)
		}
		r = w.ready(t, "model="+modelA, http.StatusServiceUnavailable)
		if m := r.Model; m.State != "absent" || !m.Verified || len(m.RunnerPIDs) != 0 {
			t.Errorf("after a verified unload: model %+v; want absent, verified", m)
		}

		t.Run("loading", func(t *testing.T) {
			if listsWhileLoading(s.Version()) {
				// Measured: with the runner stopped 1-2 ms after it showed,
				// v0.6.5's /api/ps listed the model (expires_at now plus
				// the keep-alive, moving) for as long as it stayed
				// stopped, 5 tries of 5. Its scheduler registers a runner
				// when its load starts; later versions when it ends.
				t.Skipf("Ollama %s lists a model in /api/ps from the start of its load: /ready says resident there, as /api/ps does (loading is tested on later versions and on vramguardtest)", s.Version())
			}
			readyWhileLoading(t, s, c, w)
		})
	})
}

// listsWhileLoading reports whether Ollama version v lists a model in
// /api/ps while it is still loading: before v0.17 (v0.6.5 measured).
func listsWhileLoading(v string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major == 0 && minor < 17
}

// readyWhileLoading starts a load of ModelA, stops its runner as soon as
// it shows, and asks /ready. A load that ended before the runner was
// stopped (a tiny model loads in some 300 ms) is unloaded and tried again.
func readyWhileLoading(t *testing.T, s *ollamatest.Server, c *vramguard.OllamaClient, w *vramwatch) {
	const tries = 5
	for try := 1; try <= tries; try++ {
		done := make(chan error, 1)
		go func() {
			_, err := c.GenerateStreaming(t.Context(), req(modelA, 2), vramguard.KeepAliveFor(time.Hour), nil)
			done <- err
		}()
		pid, err := stopRunner(s, done)
		if err != nil {
			t.Fatal(err)
		}
		var r *readiness
		if pid != 0 {
			r = w.ready(t, "model="+modelA, 0)
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %d: %v", pid, err)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("the generation whose load was held: %v", err)
		}
		if rep, err := c.UnloadModel(t.Context(), modelA); err != nil || !rep.Verified {
			t.Fatalf("UnloadModel: %+v, %v", rep, err)
		}
		if r == nil || r.Model.State != "loading" {
			state := "the load ended before its runner showed"
			if r != nil {
				state = "state " + r.Model.State
			}
			t.Logf("try %d: load not caught (%s)", try, state)
			continue
		}
		if r.code != http.StatusServiceUnavailable || r.Ready || !r.Model.Verified || !slices.Equal(r.Model.RunnerPIDs, []uint32{uint32(pid)}) {
			t.Errorf("while loading: %d %+v, model %+v; want 503, verified by runner %d", r.code, r, r.Model, pid)
		}
		t.Logf("try %d: loading, reasons %q", try, r.Reasons)
		return
	}
	t.Errorf("no load caught in %d tries", tries)
}

// stopRunner waits for the server's runner to show and stops it
// (SIGSTOP), unless the generation ends first (pid 0), or the server lists
// the model already (the load ended: the runner is left running, pid 0).
func stopRunner(s *ollamatest.Server, done <-chan error) (int, error) {
	for {
		select {
		case err := <-done:
			return 0, errors.Join(errors.New("the generation ended before its runner was seen"), err)
		default:
		}
		pids, err := s.RunnerPIDs()
		if err != nil {
			return 0, err
		}
		if len(pids) == 1 {
			if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
				return 0, err
			}
			ps, err := s.Client().ListRunning(context.Background())
			if err == nil && len(ps.Models) == 0 {
				return pids[0], nil
			}
			_ = syscall.Kill(pids[0], syscall.SIGCONT) // loaded already, or /api/ps failed
			return 0, nil
		}
		time.Sleep(time.Millisecond)
	}
}

// vramwatch is a running vramwatch -listen.
type vramwatch struct {
	*url.URL
	hc *http.Client
}

// readiness is the part of /ready's body the tests read.
type readiness struct {
	code  int
	Ready bool `json:"ready"`
	Model *struct {
		State      string     `json:"state"`
		Verified   bool       `json:"verified"`
		Checked    string     `json:"checked"`
		RunnerPIDs []uint32   `json:"runner_pids"`
		ExpiresAt  *time.Time `json:"expires_at"`
	} `json:"model"`
	Device *struct {
		Free   *uint64 `json:"free"`
		Enough bool    `json:"enough"`
	} `json:"device"`
	Reasons []string `json:"reasons"`
}

// ready asks /ready?query and checks the status (any 200 or 503 when
// code is 0).
func (w *vramwatch) ready(t *testing.T, query string, code int) *readiness {
	t.Helper()
	resp, err := w.hc.Get(w.String() + "/ready?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := &readiness{code: resp.StatusCode}
	if err := json.Unmarshal(body, r); err != nil || r.Model == nil && r.Device == nil {
		t.Fatalf("/ready?%s: %d %s (%v)", query, resp.StatusCode, body, err)
	}
	if code != 0 && resp.StatusCode != code || code == 0 && resp.StatusCode != 200 && resp.StatusCode != 503 {
		t.Errorf("/ready?%s: %d, want %d:\n%s", query, resp.StatusCode, code, body)
	}
	t.Logf("/ready?%s: %d %s", query, resp.StatusCode, bytes.Join(bytes.Fields(body), []byte(" ")))
	return r
}

// buildVramwatch builds cmd/vramwatch into the test's folder.
func buildVramwatch(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vramwatch")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/vramguard/vramguard/cmd/vramwatch")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build vramwatch: %v\n%s", err, out)
	}
	return bin
}

// startVramwatch starts vramwatch -listen on a port of its choosing for
// s, with no GPU reader, and stops it (SIGTERM, which must end it with
// status 0) at the end of the test.
func startVramwatch(t *testing.T, bin string, s *ollamatest.Server) *vramwatch {
	t.Helper()
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-host", s.URL().String(), "-gpu=false")
	out, exited := startStopped(t, cmd, "vramwatch", true)
	var line string
	select {
	case line = <-out.first:
	case err := <-exited:
		t.Fatalf("vramwatch exited: %v\n%s", err, out)
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
	m := regexp.MustCompile(`^vramwatch: serving (http://127\.0\.0\.1:\d+)/metrics and /ready$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("vramwatch's first line %q", line)
	}
	u, err := url.Parse(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return &vramwatch{URL: u, hc: testHTTPClient(t)}
}

// testHTTPClient has a transport of the test's own, whose idle
// connections close with the test.
func testHTTPClient(t *testing.T) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// lineBuffer keeps a process's output and sends its first line that is
// not a log record (slog's "time=..." lines, which the library's client
// may write while the program starts) on first.
type lineBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	first chan string
	sent  bool
}

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	for rest := l.b.Bytes(); !l.sent; {
		line, after, ok := bytes.Cut(rest, []byte("\n"))
		if !ok {
			break
		}
		if !bytes.HasPrefix(line, []byte("time=")) {
			l.sent = true
			l.first <- string(line)
		}
		rest = after
	}
	return len(p), nil
}

func (l *lineBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// prometheusBinary is the Prometheus server to run: on PATH, else
// Debian's. Without one the test is skipped, except in CI, where
// scripts/install-prometheus.sh (make tools) installs it.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/prometheus"); err == nil {
		return "/usr/bin/prometheus"
	}
	if ollamatest.InCI() {
		t.Fatal("no prometheus binary (on PATH or /usr/bin): scripts/install-prometheus.sh installs it")
	}
	t.Skip("no prometheus binary (on PATH or /usr/bin): run scripts/install-prometheus.sh")
	return ""
}

// promServer is a running Prometheus server.
type promServer struct {
	base string
	hc   *http.Client
	out  *lineBuffer
}

// startPrometheus runs bin scraping each job's target (host:port) every
// scrapeInterval, with its storage in the test's folder, until the end of
// the test, and waits until it is ready.
func startPrometheus(t *testing.T, bin string, jobs map[string]string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: %s\n  scrape_timeout: %s\nscrape_configs:\n", scrapeInterval, scrapeInterval)
	names := make([]string, 0, len(jobs))
	for j := range jobs {
		names = append(names, j)
	}
	slices.Sort(names)
	for _, j := range names {
		cfg += fmt.Sprintf("  - job_name: %s\n    static_configs:\n      - targets: [%q]\n", j, jobs[j])
	}
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--config.file="+path, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	out, exited := startStopped(t, cmd, "prometheus", false)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus.yml:\n%s\nprometheus output:\n%s", cfg, out)
		}
	})
	p := &promServer{base: "http://" + addr, hc: testHTTPClient(t), out: out}
	deadline := time.Now().Add(scrapeWaits * scrapeInterval)
	for {
		resp, err := p.hc.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited: %v\n%s", err, out)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after %v:\n%s", scrapeWaits*scrapeInterval, out)
		}
	}
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// sample is one series of an instant query's result.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  float64
}

// query runs an instant query through Prometheus's HTTP API.
func (p *promServer) query(q string) ([]sample, error) {
	resp, err := p.hc.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"` // [time, "value"]
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %s: %s %s", q, resp.Status, body.Error)
	}
	var out []sample
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v", q, r.Value)
		}
		out = append(out, sample{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// await runs q until its result satisfies ok, for at most scrapeWaits
// scrape intervals.
func (p *promServer) await(t *testing.T, q, what string, ok func([]sample) bool) {
	t.Helper()
	deadline := time.Now().Add(scrapeWaits * scrapeInterval)
	for {
		v, err := p.query(q)
		if err == nil && ok(v) {
			t.Logf("%s: %s = %v", what, q, v)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s = %v (err %v) after %v", what, q, v, err, scrapeWaits*scrapeInterval)
		}
		time.Sleep(scrapeInterval / 4)
	}
}

// value is an await condition on a result of one series.
func value(ok func(float64) bool) func([]sample) bool {
	return func(v []sample) bool { return len(v) == 1 && ok(v[0].Value) }
}

// startStopped starts cmd with its output in a lineBuffer and stops it at
// the end of the test: SIGTERM, then SIGKILL after 10 s. With strict, the
// program must end with status 0 within those 10 s. exited receives cmd's
// end once (the cleanup waits for it).
func startStopped(t *testing.T, cmd *exec.Cmd, name string, strict bool) (*lineBuffer, <-chan error) {
	t.Helper()
	out := &lineBuffer{first: make(chan string, 1)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		done <- err
		exited <- err
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if strict && err != nil {
				t.Errorf("%s after SIGTERM: %v\n%s", name, err, out)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			if strict {
				t.Errorf("%s still running 10s after SIGTERM:\n%s", name, out)
			}
		}
	})
	return out, exited
}
