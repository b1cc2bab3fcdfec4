package oracle

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
)

// Parties that send requests.
const (
	PartyOwn     = "own"     // the client under test
	PartyForeign = "foreign" // a raw api client in this process
	PartyCLI     = "cli"     // `ollama run`, through a recording proxy
	PartyChild   = "child"   // a second process using vramguard, recording its own sends (ChildTransport)
)

// Send is one request as it went to the server.
type Send struct {
	T      time.Time
	Party  string
	Path   string
	Model  string // the model's weights group (Group)
	Unload bool   // an unload request: no prompt or messages, keep_alive 0
	Action int    // the action that sent it, -1 when unknown
	// KeepAlive is the keep_alive sent, as on the wire ("" for none).
	KeepAlive string
	// Written is set once the whole request went out: a request whose
	// dial failed (a server restarting) reached no server and loaded
	// nothing.
	Written bool
	// Answered is when the reply's headers came (Ollama sends them with
	// the first chunk); zero if they never did.
	Answered time.Time
	// Done is set when the reply's stream carried a line with done:true,
	// at DoneAt.
	Done   bool
	DoneAt time.Time
}

// Verdict is a verified unload as a client reported it
// (Hooks.OnUnloadEnd, verified).
type Verdict struct {
	T       time.Time
	Party   string
	Model   string // weights group
	Checked vramguard.Checks
	// NoRunnerCheck is the report's reason for a missing process check.
	NoRunnerCheck string
	// Elapsed and Attempts are the report's: the call's span and the
	// unload requests it sent, which tie the verdict to its own sends.
	Elapsed  time.Duration
	Attempts int
}

// Obs is one look at the server: what /api/ps listed and which runners
// served which weights, between T0 (before the look) and T1 (after it).
type Obs struct {
	T0, T1  time.Time
	Listed  map[string]bool // weights groups /api/ps listed
	Runners map[string]int  // weights group -> live runners
	Err     string          // the look failed (the server is down, say)
}

// present reports whether group g was resident in o.
func (o Obs) present(g string) bool { return o.Listed[g] || o.Runners[g] > 0 }

// Result is how one action ended.
type Result struct {
	ID     int
	Action Action
	Start  time.Time
	End    time.Time
	Err    error
	// Canceled is set when the oracle canceled the call's context before
	// it returned.
	Canceled bool
	// Bound is the longest the call may take: its timeouts plus a margin.
	Bound time.Duration
	// Fault is the fault in force when the call started.
	Fault Fault
	Note  string // what happened, for the log (a child's outcome, a skipped kill)
}

// Trace is what one schedule did and saw. It is safe for concurrent use;
// freeze returns the copy the checks read.
type Trace struct {
	mu       sync.Mutex
	frozen   bool
	Sends    []*Send
	Verdicts []Verdict
	Obs      []Obs
	Results  []Result
	// MaxLoad is the longest load a generation reported.
	MaxLoad time.Duration
	// AfterClose is a look taken once every client under test was
	// closed, before the foreign party cleaned up; CloseErr is what
	// closing them returned.
	AfterClose Obs
	CloseErr   error
	// Hung describes a round that never ended ("" when none did): the
	// schedule was abandoned there.
	Hung string
}

func (t *Trace) send(s *Send) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.frozen {
		t.Sends = append(t.Sends, s)
	}
}

// update changes a recorded send under the lock.
func (t *Trace) update(fn func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fn()
}

func (t *Trace) markDone(s *Send) {
	t.update(func() {
		if !s.Done {
			s.Done, s.DoneAt = true, time.Now()
		}
	})
}

func (t *Trace) verdict(v Verdict) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.frozen {
		t.Verdicts = append(t.Verdicts, v)
	}
}

func (t *Trace) observe(o Obs) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.frozen {
		t.Obs = append(t.Obs, o)
	}
}

func (t *Trace) result(r Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.frozen {
		t.Results = append(t.Results, r)
	}
}

// freeze stops recording and returns a copy of what was recorded, sends
// copied by value: goroutines of a hung schedule may still write to t.
func (t *Trace) freeze() *Trace {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.frozen = true
	c := &Trace{frozen: true, Verdicts: slices.Clone(t.Verdicts), Obs: slices.Clone(t.Obs), Results: slices.Clone(t.Results),
		MaxLoad: t.MaxLoad, AfterClose: t.AfterClose, CloseErr: t.CloseErr, Hung: t.Hung}
	for _, s := range t.Sends {
		cp := *s
		c.Sends = append(c.Sends, &cp)
	}
	return c
}

func (t *Trace) load(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.MaxLoad = max(t.MaxLoad, d)
}

// Group maps a model name to its weights group: tiny-a and tiny-a-short
// share one runner.
func Group(model string) string {
	n := vramguard.NormalizeModelName(model)
	switch n {
	case ModelA + ":latest", ModelAShort + ":latest":
		return ModelA
	case ModelB + ":latest":
		return ModelB
	}
	return n
}

