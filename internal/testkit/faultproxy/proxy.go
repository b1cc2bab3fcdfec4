package faultproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// maxRequestBody bounds the request bodies the proxy buffers.
const maxRequestBody = 64 << 20

// ErrClosed is returned by methods called after Close.
var ErrClosed = errors.New("faultproxy: closed")

// Options configures a Proxy. The zero value passes everything through.
type Options struct {
	// Rule decides the fault of a request that no queued fault claims; nil
	// passes it through. It is called on the request's goroutine and must be
	// safe for concurrent use.
	Rule func(*Request) Fault
}

// Stats counts what the proxy did. Open counts are of this moment; the
// others are totals since New.
type Stats struct {
	Requests     int          // requests received
	Unloads      int          // of them, unload requests (Request.IsUnload)
	Faults       map[Kind]int // faults applied, by kind (KindPass not counted)
	Accepted     int          // client connections accepted
	Open         int          // client connections open now
	UpstreamOpen int          // connections to the upstream server open now
	Dialed       int          // connections dialed to the upstream server
	ClientGone   int          // replies cut short because the client went away
	Handlers     int          // requests being handled now
	// Fired is when the proxy last acted out a fault on a reply: sent a
	// canned response, reset a connection, began a stall, injected data or
	// dropped a done line (zero if never). Tests bound the client's
	// reaction from here, not from the request's start, which on a real
	// server includes its load and generation time.
	Fired time.Time
}

// Proxy is a fault-injecting HTTP proxy in front of one upstream server.
// It is safe for concurrent use; Close it when done.
type Proxy struct {
	upstream *url.URL
	tr       *http.Transport
	addr     string // host:port it listens on, kept across GoAway/Resume

	mu       sync.Mutex
	closed   bool
	srv      *http.Server   // nil while gone away
	serving  sync.WaitGroup // Serve goroutines
	handlers sync.WaitGroup // requests being handled; Add only under mu while !closed
	conns    map[net.Conn]struct{}
	queues   map[string][]Fault // by path; "" is any path
	rule     func(*Request) Fault
	seq      int64
	stats    Stats
	changed  chan struct{} // closed and replaced on every change of stats
	stop     chan struct{} // closed by Close and GoAway: wakes stalled handlers
}

// New starts a proxy for upstream on a free port of 127.0.0.1.
func New(upstream *url.URL, opts Options) (*Proxy, error) {
	if upstream == nil || upstream.Host == "" {
		return nil, errors.New("faultproxy: upstream has no host")
	}
	p := &Proxy{
		upstream: upstream,
		conns:    make(map[net.Conn]struct{}),
		queues:   make(map[string][]Fault),
		rule:     opts.Rule,
		changed:  make(chan struct{}),
		stats:    Stats{Faults: make(map[Kind]int)},
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	p.tr = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			p.update(func(s *Stats) { s.Dialed++; s.UpstreamOpen++ })
			return &countedConn{Conn: c, onClose: func() { p.update(func(s *Stats) { s.UpstreamOpen-- }) }}, nil
		},
		DisableCompression:  true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p.addr = l.Addr().String()
	p.mu.Lock()
	p.serveLocked(l)
	p.mu.Unlock()
	return p, nil
}

// URL returns the proxy's base URL, to use in place of the upstream's.
func (p *Proxy) URL() *url.URL {
	u := *p.upstream
	u.Scheme, u.Host = "http", p.addr
	return &u
}

func (p *Proxy) serveLocked(l net.Listener) {
	srv := &http.Server{
		Handler:   http.HandlerFunc(p.handle),
		ConnState: p.connState,
		// Handlers stall on purpose; only the header read is bounded.
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	p.srv = srv
	p.stop = make(chan struct{})
	p.serving.Add(1)
	go func() {
		defer p.serving.Done()
		_ = srv.Serve(l) // returns when the server is closed
	}()
}

func (p *Proxy) connState(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.update(func(s *Stats) { s.Accepted++; s.Open++ })
	case http.StateClosed, http.StateHijacked:
		p.mu.Lock()
		_, ok := p.conns[c]
		delete(p.conns, c)
		p.mu.Unlock()
		if ok {
			p.update(func(s *Stats) { s.Open-- })
		}
	}
}

// Push queues faults for path ("/api/generate", "/api/ps"; "" for any
// path): each is used by one later request, in order. A path's own queue
// is used before the "" queue.
func (p *Proxy) Push(path string, fs ...Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queues[path] = append(p.queues[path], fs...)
}

// Pending returns how many queued faults are still unused.
func (p *Proxy) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, q := range p.queues {
		n += len(q)
	}
	return n
}

// SetRule replaces the rule for requests that no queued fault claims; nil
// passes them through.
func (p *Proxy) SetRule(rule func(*Request) Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rule = rule
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Faults = make(map[Kind]int, len(p.stats.Faults))
	for k, v := range p.stats.Faults {
		s.Faults[k] = v
	}
	return s
}

