package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/probe"
)

// startTimeout bounds the first look at Ollama: a gate in front of a
// server that does not answer refuses to start.
const startTimeout = 5 * time.Second

// gate is the proxy and what it keeps between requests.
type gate struct {
	cfg      *config
	log      *slog.Logger
	upstream *url.URL
	client   *vramguard.OllamaClient // the gate's own client of Ollama
	// holder holds, while a reservation's make_room runs, the models
	// requests through the gate are using (holdInUse): holds for someone
	// else, which every client keeps, its own included.
	holder *vramguard.OllamaClient
	// holderOpts are the options of the client each HTTP reservation is
	// held by (reserveTable.take): one client for each, so that the client
	// the admissions run on counts it as another holder's (a client may
	// use its own reservations, and the chat loads the gate admits must
	// not), and so does every other HTTP client's (two HTTP clients'
	// reservations never share bytes).
	holderOpts vramguard.Options
	// tenants are what each reservation's client asks to give memory
	// back in its make_room, as the admissions' client does (ComfyUI).
	tenants  []vramguard.Tenant
	reader   vramguard.VRAMReader // nil without a GPU reader
	probe    *probe.Handler
	proxy    *httputil.ReverseProxy
	metrics  *gateMetrics
	leases   *leaseTable
	reserved *reserveTable
	guard    *guard
	closers  []func() error // run in reverse at close

	// busy counts the requests through the gate running on each model
	// (normalized), from their admission to their answer's end: what a
	// reservation's make_room keeps (holdInUse).
	busyMu sync.Mutex
	busy   map[string]int

	mu     sync.Mutex
	loaded map[string]string     // models that loaded through the gate -> the client that loaded them
	gone   map[string]goneRecord // the gate's last verified unload of each model
	seen   map[string]bool       // models the gate saw resident
}

// goneRecord is a verified unload through the gate: a later load of the
// model is a reload with that cause.
type goneRecord struct {
	at     time.Time
	client string // who asked for it ("" when the gate made room)
	why    string
}

// newGate builds the gate for the address it listens on (addr, the
// listener's: -listen 127.0.0.1:0 names a port only then).
func newGate(ctx context.Context, cfg *config, addr string, log *slog.Logger, newReader func(context.Context) (vramguard.VRAMReader, error)) (g *gate, err error) {
	up, err := parseUpstream(cfg.ollama)
	if err != nil {
		return nil, err
	}
	gd, err := newGuard(addr, cfg.origins, cfg.token)
	if err != nil {
		return nil, err
	}
	g = &gate{guard: gd, cfg: cfg, log: log, upstream: up, loaded: map[string]string{}, gone: map[string]goneRecord{}, seen: map[string]bool{}, busy: map[string]int{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, g.close())
		}
	}()
	if cfg.gpu {
		switch {
		case newReader != nil:
			g.reader, err = newReader(ctx)
			if err != nil {
				return g, err
			}
		default:
			r, rerr := gpu.NewAutoReader(ctx, gpu.ReaderOptions{})
			if rerr != nil {
				log.Info("no GPU reader: loads are admitted without measuring memory", "err", rerr)
			} else {
				g.reader = r
				g.closers = append(g.closers, r.Close)
			}
		}
	}
	var cu *comfyui.Client
	if cfg.comfyui != "" {
		cu, err = comfyui.New(comfyui.Options{URL: cfg.comfyui, VRAM: g.reader, Device: cfg.device, Logger: log})
		if err != nil {
			return g, err
		}
		g.closers = append(g.closers, func() error { cu.Close(); return nil })
		if g.reader != nil {
			g.reader = cu.Reader(g.reader)
		}
	}
	var protected []string
	for _, m := range strings.Split(cfg.protected, ",") {
		if m = strings.TrimSpace(m); m != "" {
			protected = append(protected, m)
		}
	}
	opts := vramguard.Options{
		Host:              up.String(),
		VRAM:              g.reader,
		UnloadTimeout:     cfg.unloadWait,
		Protected:         protected,
		KeepModelsOnClose: true, // the gate generates nothing; stop() unloads what loaded through it
		Leases: vramguard.LeaseOptions{
			Dir: cfg.leaseDir,
			// A vramguard program pointed at the gate names the gate's
			// address in its leases: they keep the same models.
			Honour: []string{addr},
		},
		// No vramprom hooks: the gate's unloads are counted by its own
		// series, with the client that asked (vramgate_unloads_total).
		Logger: log,
	}
	// The admissions run on the gate's client: its budget is the gate's
	// rules (OllamaClient.Admit); the holder's client admits nothing.
	admitOpts := opts
	admitOpts.Budget = cfg.budget(g.reader)
	if cfg.admitWait > 0 {
		admitOpts.Timeouts.FirstChunk = cfg.admitWait // bounds each admission, its waits for leases included
	}
	g.client, err = vramguard.NewClient(admitOpts)
	if err != nil {
		return g, err
	}
	g.closers = append(g.closers, g.client.Close)
	g.holderOpts = opts
	if g.holder, err = vramguard.NewClient(opts); err != nil {
		return g, err
	}
	g.closers = append(g.closers, g.holder.Close)
	if err := g.checkLeaseDir(ctx); err != nil {
		return g, err
	}
	if cu != nil && g.reader != nil {
		// The admissions' client (-make-room) and each reservation's (its
		// make_room) ask ComfyUI.
		g.tenants = append(g.tenants, cu.Tenant(comfyui.TenantOptions{WhileBusy: comfyui.Refuse}))
		unregister, err := g.client.RegisterTenant(g.tenants[0])
		if err != nil {
			return g, err
		}
		g.closers = append(g.closers, func() error { unregister(); return nil })
	}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if _, err := g.client.Running(sctx); err != nil {
		return g, &vramguard.Error{Op: "start", Kind: vramguard.KindUnavailable,
			Err: fmt.Errorf("the Ollama server at %s does not answer (start it first, or give -ollama): %w", up, err)}
	}
	g.metrics = newGateMetrics()
	g.probe, err = probe.New(probe.Config{Client: g.client, VRAM: g.reader, Collectors: g.metrics.collectors()})
	if err != nil {
		return g, err
	}
	g.closers = append(g.closers, func() error { g.probe.Close(); return nil })
	g.leases = newLeaseTable(g)
	g.reserved = newReserveTable(g)
	// What Ollama's own guards need (guard.go): the client's Host when
	// both listen on loopback, else the upstream's and no same-origin
	// Origin.
	keepHost := gd.loopback && isLoopbackName(up.Hostname())
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.Out.Header.Del(clientHeader)
			if keepHost {
				pr.Out.Host = pr.In.Host
			} else if o := pr.In.Header.Get("Origin"); o != "" && sameOrigin(o, pr.In.Host) {
				pr.Out.Header.Del("Origin")
			}
		},
		FlushInterval:  -1, // every write reaches the client as it arrives
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.proxyError,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return g, nil
}

