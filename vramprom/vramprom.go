// Package vramprom exports vramguard's lifecycle as Prometheus metrics: the
// calls, their tokens and first chunks, loads, reloads and why, verified
// unloads, budget admissions, waits for free memory, a pool's placements,
// and, at scrape time, which models a server has resident, which members
// of a pool answer, and who holds each device's memory.
//
// It is built only on vramguard.Hooks, so a program that imports only the
// root compiles no Prometheus code. It registers nothing itself: the
// program registers the Collector on a registry of its own choosing.
//
//	col, err := vramprom.New(vramprom.Config{VRAM: reader})
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(col)
//	client, err := vramguard.NewClient(vramguard.Options{Hooks: col.Hooks(), VRAM: reader})
//	stop := col.Watch(client)
//	defer stop()
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// # Metrics
//
// The GenAI client metrics keep the names of OpenTelemetry's GenAI
// semantic conventions in Prometheus form (they are still in development
// there), whatever Config.Namespace says:
//
//	gen_ai_client_operation_duration_seconds             histogram  operation, model, provider, server, error_type
//	gen_ai_client_token_usage                            histogram  operation, model, token_type (input, output)
//	gen_ai_client_operation_time_to_first_chunk_seconds  histogram  operation, model, provider, server
//
// operation is "text_completion" for a generation and "chat" for a chat,
// provider "ollama", error_type "" on success and the failure's
// vramguard.Kind otherwise ("timeout", "model crash", ...). Token counts
// come from the server's prompt_eval_count and eval_count; the subprocess
// fallback reports none.
//
// The lifecycle metrics carry the namespace ("vramguard" by default):
//
//	vramguard_model_loads_total               counter    model, server, reload_cause ("none" for a first load)
//	vramguard_model_load_duration_seconds     histogram  model, server (the server's load_duration)
//	vramguard_model_unloads_total             counter    model, server, cause, outcome
//	vramguard_model_unload_duration_seconds   histogram  model, server, outcome (UnloadReport.Elapsed)
//	vramguard_model_reloads_total             counter    model, server, cause
//	vramguard_budget_admissions_total         counter    model, server, outcome (admitted, refused, failed)
//	vramguard_vram_wait_duration_seconds      histogram  device, server, error_type
//	vramguard_pool_placements_total           counter    member, reason, model
//
// An unload's outcome is "verified" (the model was loaded and was seen
// gone), "already gone" (verified, but the server never listed it during
// the call: an unload of a model another unload or the budget had
// evicted is no second eviction), "leased" (a lease kept it and nothing
// was sent), "failed" (the unload returned an error) or "unverified" (it
// ended without proof or error, as for a protected model UnloadAll left). Its cause is the vramguard.UnloadCause
// ("unload", "guard", "phase end", "budget", ...); a reload's cause is the
// vramguard.ReloadCause. A placement is a pool's (package pool)
// choice of the member a call goes to, counted by Place (set
// pool.Options.OnPlace to it): member is the pool.Member's name, reason
// the pool.PlaceReason ("warm", "room", "made room").
//
// At each scrape the Collector reads, with a bound of 5 seconds each:
//
//	vramguard_model_resident          gauge  model, server  1 per model the server's /api/ps lists
//	vramguard_model_vram_bytes        gauge  model, server  its size_vram, Ollama's estimate
//	vramguard_ollama_up               gauge  server         1 when /api/ps answered, else 0
//	vramguard_pool_member_up          gauge  member         1 while the pool's member answers, else 0
//	vramguard_device_memory_bytes     gauge  device, holder, kind
//	vramguard_device_reader_up        gauge                 1 when the VRAM reader answered, else 0
//
// The first three are there for each client given to Collector.Watch, the
// fourth for each watched pool client (one series per member, as
// OllamaClient.Members reports it, which reads no server), the last two
// with Config.VRAM. vramguard_device_memory_bytes splits each
// device's memory as vramguard.DeviceMemory.Holders does: kind "runner"
// (holder: the model), "other" (holder: the process's command), and
// "unattributed" and "free" (holder ""); the series of a device add up to
// its total. Holders with the same name on one device are summed.
//
// Labels named model hold vramguard.NormalizeModelName's form
// ("tiny:latest"), and labels named server the host:port of the client's
// server (OllamaClient.Host, which for a pool client names the pool, not
// a member), so that a call's series and a residency gauge of the same
// model on the same server match.
package vramprom

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
)