// WaitFor blocks until cond holds for the proxy's counters or ctx is done
// (it then returns context.Cause(ctx)). cond is called at once and after
// every change.
func (p *Proxy) WaitFor(ctx context.Context, cond func(Stats) bool) error {
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		if cond(p.Stats()) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

func (p *Proxy) update(f func(*Stats)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.stats)
	close(p.changed)
	p.changed = make(chan struct{})
}

// GoAway stops listening and closes every client connection, as a server
// that went away: calls made meanwhile find nothing at the address
// (connection refused). Requests in progress end; their upstream requests
// are canceled. Resume listens again.
func (p *Proxy) GoAway() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	srv := p.srv
	p.srv = nil
	if srv != nil {
		close(p.stop)
	}
	p.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Close()
	p.awaitConnsClosed()
	return err
}

// awaitConnsClosed waits, boundedly, until net/http has reported every
// client connection closed after a server Close (it does so from the
// connections' goroutines, once their handlers return).
func (p *Proxy) awaitConnsClosed() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.WaitFor(ctx, func(s Stats) bool { return s.Open == 0 })
}

// Resume listens again on the proxy's address after GoAway. It fails if
// the port was taken meanwhile.
func (p *Proxy) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return ErrClosed
	case p.srv != nil:
		return nil
	}
	l, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
	}
	p.serveLocked(l)
	return nil
}

// Close stops the proxy: the listener and every client connection are
// closed, upstream requests in progress are canceled, and Close returns
// once every handler has returned and the upstream connections are closed.
// It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	srv := p.srv
	p.srv = nil
	if srv != nil {
		close(p.stop)
	}
	p.mu.Unlock()
	var err error
	if srv != nil {
		err = srv.Close()
	}
	p.awaitConnsClosed()
	p.serving.Wait()
	p.handlers.Wait()
	p.tr.CloseIdleConnections()
	return err
}

// take returns the fault for a request and registers its handler; ok is
// false once the proxy is closed or gone away.
func (p *Proxy) take(r *http.Request, body []byte) (f Fault, stop <-chan struct{}, ok bool) {
	p.mu.Lock()
	if p.closed || p.srv == nil {
		p.mu.Unlock()
		return Fault{}, nil, false
	}
	p.handlers.Add(1)
	p.seq++
	req := &Request{Seq: p.seq, Method: r.Method, Path: r.URL.Path, Body: body}
	stop = p.stop
	found := false
	for _, key := range []string{req.Path, ""} {
		if q := p.queues[key]; len(q) > 0 {
			f, p.queues[key], found = q[0], q[1:], true
			break
		}
	}
	rule := p.rule
	p.mu.Unlock()
	if !found && rule != nil {
		f = rule(req)
	}
	p.update(func(s *Stats) {
		s.Requests++
		if req.IsUnload() {
			s.Unloads++
		}
		s.Handlers++
		if f.Kind != KindPass {
			s.Faults[f.Kind]++
		}
	})
	return f, stop, true
}

func (p *Proxy) handle(w http.ResponseWriter, r *http.Request) {
	// Reading the whole body lets net/http watch the client connection, so
	// r.Context() ends when the client goes away.
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
	if err != nil {
		return
	}
	if len(body) > maxRequestBody {
		http.Error(w, "faultproxy: request body too large", http.StatusRequestEntityTooLarge)
		return
	}
	f, stop, ok := p.take(r, body)
	if !ok {
		http.Error(w, "faultproxy: closed", http.StatusServiceUnavailable)
		return
	}
	defer func() {
		p.update(func(s *Stats) { s.Handlers-- })
		p.handlers.Done()
	}()

	// ctx ends when the client goes away, the proxy stops, or a fault cuts
	// the exchange: the upstream request is canceled with it.
	ctx, cancel := context.WithCancel(r.Context())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() {
		cancel()
		<-watched
	}()

	x := &exchange{p: p, w: w, rc: http.NewResponseController(w), client: r.Context(), ctx: ctx, f: f, arrived: time.Now()}
	x.run(r, body)
}

// exchange is one request going through the proxy.
type exchange struct {
	p       *Proxy
	w       http.ResponseWriter
	rc      *http.ResponseController
	client  context.Context // ends when the client goes away
	ctx     context.Context // ends also when the proxy stops
	f       Fault
	arrived time.Time
	wrote   bool // headers sent
	lines   int  // complete lines relayed
	bytes   int  // body bytes relayed
}