// leaseCheckModel names the lease the gate takes and releases at start to
// learn whether the host-wide lease directory can be used (the library's
// own rules decide: owner, mode, a usable lock).
const leaseCheckModel = "vramgate-start-check"

// checkLeaseDir takes and releases one lease at start. An explicit
// -lease-dir that cannot be used stops the start with the library's
// reason (STYLE 26: explicit configuration that cannot be honoured stops
// the start); the default directory degrades, with a WARN line that says
// what stops working.
func (g *gate) checkLeaseDir(ctx context.Context) error {
	l, err := g.client.HoldModel(ctx, leaseCheckModel, 0)
	if err == nil {
		return l.Release()
	}
	reason := err
	var ve *vramguard.Error
	if errors.As(err, &ve) && ve.Err != nil {
		reason = ve.Err // without the check lease's own name
	}
	if g.cfg.leaseDir != "" {
		return &vramguard.Error{Op: "start", Kind: vramguard.KindUnavailable,
			Err: fmt.Errorf("-lease-dir %s cannot be used: %v (give a directory of this user with mode 0700, or leave -lease-dir out for vramguard's default)", g.cfg.leaseDir, reason)}
	}
	g.log.Warn("host-wide leases off: the default lease directory cannot be used; HTTP leases (POST /vramgate/leases) fail, and other vramguard programs' leases are not honoured", "reason", reason.Error())
	return nil
}

// parseUpstream reads -ollama: a URL, or host:port as OLLAMA_HOST is.
func parseUpstream(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, usage("-ollama %q: want http://host:port or host:port", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}

func (g *gate) close() error {
	var errs []error
	for i := len(g.closers) - 1; i >= 0; i-- {
		errs = append(errs, g.closers[i]())
	}
	g.closers = nil
	return errors.Join(errs...)
}

// handler is every route the gate answers.
func (g *gate) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/generate", g.generate(false))
	mux.HandleFunc("POST /api/chat", g.generate(true))
	for _, p := range []string{"/api/embed", "/api/embeddings", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		mux.HandleFunc("POST "+p, g.admitted)
	}
	mux.HandleFunc("POST /api/unload", g.unloadRoute)
	mux.HandleFunc("GET /vramgate/can-load", g.canLoad)
	mux.HandleFunc("GET /vramgate/leases", g.leases.list)
	mux.HandleFunc("POST /vramgate/leases", g.leases.take)
	mux.HandleFunc("POST /vramgate/leases/{id}", g.leases.extend)
	mux.HandleFunc("DELETE /vramgate/leases/{id}", g.leases.release)
	mux.HandleFunc("GET /vramgate/reservations", g.reserved.list)
	mux.HandleFunc("POST /vramgate/reservations", g.reserved.take)
	mux.HandleFunc("POST /vramgate/reservations/{id}", g.reserved.extend)
	mux.HandleFunc("DELETE /vramgate/reservations/{id}", g.reserved.release)
	mux.Handle("GET /metrics", g.probe)
	mux.Handle("GET /ready", g.probe)
	mux.HandleFunc("/", g.passThrough)
	return g.metrics.count(g.guard.wrap(mux))
}

