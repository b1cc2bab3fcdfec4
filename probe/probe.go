// Package probe serves what a watcher of one Ollama server and its GPU is
// asked over HTTP: GET /metrics (Prometheus) and GET /ready (readiness of
// the server, a model, free memory). It is the code of vramwatch -listen,
// shared by every program that serves those two endpoints, so that they
// answer alike.
//
//	h, err := probe.New(probe.Config{Client: client, VRAM: reader})
//	defer h.Close()
//	http.ListenAndServe(":9464", h)
//
// # /metrics
//
// The registry holds a vramprom.Collector (Handler.Metrics) that watches
// Config.Client and reads Config.VRAM, whose runners it names after their
// models; the collectors of Config.Collectors; and, read from procfs at each
// scrape, the runner processes of this machine:
//
//	vramwatch_runner_processes  gauge  model, server_gone
//
// It keeps vramwatch's name, which dashboards use: one series per model a
// runner serves ("" when not known) and whether the ollama serve that
// started it is gone (server_gone "true": an orphan, which holds memory
// until killed). It needs no GPU reader.
//
// # /ready
//
// GET /ready?model=NAME&free=BYTES&device=N answers 200 when every
// condition asked for holds and 503 otherwise, with a JSON [Readiness]
// whose reasons say why; a bad query is a 400 with {"error": "..."}. With
// no parameter it asks whether Ollama answers. A model is ready when
// /api/ps lists it with an expiry and, for a server on this machine
// (localhost, a loopback or the unspecified address) whose ollama serve
// procfs shows listening at the client's port, a live runner process of
// that server serves its weights: a crashed runner stays listed until the
// next request reloads it. Only the runners of the server at the client's
// address count: another ollama serve on this machine (another port,
// another user's, a container's) neither makes the check nor lends its
// runners of the same weights; when no ollama serve procfs shows listens
// there, the answer checks /api/ps alone and its no_runner_check says why.
// A model whose runner runs while /api/ps does not list it yet is loading
// (from Ollama v0.17 on /api/ps lists a model only once it is loaded;
// v0.6.5 lists it from the start of its load, so there it reads resident).
// free asks for BYTES free on device N (default 0), as Config.VRAM reads
// it; the answer names what holds the rest.
package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/vramprom"
)

// defaultTimeout bounds a request's reads when Config.Timeout is zero.
const defaultTimeout = 5 * time.Second

// Config configures a Handler. Client is required; the zero value of every
// other field means its default.
type Config struct {
	// Client is the vramguard client of the server watched (required).
	// The Handler does not close it.
	Client *vramguard.OllamaClient
	// VRAM reads the GPU; nil: no device gauges, and /ready?free= says
	// memory not measured.
	VRAM vramguard.VRAMReader
	// ProcRoot is the procfs root the runner processes are read from; ""
	// means /proc.
	ProcRoot string
	// Timeout bounds each request's reads of the server and the GPU (a
	// /ready, and the naming of the runner processes at a scrape; the
	// vramprom collector keeps its own bound); zero means 5 s.
	Timeout time.Duration
	// Collectors are registered on the /metrics registry beside the
	// built-in ones (a program's own series).
	Collectors []prometheus.Collector
}

// Handler answers GET /metrics and GET /ready; other paths are 404, other
// methods 405 (HEAD is served as GET). Make it with New and end it with
// Close. It is safe for concurrent use.
type Handler struct {
	client   *vramguard.OllamaClient
	vram     vramguard.VRAMReader
	procRoot string
	timeout  time.Duration
	metrics  *vramprom.Collector
	mux      *http.ServeMux
	stop     func()
	once     sync.Once
}

var _ http.Handler = (*Handler)(nil)

// New returns the Handler of cfg, its collector watching cfg.Client. It
// fails with a *vramguard.Error of vramguard.KindInvalidInput when
// cfg.Client is nil, cfg.Timeout is negative, or a collector of
// cfg.Collectors is nil or cannot be registered (a duplicate series).
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Client == nil:
		return nil, invalid(errors.New("no client"))
	case cfg.Timeout < 0:
		return nil, invalid(fmt.Errorf("timeout %v: want 0 (5s) or more", cfg.Timeout))
	}
	h := &Handler{client: cfg.Client, vram: cfg.VRAM, procRoot: cfg.ProcRoot, timeout: cfg.Timeout}
	if h.timeout == 0 {
		h.timeout = defaultTimeout
	}
	pcfg := vramprom.Config{}
	if cfg.VRAM != nil {
		pcfg.VRAM = namingReader{r: cfg.VRAM, models: cfg.Client}
	}
	col, err := vramprom.New(pcfg)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col, newRunnerCollector(h)) // a fresh registry: no clash
	for i, c := range cfg.Collectors {
		if c == nil {
			return nil, invalid(fmt.Errorf("collector %d is nil", i))
		}
		if err := reg.Register(c); err != nil {
			return nil, invalid(fmt.Errorf("collector %d: %w", i, err))
		}
	}
	h.metrics = col
	h.stop = col.Watch(cfg.Client)
	h.mux = http.NewServeMux()
	h.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	h.mux.HandleFunc("GET /ready", h.serveReady)
	return h, nil
}

func invalid(err error) error {
	return &vramguard.Error{Op: "new probe", Kind: vramguard.KindInvalidInput, Err: err}
}

// ServeHTTP answers GET /metrics and GET /ready.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Metrics returns the collector New registered, which watches
// Config.Client: a program passes Metrics().Hooks() to its other clients
// so that their calls are counted on the same /metrics.
func (h *Handler) Metrics() *vramprom.Collector { return h.metrics }

// Close stops the collector's watch of Config.Client: /metrics no longer
// has that server's gauges, /ready still answers. It closes nothing else,
// and a second call does nothing.
func (h *Handler) Close() { h.once.Do(h.stop) }

// serveReady answers GET /ready: 200 ready, 503 not, 400 for a bad query.
func (h *Handler) serveReady(w http.ResponseWriter, r *http.Request) {
	q, err := ParseQuery(r.URL.Query())
	if err != nil {
		var e *vramguard.Error
		if errors.As(err, &e) && e.Err != nil {
			err = e.Err // the message alone
		}
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	ans := h.Ready(r.Context(), q)
	code := http.StatusOK
	if !ans.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, ans)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
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