func (x *exchange) run(r *http.Request, body []byte) {
	switch x.f.Kind {
	case KindRespond:
		x.fired()
		x.w.Header().Set("Content-Type", contentType(x.f.Body))
		x.w.WriteHeader(x.f.Status)
		_, _ = x.w.Write(x.f.Body)
		return
	case KindDelay:
		if !x.sleep(x.f.Delay) {
			return
		}
	case KindResetBytes, KindResetLines:
		if x.f.N <= 0 {
			x.fired()
			x.reset()
			return
		}
	}

	resp, err := x.forward(r, body)
	if err != nil {
		if x.ctx.Err() != nil {
			x.interrupted()
			return
		}
		http.Error(x.w, "faultproxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()

	if x.f.Kind == KindStall {
		x.fired()
		if !x.sleep(x.f.Delay - time.Since(x.arrived)) {
			return
		}
	}
	for k, vs := range resp.Header {
		if hopByHop[http.CanonicalHeaderKey(k)] {
			continue
		}
		for _, v := range vs {
			x.w.Header().Add(k, v)
		}
	}
	// The length changes with most faults: let net/http chunk the reply.
	x.w.Header().Del("Content-Length")
	x.w.WriteHeader(resp.StatusCode)
	x.wrote = true

	if x.f.Kind == KindResetBytes {
		x.relayBytes(resp.Body)
		return
	}
	x.relayLines(resp.Body)
}

// forward sends the request upstream under the exchange's context.
func (x *exchange) forward(r *http.Request, body []byte) (*http.Response, error) {
	u := *x.p.upstream
	u.Path = singleJoin(u.Path, r.URL.Path)
	u.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(x.ctx, r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range r.Header {
		if !hopByHop[http.CanonicalHeaderKey(k)] {
			out.Header[k] = vs
		}
	}
	return x.p.tr.RoundTrip(out)
}

// relayBytes relays x.f.N body bytes and resets the connection.
func (x *exchange) relayBytes(body io.Reader) {
	buf := make([]byte, 32<<10)
	for x.bytes < x.f.N {
		n, err := body.Read(buf[:min(len(buf), x.f.N-x.bytes)])
		if n > 0 && !x.write(buf[:n]) {
			return
		}
		if err != nil {
			return // the upstream reply ended before the fault
		}
	}
	x.fired()
	x.reset()
}

// relayLines relays the body line by line, applying line faults.
func (x *exchange) relayLines(body io.Reader) {
	br := bufio.NewReaderSize(body, 64<<10)
	f := x.f
	injected := false
	for {
		if !injected && x.lines == f.N {
			switch f.Kind {
			case KindResetLines:
				x.fired()
				x.reset()
				return
			case KindStallAfter:
				injected = true
				x.fired()
				if !x.sleep(f.Delay) {
					return
				}
			case KindInject:
				injected = true
				x.fired()
				if !x.write(f.Body) {
					return
				}
			}
		}
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if f.Kind == KindDropDone && isDone(line) {
				x.fired()
				line = nil
			}
			if len(line) > 0 && !x.write(line) {
				return
			}
			if bytes.HasSuffix(line, []byte{'\n'}) {
				x.lines++
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
			case x.ctx.Err() != nil:
				x.interrupted()
			default:
				// The upstream reply broke: break the client's too, rather
				// than end it cleanly.
				x.reset()
			}
			return
		}
	}
}

// write sends b to the client and flushes it; false means the client is
// gone.
func (x *exchange) write(b []byte) bool {
	if _, err := x.w.Write(b); err != nil {
		x.gone()
		return false
	}
	if err := x.rc.Flush(); err != nil {
		x.gone()
		return false
	}
	x.bytes += len(b)
	return true
}

// sleep waits d, or until the client goes away or the proxy stops.
func (x *exchange) sleep(d time.Duration) bool {
	if d <= 0 {
		return x.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-x.ctx.Done():
		x.interrupted()
		return false
	}
}

// interrupted ends an exchange whose context ended: the client went away,
// or the proxy is stopping, which must not look like a clean end.
func (x *exchange) interrupted() {
	if x.client.Err() != nil {
		x.gone()
		return
	}
	x.reset()
}

// fired records that the exchange's fault is acted out now.
func (x *exchange) fired() {
	now := time.Now()
	x.p.update(func(s *Stats) { s.Fired = now })
}

// reset resets the client connection (TCP RST), after what was written.
func (x *exchange) reset() {
	if x.wrote {
		_ = x.rc.Flush()
	}
	conn, brw, err := x.rc.Hijack()
	if err != nil {
		return
	}
	_ = brw.Flush()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func (x *exchange) gone() {
	x.p.update(func(s *Stats) { s.ClientGone++ })
}

// isDone reports whether an NDJSON line has "done": true.
func isDone(line []byte) bool {
	var v struct {
		Done bool `json:"done"`
	}
	return json.Unmarshal(line, &v) == nil && v.Done
}

func contentType(body []byte) string {
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '{' && !bytes.Contains(b, []byte{'\n'}) {
		return "application/json; charset=utf-8"
	}
	return "application/x-ndjson"
}

func singleJoin(a, b string) string {
	switch {
	case a == "":
		return b
	case a[len(a)-1] == '/' && len(b) > 0 && b[0] == '/':
		return a + b[1:]
	case a[len(a)-1] != '/' && (len(b) == 0 || b[0] != '/'):
		return a + "/" + b
	}
	return a + b
}

// hopByHop are the headers a proxy must not forward (RFC 9110 7.6.1).
var hopByHop = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// countedConn calls onClose once, on the first Close.
type countedConn struct {
	net.Conn
	once    sync.Once
	onClose func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.onClose)
	return err
}