// Config configures a Collector. The zero value is valid: no device
// memory gauges, the namespace "vramguard".
type Config struct {
	// VRAM, when set, is read at each scrape for
	// vramguard_device_memory_bytes.
	VRAM vramguard.VRAMReader
	// Devices limits the device memory gauges to these indexes; nil means
	// every device the reader lists.
	Devices []int
	// Namespace prefixes the lifecycle metrics' names instead of
	// "vramguard"; the gen_ai_* metrics keep theirs.
	Namespace string
}

// Bucket boundaries: seconds double from 10 ms to about 80 s (a load of a
// big model from disk), tokens grow fourfold to 64 Ki.
var (
	secondsBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBuckets   = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536}
)

// scrapeTimeout bounds each read a scrape makes (/api/ps, a VRAM snapshot).
const scrapeTimeout = 5 * time.Second

// provider is the gen_ai provider label.
const provider = "ollama"

// The outcomes of an unload and of an admission.
const (
	outcomeVerified   = "verified"
	outcomeGone       = "already gone"
	outcomeUnverified = "unverified"
	outcomeLeased     = "leased"
	outcomeFailed     = "failed"
	outcomeAdmitted   = "admitted"
	outcomeRefused    = "refused"
)

// Collector turns a vramguard client's hooks into Prometheus metrics and
// reads residency and device memory at scrape time. It implements
// prometheus.Collector; register it on a registry of your own. It is safe
// for concurrent use; one Collector may watch several clients, and its
// Hooks may be given to several clients.
type Collector struct {
	vram    vramguard.VRAMReader
	devices []int

	opDuration     *prometheus.HistogramVec
	tokenUsage     *prometheus.HistogramVec
	firstChunk     *prometheus.HistogramVec
	loads          *prometheus.CounterVec
	loadDuration   *prometheus.HistogramVec
	unloads        *prometheus.CounterVec
	unloadDuration *prometheus.HistogramVec
	reloads        *prometheus.CounterVec
	admissions     *prometheus.CounterVec
	vramWait       *prometheus.HistogramVec
	placements     *prometheus.CounterVec

	resident, vramBytes, ollamaUp, memberUp *prometheus.Desc
	deviceMemory, readerUp                  *prometheus.Desc

	watches watches
}

var _ prometheus.Collector = (*Collector)(nil)

var nameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// New returns a Collector for cfg. It fails with a vramguard.Error of
// vramguard.KindInvalidInput for a namespace that is no valid metric name
// prefix or a negative device index.
func New(cfg Config) (*Collector, error) {
	ns := cfg.Namespace
	if ns == "" {
		ns = "vramguard"
	}
	if !nameRE.MatchString(ns) || strings.HasPrefix(ns, "__") {
		return nil, invalid("namespace %q is not a metric name prefix", cfg.Namespace)
	}
	for _, d := range cfg.Devices {
		if d < 0 {
			return nil, invalid("device %d: want 0 or more", d)
		}
	}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	own := func(name string) string { return ns + "_" + name }
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: own(name), Help: help}, labels)
	}
	c := &Collector{
		vram:    cfg.VRAM,
		devices: slices.Clone(cfg.Devices),

		opDuration: hist("gen_ai_client_operation_duration_seconds",
			"Duration of GenAI operations (vramguard generations and chats, through the fallback included).",
			secondsBuckets, "operation", "model", "provider", "server", "error_type"),
		tokenUsage: hist("gen_ai_client_token_usage",
			"Tokens used by GenAI operations: the server's prompt_eval_count (input) and eval_count (output).",
			tokenBuckets, "operation", "model", "token_type"),
		firstChunk: hist("gen_ai_client_operation_time_to_first_chunk_seconds",
			"Time from the start of a GenAI operation to its first streamed chunk.",
			secondsBuckets, "operation", "model", "provider", "server"),
		loads: counter("model_loads_total",
			"Model loads caused by this program's calls, by why the model had left (reload_cause; none for a first load).",
			"model", "server", "reload_cause"),
		loadDuration: hist(own("model_load_duration_seconds"),
			"Model load time as the server reported it (load_duration), for calls that loaded their model.",
			secondsBuckets, "model", "server"),
		unloads: counter("model_unloads_total",
			"Model unloads by the call that sent them (cause) and their outcome (verified, already gone, unverified, leased, failed).",
			"model", "server", "cause", "outcome"),
		unloadDuration: hist(own("model_unload_duration_seconds"),
			"Time from an unload's first request to its verdict (UnloadReport.Elapsed); leased unloads send nothing and are left out.",
			secondsBuckets, "model", "server", "outcome"),
		reloads: counter("model_reloads_total",
			"Loads of a model this program had used within its reload window, by why the model had left.",
			"model", "server", "cause"),
		admissions: counter("budget_admissions_total",
			"Loads checked against the VRAM budget, by outcome (admitted, refused, failed).",
			"model", "server", "outcome"),
		vramWait: hist(own("vram_wait_duration_seconds"),
			"Waits for free device memory (EnsureFree, budgets making room, phase hand-overs).",
			secondsBuckets, "device", "server", "error_type"),
		placements: counter("pool_placements_total",
			"Members a pool chose for calls, by member, reason (warm, room, made room) and model.",
			"member", "reason", "model"),

		resident: prometheus.NewDesc(own("model_resident"),
			"1 for each model the watched server's /api/ps lists.", []string{"model", "server"}, nil),
		vramBytes: prometheus.NewDesc(own("model_vram_bytes"),
			"The size_vram /api/ps lists for a resident model (Ollama's estimate of its share on the GPU).", []string{"model", "server"}, nil),
		ollamaUp: prometheus.NewDesc(own("ollama_up"),
			"1 when the watched server's /api/ps answered at this scrape, else 0.", []string{"server"}, nil),
		memberUp: prometheus.NewDesc(own("pool_member_up"),
			"1 while a watched pool's member answers (the pool's own view, read at this scrape), else 0.", []string{"member"}, nil),
		deviceMemory: prometheus.NewDesc(own("device_memory_bytes"),
			"Device memory by holder, as the driver reports it: kind runner (holder: model), other (holder: command), unattributed, free; a device's series add up to its total.",
			[]string{"device", "holder", "kind"}, nil),
		readerUp: prometheus.NewDesc(own("device_reader_up"),
			"1 when the VRAM reader answered at this scrape, else 0.", nil, nil),
	}
	return c, nil
}

func invalid(format string, args ...any) error {
	return &vramguard.Error{Op: "new collector", Kind: vramguard.KindInvalidInput, Err: fmt.Errorf(format, args...)}
}

func (c *Collector) vecs() []prometheus.Collector {
	return []prometheus.Collector{c.opDuration, c.tokenUsage, c.firstChunk, c.loads, c.loadDuration,
		c.unloads, c.unloadDuration, c.reloads, c.admissions, c.vramWait, c.placements}
}

// Describe sends the descriptors of every metric the Collector can
// export.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
	ch <- c.resident
	ch <- c.vramBytes
	ch <- c.ollamaUp
	ch <- c.memberUp
	if c.vram != nil {
		ch <- c.deviceMemory
		ch <- c.readerUp
	}
}

// Collect sends the hooks' metrics, then reads each watched server's
// /api/ps and the VRAM reader, side by side, each bounded by 5 seconds.
// A read that fails sets its _up gauge to 0 and sends no series for it.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.vecs() {
		v.Collect(ch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range c.watches.list() {
		wg.Go(func() { c.collectServer(ctx, ch, w) })
	}
	if c.vram != nil {
		wg.Go(func() { c.collectDevices(ctx, ch) })
	}
	wg.Wait()
}