// serve answers on ln until ctx is done, then stops cleanly.
func (g *gate) serve(ctx context.Context, c *cmd, ln net.Listener) (err error) {
	defer func() { err = errors.Join(err, g.close()) }()
	srv := &http.Server{
		Handler:           g.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	fmt.Fprintln(c.stderr, startLine(ln.Addr().String(), g.upstream.String()))
	if c.ready != nil {
		c.ready(ln.Addr().String())
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return &vramguard.Error{Op: "serve", Kind: vramguard.KindUnavailable, Err: err}
	case <-ctx.Done():
	}
	fmt.Fprintf(c.stderr, "vramgate: stopping: no new requests; those in flight have %v to end\n", g.cfg.stopWait)
	return g.stop(ctx, srv, done)
}

// startLine is the line the gate prints once it listens.
func startLine(addr, upstream string) string {
	return fmt.Sprintf("vramgate: http://%s -> %s (GET /metrics, /ready; leases at /vramgate/leases)", addr, upstream)
}

// stop ends the gate: no new requests, those in flight get -stop-timeout,
// the HTTP leases are released and the models that loaded through the
// gate unloaded, verified (unless -keep-on-exit). Every failure is
// returned.
func (g *gate) stop(ctx context.Context, srv *http.Server, done <-chan error) error {
	var errs []error
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.stopWait)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close() // cuts the streams that did not end in time
		errs = append(errs, &vramguard.Error{Op: "shutdown", Kind: vramguard.KindTimeout,
			Err: fmt.Errorf("requests still in flight after %v were cut: %w", g.cfg.stopWait, err)})
	}
	<-done // http.ErrServerClosed
	errs = append(errs, g.leases.releaseAll(), g.reserved.releaseAll())
	if !g.cfg.keepOnExit {
		errs = append(errs, g.unloadLoaded(context.WithoutCancel(ctx)))
	}
	return errors.Join(errs...)
}

// unloadLoaded unloads, verified, the models that loaded through the
// gate and are still resident; a model another program's lease keeps is
// left and said so on the log.
func (g *gate) unloadLoaded(ctx context.Context) error {
	g.mu.Lock()
	models := make([]string, 0, len(g.loaded))
	for m := range g.loaded {
		models = append(models, m)
	}
	g.mu.Unlock()
	var errs []error
	for _, m := range models {
		uctx, cancel := context.WithTimeout(ctx, g.cfg.unloadWait)
		rep, err := g.client.UnloadModel(uctx, m)
		cancel()
		switch {
		case errors.Is(err, vramguard.ErrLeased):
			g.log.Info("kept resident at stop: leased", "model", m, "err", err)
		case err != nil:
			errs = append(errs, fmt.Errorf("unload %s at stop: %w", m, err))
		default:
			g.log.Info("unloaded at stop", "model", m, "verified", rep.Verified, "checked", rep.Checked.String())
		}
	}
	return errors.Join(errs...)
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers as Ollama does: {"error": msg}.
func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, map[string]string{"error": "vramgate: " + fmt.Sprintf(format, args...)})
}

// readBody reads a request body the gate must look into, bounded by
// -max-body; false means the answer (413 or 400) was written.
func (g *gate) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "request body over %d bytes (vramgate -max-body)", g.cfg.maxBody)
		} else {
			writeError(w, http.StatusBadRequest, "reading the request body: %v", err)
		}
		return nil, false
	}
	return b, true
}

// proxyError answers a request Ollama did not answer: 502, as Ollama's
// own errors are shaped.
func (g *gate) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if st := stateOf(r.Context()); st != nil {
		st.unlock()
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away; nothing to answer
	}
	g.log.Warn("Ollama did not answer", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusBadGateway, "Ollama at %s did not answer: %v", g.upstream, err)
}

// passThrough forwards a request as it is, its body streamed (an upload
// to /api/blobs may be gigabytes), full duplex: Ollama may answer before
// the gate has forwarded the body's end (it reads what it needs, or
// answers an error at once). Half duplex, Go's server would close the
// request body as the answer's header goes out; the proxy's last read of
// the body then fails and cuts Ollama's answer short (a 200 /api/show
// with a truncated body, seen on v0.34.4). The routes the gate reads
// (forward) send a body already read whole.
func (g *gate) passThrough(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 {
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			g.log.Debug("half duplex: Ollama's answer may be cut if it comes before the body's end", "path", r.URL.Path, "err", err)
		}
	}
	g.proxy.ServeHTTP(w, r)
}

// markBusy counts a request through the gate on model (normalized) until
// the returned func is called.
func (g *gate) markBusy(model string) (done func()) {
	g.busyMu.Lock()
	g.busy[model]++
	g.busyMu.Unlock()
	return func() {
		g.busyMu.Lock()
		if g.busy[model]--; g.busy[model] <= 0 {
			delete(g.busy, model)
		}
		g.busyMu.Unlock()
	}
}

// busyModels are the models requests through the gate are running on.
func (g *gate) busyModels() []string {
	g.busyMu.Lock()
	defer g.busyMu.Unlock()
	ms := make([]string, 0, len(g.busy))
	for m := range g.busy {
		ms = append(ms, m)
	}
	slices.Sort(ms)
	return ms
}
