package main

import (
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// clientHeader names the client a request comes from, for the gate's
// series and logs: a client that says who it is gets its own label.
const clientHeader = "X-Vramgate-Client"

// maxClients bounds the client label's values: later names count as
// "other", so that no client can grow the gate's series without bound.
const maxClients = 64

// gateMetrics are the gate's own series, beside vramprom's and the runner
// processes (package probe).
type gateMetrics struct {
	requests *prometheus.CounterVec
	refusals *prometheus.CounterVec
	loads    *prometheus.CounterVec
	unloads  *prometheus.CounterVec
	leases   prometheus.Gauge

	mu      sync.Mutex
	clients map[string]bool
}

func newGateMetrics() *gateMetrics {
	return &gateMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vramgate_requests_total",
			Help: "Requests through the gate, by client (X-Vramgate-Client), route and HTTP status."}, []string{"client", "route", "code"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vramgate_load_refusals_total",
			Help: "Loads the gate refused (503), by client, model and reason (leased, no slot, no room, failed)."}, []string{"client", "model", "reason"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vramgate_loads_total",
			Help: "Loads through the gate, by the client that caused them, the model, and why the model had left (first, gate unload, gate made room, left otherwise)."}, []string{"client", "model", "cause"}),
		unloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vramgate_unloads_total",
			Help: "Unloads through the gate, by client, model and outcome (verified, already gone, leased, unverified, failed)."}, []string{"client", "model", "outcome"}),
		leases: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vramgate_http_leases",
			Help: "Leases HTTP clients hold through the gate."}),
		clients: map[string]bool{},
	}
}

func (m *gateMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.refusals, m.loads, m.unloads, m.leases}
}

// clientOf is the request's client label: its X-Vramgate-Client, cut to
// what a label should hold, or "unnamed".
func clientOf(r *http.Request) string {
	return orUnnamed(cleanClient(r.Header.Get(clientHeader)))
}

func orUnnamed(s string) string {
	if s == "" {
		return "unnamed"
	}
	return s
}

func cleanClient(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 64 {
		s = s[:64]
	}
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || r == '/' || r == ':' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return -1
	}, s)
}

// label bounds the client label's values.
func (m *gateMetrics) label(client string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.clients[client] {
		return client
	}
	if len(m.clients) >= maxClients {
		return "other"
	}
	m.clients[client] = true
	return client
}

// routes are the route label's values; any other path counts as "other".
var routes = map[string]bool{
	"/": true, "/api/generate": true, "/api/chat": true, "/api/embed": true, "/api/embeddings": true,
	"/api/tags": true, "/api/show": true, "/api/ps": true, "/api/pull": true, "/api/push": true,
	"/api/create": true, "/api/copy": true, "/api/delete": true, "/api/version": true, "/api/unload": true,
	"/v1/chat/completions": true, "/v1/completions": true, "/v1/embeddings": true, "/v1/models": true,
	"/metrics": true, "/ready": true, "/vramgate/can-load": true, "/vramgate/leases": true,
}

func routeOf(path string) string {
	switch {
	case routes[path]:
		return path
	case strings.HasPrefix(path, "/api/blobs/"):
		return "/api/blobs/"
	case strings.HasPrefix(path, "/vramgate/leases/"):
		return "/vramgate/leases/"
	case strings.HasPrefix(path, "/v1/models/"):
		return "/v1/models/"
	}
	return "other"
}

// count wraps the gate's handler: each request counted once it ends.
func (m *gateMetrics) count(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		m.requests.WithLabelValues(m.label(clientOf(r)), routeOf(r.URL.Path), strconv.Itoa(code)).Inc()
	})
}

// statusWriter remembers the status; Unwrap lets http.ResponseController
// (the reverse proxy's flushes) reach the connection.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