func (c *Collector) collectServer(ctx context.Context, ch chan<- prometheus.Metric, w *watch) {
	var members []pool.MemberStatus
	if w.pool != nil {
		members = w.pool.Members()
	}
	for _, m := range members {
		up := 0.0
		if m.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.memberUp, prometheus.GaugeValue, up, m.Name)
	}
	ps, err := w.client.Running(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.ollamaUp, prometheus.GaugeValue, 0, w.server)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.ollamaUp, prometheus.GaugeValue, 1, w.server)
	seen := make(map[string]bool, len(ps))
	for _, m := range ps {
		name := m.Model
		if name == "" {
			name = m.Name
		}
		name = vramguard.NormalizeModelName(name)
		if seen[name] {
			continue
		}
		seen[name] = true
		ch <- prometheus.MustNewConstMetric(c.resident, prometheus.GaugeValue, 1, name, w.server)
		ch <- prometheus.MustNewConstMetric(c.vramBytes, prometheus.GaugeValue, float64(max(m.SizeVRAM, 0)), name, w.server)
	}
}

func (c *Collector) collectDevices(ctx context.Context, ch chan<- prometheus.Metric) {
	snap, err := c.vram.Snapshot(ctx)
	if err != nil || snap == nil {
		ch <- prometheus.MustNewConstMetric(c.readerUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.readerUp, prometheus.GaugeValue, 1)
	type key struct {
		device       int
		holder, kind string
	}
	sums := make(map[key]uint64)
	var order []key
	for _, d := range snap.Devices {
		if c.devices != nil && !slices.Contains(c.devices, d.Index) {
			continue
		}
		for _, h := range d.Holders() {
			k := key{d.Index, h.Name, string(h.Kind)}
			if _, ok := sums[k]; !ok {
				order = append(order, k)
			}
			sums[k] += h.Bytes
		}
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(c.deviceMemory, prometheus.GaugeValue, float64(sums[k]), strconv.Itoa(k.device), k.holder, k.kind)
	}
}

// Watch makes each scrape read cl's /api/ps (through cl.Running, whose
// listing cl's other callers share) for vramguard_model_resident,
// vramguard_model_vram_bytes and vramguard_ollama_up, labelled with
// server: the host:port of cl.Host(), as the call metrics of cl's hooks
// have it ("" for a client made with Options.API and no Options.Host).
// The series stop
// when stop is called (it may be called more than once); once cl is
// closed its listing fails and up is 0. A nil cl watches nothing. While
// two watched clients have the same server (every pool client names the
// same pool address, pool.Host), the scrape reads only the first watched.
// Watch is safe for concurrent use.
func (c *Collector) Watch(cl *vramguard.OllamaClient) (stop func()) {
	if cl == nil {
		return func() {}
	}
	return c.watch(&watch{client: cl, server: serverLabel(cl.Host())})
}

// WatchPool is Watch of the pool's client, and the scrape also reports
// vramguard_pool_member_up per member, from p.Members (which reads no
// server). A nil p watches nothing.
func (c *Collector) WatchPool(p *pool.Pool) (stop func()) {
	if p == nil {
		return func() {}
	}
	return c.watch(&watch{client: p.OllamaClient, pool: p, server: serverLabel(p.Host())})
}

func (c *Collector) watch(w *watch) (stop func()) {
	c.watches.add(w)
	var once sync.Once
	return func() { once.Do(func() { c.watches.remove(w) }) }
}

// watches are the clients a Collector reads at scrape time, in the order
// they were watched.
type watches struct {
	mu  sync.Mutex
	all []*watch
}

type watch struct {
	client *vramguard.OllamaClient
	pool   *pool.Pool // WatchPool's; nil for Watch
	server string
}

func (ws *watches) add(w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.all = append(ws.all, w)
}

func (ws *watches) remove(w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.all = slices.DeleteFunc(ws.all, func(x *watch) bool { return x == w })
}

// list returns the watches to read, one per server.
func (ws *watches) list() []*watch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []*watch
	for _, w := range ws.all {
		if !slices.ContainsFunc(out, func(x *watch) bool { return x.server == w.server }) {
			out = append(out, w)
		}
	}
	return out
}

// serverLabel is the host:port of a server named as Options.Host names it
// (port 11434 when none is given, 443 for an explicit https URL without
// one); s itself when it does not parse.
func serverLabel(s string) string {
	raw := strings.TrimSpace(s)
	if raw == "" {
		return ""
	}
	https := strings.HasPrefix(strings.ToLower(raw), "https://")
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return s
	}
	if u.Port() != "" {
		return u.Host
	}
	port := "11434"
	if https {
		port = "443"
	}
	if strings.Contains(u.Hostname(), ":") {
		return "[" + u.Hostname() + "]:" + port
	}
	return u.Hostname() + ":" + port
}

