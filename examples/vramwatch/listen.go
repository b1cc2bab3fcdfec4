package main

// -listen: /metrics for Prometheus and /ready for probes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/vramprom"
)

// shutdownTimeout bounds the wait for requests in flight once the
// server is asked to stop.
const shutdownTimeout = 5 * time.Second

// serve answers /metrics and /ready on addr until ctx is done (SIGINT,
// SIGTERM), then shuts the server down gracefully.
func (c *cmd) serve(ctx context.Context, w *watcher, addr string) error {
	h, stop, err := newEndpoints(w)
	if err != nil {
		return err
	}
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &vramguard.Error{Op: "listen", Kind: vramguard.KindUnavailable, Err: err}
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.stderr, "vramwatch: serving http://%s/metrics and /ready\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return &vramguard.Error{Op: "serve", Kind: vramguard.KindUnavailable, Err: err}
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-done // http.ErrServerClosed
	if err != nil {
		return &vramguard.Error{Op: "shutdown", Kind: vramguard.KindTimeout, Err: err}
	}
	return nil
}

// newEndpoints returns the handler of /metrics and /ready, and the
// function that stops its watch of the server.
func newEndpoints(w *watcher) (http.Handler, func(), error) {
	cfg := vramprom.Config{}
	if w.gpu != nil {
		cfg.VRAM = namingReader{r: w.gpu, models: w.ollama}
	}
	col, err := vramprom.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col, newRunnerCollector(w))
	stop := col.Watch(w.ollama)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /ready", w.ready)
	return mux, stop, nil
}

// namingReader names the runners of each snapshot after their models, so
// that the device memory gauges say which model holds what.
type namingReader struct {
	r      vramguard.VRAMReader
	models gpu.Models
}

func (n namingReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	snap, err := n.r.Snapshot(ctx)
	if err == nil {
		_ = gpu.NameRunners(ctx, n.models, snap) // unnamed runners keep their blob
	}
	return snap, err
}

// runnerCollector exports the runner processes /proc shows, which need no
// GPU reader: an orphan (its ollama serve gone) holds memory until killed.
type runnerCollector struct {
	w    *watcher
	desc *prometheus.Desc
}

func newRunnerCollector(w *watcher) *runnerCollector {
	return &runnerCollector{w: w, desc: prometheus.NewDesc("vramwatch_runner_processes",
		"Ollama runner processes this machine's /proc shows, by the model each serves (\"\" when not known) and whether the ollama serve that started it is gone.",
		[]string{"model", "server_gone"}, nil)}
}

func (rc *runnerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- rc.desc }

func (rc *runnerCollector) Collect(ch chan<- prometheus.Metric) {
	snap := procSnapshot(rc.w.procRoot)
	if snap == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), rc.w.timeout)
	defer cancel()
	_ = gpu.NameRunners(ctx, rc.w.ollama, snap)
	type key struct{ model, gone string }
	n := map[key]int{}
	for _, p := range snap.Devices[0].Processes {
		model := p.Model
		if model != "" {
			model = vramguard.NormalizeModelName(model)
		}
		n[key{model, strconv.FormatBool(p.Orphaned)}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(rc.desc, prometheus.GaugeValue, float64(v), k.model, k.gone)
	}
}

// readyQuery is what /ready was asked.
type readyQuery struct {
	model     string
	free      uint64
	hasFree   bool
	device    int
	hasDevice bool
}

func parseReady(q url.Values) (*readyQuery, error) {
	var r readyQuery
	for k, vs := range q {
		if len(vs) != 1 {
			return nil, fmt.Errorf("%s given %d times", k, len(vs))
		}
		v := vs[0]
		var err error
		switch k {
		case "model":
			r.model = strings.TrimSpace(v)
			if r.model == "" {
				return nil, errors.New("model is empty")
			}
		case "free":
			r.hasFree = true
			if r.free, err = strconv.ParseUint(v, 10, 64); err != nil || r.free > vramguard.MaxBytes {
				return nil, fmt.Errorf("free=%q: want a number of bytes", v)
			}
		case "device":
			r.hasDevice = true
			if r.device, err = strconv.Atoi(v); err != nil || r.device < 0 {
				return nil, fmt.Errorf("device=%q: want a device index (0, 1, ...)", v)
			}
		default:
			return nil, fmt.Errorf("unknown parameter %q (want model, free, device)", k)
		}
	}
	return &r, nil
}