type actionKey struct{}

// withAction tags ctx with the action that sends requests under it.
func withAction(ctx context.Context, id int) context.Context {
	return context.WithValue(ctx, actionKey{}, id)
}

// recorder is an http.RoundTripper that records every generate and chat
// request of one party in the trace, and whether its reply carried
// done:true.
type recorder struct {
	party string
	trace *Trace
	next  http.RoundTripper
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path != "/api/generate" && req.URL.Path != "/api/chat" || req.Body == nil {
		return r.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	var m struct {
		Model     string            `json:"model"`
		Prompt    string            `json:"prompt"`
		Messages  []json.RawMessage `json:"messages"`
		KeepAlive json.RawMessage   `json:"keep_alive"`
	}
	_ = json.Unmarshal(body, &m)
	ka := strings.Trim(string(m.KeepAlive), `"`)
	s := &Send{
		Party:     r.party,
		Path:      req.URL.Path,
		Model:     Group(m.Model),
		Unload:    m.Prompt == "" && len(m.Messages) == 0 && (ka == "0" || ka == "0s"),
		Action:    -1,
		KeepAlive: ka,
	}
	if id, ok := req.Context().Value(actionKey{}).(int); ok {
		s.Action = id
	}
	// The send time is when the request was written, not when the round
	// trip began (a dial can take long on a busy machine).
	s.T = time.Now()
	r.trace.send(s)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) {
			now := time.Now()
			r.trace.update(func() { s.T, s.Written = now, true })
		},
	}))
	resp, err := r.next.RoundTrip(req)
	if err == nil {
		now := time.Now()
		r.trace.update(func() { s.Answered = now })
	}
	if err != nil || s.Unload {
		return resp, err
	}
	resp.Body = &doneScanner{rc: resp.Body, on: func() { r.trace.markDone(s) }}
	return resp, nil
}

// doneScanner passes a reply through and calls on once when a whole line
// with "done":true has gone by.
type doneScanner struct {
	rc   io.ReadCloser
	line []byte
	on   func()
	seen bool
}

func (d *doneScanner) Read(p []byte) (int, error) {
	n, err := d.rc.Read(p)
	if !d.seen {
		for _, b := range p[:n] {
			if b != '\n' {
				if len(d.line) < 1<<16 {
					d.line = append(d.line, b)
				}
				continue
			}
			if bytes.Contains(d.line, []byte(`"done":true`)) {
				d.seen = true
				d.on()
				break
			}
			d.line = d.line[:0]
		}
	}
	return n, err
}

func (d *doneScanner) Close() error { return d.rc.Close() }

// proxy is a recording reverse proxy on loopback for a party that is not
// in this process (the CLI, a child process).
type proxy struct {
	srv *http.Server
	ln  net.Listener
	tr  *http.Transport
	wg  sync.WaitGroup
}

func newProxy(party string, trace *Trace, upstream *url.URL) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.FlushInterval = -1
	rp.Transport = &recorder{party: party, trace: trace, next: tr}
	rp.ErrorLog = nil
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		w.WriteHeader(http.StatusBadGateway)
	}
	p := &proxy{srv: &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}, ln: ln, tr: tr}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// Host is the proxy's host:port.
func (p *proxy) Host() string { return p.ln.Addr().String() }

func (p *proxy) Close() {
	_ = p.srv.Close()
	p.wg.Wait()
	p.tr.CloseIdleConnections()
}

// ChildLine is what a child process prints on stdout after
// "oracle-child: ": its sends, its verdicts and its outcome.
type ChildLine struct {
	Sends    []Send    `json:"sends"`
	Verdicts []Verdict `json:"verdicts"`
	Err      string    `json:"err,omitempty"`
	Kind     string    `json:"kind,omitempty"`
}

// ChildTransport records a child process's own generate and chat requests
// as the recorder of this process does; sends returns them. The child
// reaches the server directly, as a user's second program would: through a
// proxy it would talk to a listener that is this test binary, not the
// server, and its runner check (tied to the process that owns the socket
// at the client's port) would rightly not be made.
func ChildTransport(next http.RoundTripper) (rt http.RoundTripper, sends func() []Send) {
	tr := &Trace{}
	return &recorder{party: PartyChild, trace: tr, next: next}, func() []Send {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		out := make([]Send, len(tr.Sends))
		for i, s := range tr.Sends {
			out[i] = *s
		}
		return out
	}
}

func readChildLine(out []byte) (ChildLine, bool) {
	var cl ChildLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if l := sc.Bytes(); bytes.HasPrefix(l, []byte("oracle-child: ")) {
			if json.Unmarshal(bytes.TrimPrefix(l, []byte("oracle-child: ")), &cl) == nil {
				return cl, true
			}
		}
	}
	return cl, false
}