// Hooks returns the hooks that feed the Collector: put them in
// vramguard.Options.Hooks, or join them with others through
// vramguard.JoinHooks. They only count and observe; they never block.
func (c *Collector) Hooks() vramguard.Hooks {
	return vramguard.Hooks{
		OnCallEnd:   c.callEnd,
		OnUnloadEnd: c.unloadEnd,
		OnAdmission: c.admission,
		OnVRAMWait:  c.vramWaited,
	}
}

// operation is the GenAI operation name of a vramguard call.
func operation(op string) string {
	switch op {
	case "generate":
		return "text_completion"
	case "chat":
		return "chat"
	}
	return op
}

// errorType is the error_type label: "" for nil, else the failure's Kind.
func errorType(err error) string {
	if err == nil {
		return ""
	}
	return vramguard.KindOf(err).String()
}

func (c *Collector) callEnd(_ context.Context, e vramguard.CallEnd) {
	op, model, server := operation(e.Op), vramguard.NormalizeModelName(e.Model), serverLabel(e.Server)
	c.opDuration.WithLabelValues(op, model, provider, server, errorType(e.Err)).Observe(e.Elapsed.Seconds())
	g := e.Generation
	if e.Err != nil || g == nil {
		return
	}
	if !g.Fallback {
		c.tokenUsage.WithLabelValues(op, model, "input").Observe(float64(g.Metrics.PromptEvalCount))
		c.tokenUsage.WithLabelValues(op, model, "output").Observe(float64(g.Metrics.EvalCount))
	}
	if g.Chunks > 0 {
		c.firstChunk.WithLabelValues(op, model, provider, server).Observe(g.FirstChunk.Seconds())
	}
	if g.Loaded {
		cause := "none"
		if g.Reload != nil {
			cause = string(g.Reload.Cause)
		}
		c.loads.WithLabelValues(model, server, cause).Inc()
		c.loadDuration.WithLabelValues(model, server).Observe(g.Metrics.LoadDuration.Seconds())
	}
	if r := g.Reload; r != nil {
		c.reloads.WithLabelValues(vramguard.NormalizeModelName(r.Model), serverLabel(r.Server), string(r.Cause)).Inc()
	}
}

// unloadOutcome is an unload's outcome label.
func unloadOutcome(e vramguard.UnloadEnd) string {
	switch r := e.Report; {
	case r.Verified && !r.WasLoaded:
		return outcomeGone
	case r.Verified:
		return outcomeVerified
	case len(r.Leased) > 0:
		return outcomeLeased
	case e.Err != nil:
		return outcomeFailed
	}
	return outcomeUnverified
}

func (c *Collector) unloadEnd(_ context.Context, e vramguard.UnloadEnd) {
	model, server := vramguard.NormalizeModelName(e.Model), serverLabel(e.Server)
	out := unloadOutcome(e)
	c.unloads.WithLabelValues(model, server, string(e.Cause), out).Inc()
	if out != outcomeLeased {
		c.unloadDuration.WithLabelValues(model, server, out).Observe(e.Report.Elapsed.Seconds())
	}
}

func (c *Collector) admission(_ context.Context, e vramguard.AdmissionEvent) {
	out := outcomeAdmitted
	switch {
	case errors.Is(e.Err, vramguard.ErrOverBudget):
		out = outcomeRefused
	case e.Err != nil:
		out = outcomeFailed
	}
	c.admissions.WithLabelValues(vramguard.NormalizeModelName(e.Model), serverLabel(e.Server), out).Inc()
}

func (c *Collector) vramWaited(_ context.Context, e vramguard.VRAMWaitEvent) {
	c.vramWait.WithLabelValues(strconv.Itoa(e.Device), serverLabel(e.Server), errorType(e.Err)).Observe(e.Waited.Seconds())
}

// Place counts a pool's placement (vramguard_pool_placements_total): set
// pool.Options.OnPlace to it.
func (c *Collector) Place(_ context.Context, p pool.Placement) {
	c.placements.WithLabelValues(p.Member, string(p.Reason), vramguard.NormalizeModelName(p.Model)).Inc()
}