// readiness is /ready's answer.
type readiness struct {
	Ready   bool         `json:"ready"`
	Model   *modelState  `json:"model,omitempty"`
	Device  *deviceState `json:"device,omitempty"`
	Reasons []string     `json:"reasons"` // why not ready; empty when ready
}

// The states of a model.
const (
	stateResident = "resident" // /api/ps lists it
	stateLoading  = "loading"  // a runner serves its weights, /api/ps does not list it yet
	stateAbsent   = "absent"
	stateUnknown  = "unknown" // Ollama does not answer
)

type modelState struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// Verified: the state rests on the runner processes as well as on
	// /api/ps (Checked "ps+runner-processes"), and they agree.
	Verified bool `json:"verified"`
	// Checked names the checks made: "ps+runner-processes", "ps", or
	// "none" when Ollama did not answer.
	Checked string `json:"checked"`
	// NoRunnerCheck says why the runner processes were not checked.
	NoRunnerCheck string   `json:"no_runner_check,omitempty"`
	RunnerPIDs    []uint32 `json:"runner_pids,omitempty"`
	// SizeVRAM and ExpiresAt are what /api/ps lists for a resident model.
	SizeVRAM  *int64     `json:"size_vram,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

type deviceState struct {
	Index int `json:"index"`
	// Free and Total are nil when device memory was not measured.
	Free    *uint64  `json:"free,omitempty"`
	Total   *uint64  `json:"total,omitempty"`
	Need    uint64   `json:"need"`
	Enough  bool     `json:"enough"`
	Holders []holder `json:"holders"`
}

type holder struct {
	Kind  string `json:"kind"`
	Name  string `json:"name,omitempty"`
	PID   uint32 `json:"pid,omitempty"`
	Bytes uint64 `json:"bytes"`
}

// ready answers GET /ready?model=NAME&free=BYTES&device=N: 200 when every
// condition asked for holds (model resident, BYTES free on device N,
// default 0; with none, Ollama answering), 503 otherwise, 400 for a bad
// query.
func (w *watcher) ready(rw http.ResponseWriter, r *http.Request) {
	q, err := parseReady(r.URL.Query())
	if err != nil {
		writeJSON(rw, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), w.timeout)
	defer cancel()
	ans := w.readiness(ctx, q)
	code := http.StatusOK
	if !ans.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(rw, code, ans)
}

func writeJSON(rw http.ResponseWriter, code int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Cache-Control", "no-store")
	rw.WriteHeader(code)
	enc := json.NewEncoder(rw)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (w *watcher) readiness(ctx context.Context, q *readyQuery) *readiness {
	ans := &readiness{Ready: true, Reasons: []string{}}
	fail := func(format string, args ...any) {
		ans.Ready = false
		ans.Reasons = append(ans.Reasons, fmt.Sprintf(format, args...))
	}
	if q.model == "" && !q.hasFree && !q.hasDevice {
		if _, err := w.ollama.Running(ctx); err != nil {
			fail("Ollama at %s does not answer: %s", w.host, trim(err))
		}
		return ans
	}
	if q.model != "" {
		ans.Model = w.modelState(ctx, q.model, fail)
	}
	if q.hasFree || q.hasDevice {
		ans.Device = w.deviceState(ctx, q, fail)
	}
	return ans
}

// modelState is what /api/ps and the runner processes say of model.
func (w *watcher) modelState(ctx context.Context, model string, fail func(string, ...any)) *modelState {
	name := vramguard.NormalizeModelName(model)
	m := &modelState{Name: name, State: stateUnknown, Checked: "none"}
	ps, err := w.ollama.Running(ctx)
	if err != nil {
		fail("Ollama at %s does not answer: %s", w.host, trim(err))
		return m
	}
	m.Checked = vramguard.CheckPS.String()
	var listed *api.ProcessModelResponse
	for i := range ps {
		if vramguard.NormalizeModelName(ps[i].Model) == name || vramguard.NormalizeModelName(ps[i].Name) == name {
			listed = &ps[i]
			break
		}
	}
	pids, checked, why, notFound := w.runners(ctx, name)
	if checked {
		m.Checked = (vramguard.CheckPS | vramguard.CheckRunnerProcesses).String()
		m.RunnerPIDs = pids
	} else {
		m.NoRunnerCheck = why
	}
	running := len(pids) > 0
	switch {
	case listed != nil && listed.ExpiresAt.IsZero():
		m.State = stateLoading
		m.Verified = checked && running
		fail("%s is loading (/api/ps lists it with no expiry yet)", name)
	case listed != nil:
		size, at := listed.SizeVRAM, listed.ExpiresAt
		m.State, m.SizeVRAM, m.ExpiresAt = stateResident, &size, &at
		m.Verified = checked && running
		if checked && !running {
			fail("/api/ps lists %s but no live runner process serves its weights: a crashed runner stays listed until the next request reloads it", name)
		}
	case running:
		m.State, m.Verified = stateLoading, true
		fail("%s is loading: runner %s serves its weights, and Ollama lists a model only once its load has ended", name, joinPIDs(pids))
	default:
		m.State, m.Verified = stateAbsent, checked
		if notFound {
			fail("%s: model not found on the server", name)
		} else {
			fail("/api/ps does not list %s", name)
		}
	}
	return m
}

// runners returns the live runner processes of model's weights on this
// machine: checked is false when that cannot be told (why says why);
// notFound when the server does not know the model.
func (w *watcher) runners(ctx context.Context, model string) (pids []uint32, checked bool, why string, notFound bool) {
	if !isLocal(w.host) {
		return nil, false, "remote server", false
	}
	blob, err := w.ollama.ModelBlob(ctx, model)
	switch {
	case vramguard.KindOf(err) == vramguard.KindNotFound:
		return nil, false, "model not found", true
	case err != nil:
		return nil, false, "model blob: " + trim(err), false
	case blob == "":
		return nil, false, "the model has no weights file of its own", false
	}
	rs, err := procRunners(w.procRoot)
	if err != nil {
		return nil, false, trim(err), false
	}
	if !serverVisible(w.procRoot) {
		// Without the server in sight, its runners are not either: no
		// runner seen would prove nothing.
		return nil, false, "no Ollama server process visible on this machine", false
	}
	for _, r := range rs {
		if !r.Orphaned && (r.Blob == blob || (r.Model != "" && vramguard.NormalizeModelName(r.Model) == model)) {
			pids = append(pids, r.PID)
		}
	}
	return pids, true, "", false
}

// serverVisible reports whether the procfs root ("" for /proc) shows an
// `ollama serve` process. Only the command lines of processes named
// ollama* are read.
func serverVisible(root string) bool {
	if root == "" {
		root = "/proc"
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue
		}
		i, j := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if i < 0 || j < i || !strings.HasPrefix(strings.ToLower(string(stat[i+1:j])), "ollama") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if gpu.ClassifyCommand(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) == vramguard.RoleOllamaServer {
			return true
		}
	}
	return false
}

// isLocal reports whether the server at host runs on this machine: its
// host is localhost, a loopback or the unspecified address. Names are
// not resolved.
func isLocal(host string) bool {
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return false
	}
	name := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

func joinPIDs(pids []uint32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ", ")
}

// deviceState is what the GPU reader says of the device asked for.
func (w *watcher) deviceState(ctx context.Context, q *readyQuery, fail func(string, ...any)) *deviceState {
	d := &deviceState{Index: q.device, Need: q.free, Holders: []holder{}}
	if w.gpu == nil {
		fail("no GPU reader: device memory not measured")
		return d
	}
	snap, err := w.gpu.Snapshot(ctx)
	if err != nil {
		fail("GPU snapshot failed: %s", trim(err))
		return d
	}
	dev := snap.Device(q.device)
	if dev == nil {
		fail("no device %d in the GPU reader's snapshot", q.device)
		return d
	}
	_ = gpu.NameRunners(ctx, w.ollama, snap) // unnamed runners keep their blob
	free, total := dev.Free, dev.Total
	d.Free, d.Total = &free, &total
	var held []string
	for _, h := range dev.Holders() {
		if h.Kind == vramguard.HolderFree {
			continue
		}
		d.Holders = append(d.Holders, holder{Kind: string(h.Kind), Name: h.Name, PID: h.PID, Bytes: h.Bytes})
		who := string(h.Kind)
		if h.Name != "" {
			who += " " + h.Name
		}
		held = append(held, fmt.Sprintf("%s (%s)", who, human(h.Bytes, true)))
	}
	d.Enough = free >= q.free
	if !d.Enough {
		by := "nothing"
		if len(held) > 0 {
			by = strings.Join(held, ", ")
		}
		fail("device %d has %s free of %s, %s needed; held by: %s", q.device, human(free, true), human(total, true),
			human(q.free, true), by)
	}
	return d
}
