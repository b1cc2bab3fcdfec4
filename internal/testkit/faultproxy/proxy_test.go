package faultproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/testkit/faultproxy"
	"github.com/vramguard/vramguard/vramguardtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup starts a simulator with model "tiny" (chunks lines of text plus
// the done line) and a proxy in front of it, both closed at the end of the
// test, after which no goroutine of the test may be left.
func setup(t *testing.T, chunks int, opts faultproxy.Options) (*vramguardtest.Server, *faultproxy.Proxy, *http.Client) {
	return setupModel(t, vramguardtest.ModelConfig{Name: "tiny", Chunks: chunks}, opts)
}

func setupModel(t *testing.T, mc vramguardtest.ModelConfig, opts faultproxy.Options) (*vramguardtest.Server, *faultproxy.Proxy, *http.Client) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // first cleanup: runs last
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{mc}})
	t.Cleanup(s.Close)
	p, err := faultproxy.New(s.URL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return s, p, &http.Client{Transport: tr}
}

// generate posts a streaming generation through the proxy and returns the
// body bytes read and the error that ended the read (nil for a clean end).
func generate(ctx context.Context, hc *http.Client, p *faultproxy.Proxy, keepAlive string) (status int, body []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL().String()+"/api/generate",
		strings.NewReader(`{"model":"tiny","prompt":"a red fox","keep_alive":`+keepAlive+`}`))
	if err != nil {
		return 0, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func lines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func waitSim(t *testing.T, s *vramguardtest.Server, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func TestPassThrough(t *testing.T) {
	s, p, hc := setup(t, 5, faultproxy.Options{})
	status, body, err := generate(t.Context(), hc, p, `"1m"`)
	if err != nil || status != http.StatusOK {
		t.Fatalf("status %d, err %v", status, err)
	}
	ls := lines(body)
	if len(ls) != 6 || !strings.Contains(ls[5], `"done":true`) {
		t.Fatalf("got %d lines %q, want 5 chunks and the done line", len(ls), ls)
	}
	// Non-streaming GET with a query string.
	resp, err := hc.Get(p.URL().String() + "/api/ps?x=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"tiny:latest"`) {
		t.Fatalf("/api/ps through the proxy: %s", b)
	}
	st := p.Stats()
	if st.Requests != 2 || len(st.Faults) != 0 || s.Requests("tiny") != 1 {
		t.Errorf("stats %+v, sim requests %d", st, s.Requests("tiny"))
	}
}

// isReset reports whether err is what a client sees of a reset or cut
// connection.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

func TestFaults(t *testing.T) {
	const chunks = 6 // plus the done line
	huge := 9 << 20
	tests := []struct {
		name  string
		fault faultproxy.Fault
		// what the client must see
		status   int // 0: no response at all
		nLines   int // complete lines received, -1: not checked
		reset    bool
		contains string
		upstream bool // the request reached the simulator
		canceled bool // and the simulator saw it canceled
	}{
		{name: "reset before the first byte", fault: faultproxy.ResetAfterBytes(0), reset: true, upstream: false},
		{name: "reset after 3 lines", fault: faultproxy.ResetAfterLines(3), status: 200, nLines: 3, reset: true, upstream: true},
		{name: "reset after 10 bytes", fault: faultproxy.ResetAfterBytes(10), status: 200, nLines: 0, reset: true, upstream: true},
		{name: "runner terminated", fault: faultproxy.RunnerTerminated(), status: 500, nLines: 0, contains: "llama runner process has terminated"},
		{name: "busy", fault: faultproxy.Busy(), status: 503, nLines: 0, contains: "server busy"},
		{name: "garbage", fault: faultproxy.Garbage([]byte("\x00\xffnot json\n{{{")), status: 200, nLines: 1, contains: "not json"},
		{name: "huge line", fault: faultproxy.HugeLine(2, huge), status: 200, nLines: chunks + 2, contains: strings.Repeat("x", 100), upstream: true},
		{name: "drop done", fault: faultproxy.DropDone(), status: 200, nLines: chunks, upstream: true},
		{name: "inject error line", fault: faultproxy.InjectAfter(1, []byte(`{"error":"boom"}`+"\n")), status: 200, nLines: chunks + 2, contains: `"boom"`, upstream: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, p, hc := setup(t, chunks, faultproxy.Options{})
			p.Push("/api/generate", tt.fault)
			sent := time.Now()
			status, body, err := generate(t.Context(), hc, p, `"0s"`)
			received := time.Now()
			if tt.reset {
				if !isReset(err) {
					t.Fatalf("got status %d, err %v; want a reset connection", status, err)
				}
			} else if err != nil {
				t.Fatalf("read: %v", err)
			}
			if status != tt.status {
				t.Errorf("status %d, want %d", status, tt.status)
			}
			if n := bytes.Count(body, []byte{'\n'}); tt.nLines >= 0 && n != tt.nLines {
				t.Errorf("%d complete lines, want %d", n, tt.nLines)
			}
			if tt.fault.Kind == faultproxy.KindDropDone && bytes.Contains(body, []byte(`"done":true`)) {
				t.Error("the done line came through")
			}
			if tt.contains != "" && !bytes.Contains(body, []byte(tt.contains)) {
				t.Errorf("body %.200q lacks %q", body, tt.contains)
			}
			if got := s.Requests("tiny") > 0; got != tt.upstream {
				t.Errorf("request reached the upstream: %v, want %v", got, tt.upstream)
			}
			if st := p.Stats(); st.Faults[tt.fault.Kind] != 1 {
				t.Errorf("faults %v, want one %v", st.Faults, tt.fault.Kind)
			}
			// The moment the fault was acted out lies within the exchange.
			if f := p.Stats().Fired; f.Before(sent) || f.After(received) {
				t.Errorf("Fired %v, want between the request (%v) and the reply's end (%v)", f, sent, received)
			}
			// Whatever the fault, the model is gone in the end (keep-alive 0).
			waitSim(t, s, "nothing listed", func() bool { return !s.Listed("tiny") && len(s.Running()) == 0 })
		})
	}
}

// TestCancelReachesUpstream: a client that gives up, or a fault that cuts
// the exchange, cancels the upstream request: the server counts it
// canceled (Ollama logs 499), and lets the model go.
func TestCancelReachesUpstream(t *testing.T) {
	tests := []struct {
		name  string
		fault faultproxy.Fault
		give  time.Duration // the client gives up after this
	}{
		{"client gives up mid-stream", faultproxy.StallAfter(2, time.Minute), 100 * time.Millisecond},
		{"client gives up during a stall", faultproxy.Stall(time.Minute), 100 * time.Millisecond},
		{"reset mid-stream", faultproxy.ResetAfterLines(2), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", Chunks: 1000, TokenLatency: 5 * time.Millisecond}}})
			defer s.Close()
			p, err := faultproxy.New(s.URL(), faultproxy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			p.Push("/api/generate", tt.fault)
			ctx := t.Context()
			if tt.give > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.give)
				defer cancel()
			}
			start := time.Now()
			_, _, err = generate(ctx, &http.Client{Transport: tr}, p, `"5m"`)
			if err == nil {
				t.Fatal("the exchange ended cleanly")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the client waited %v", d)
			}
			waitSim(t, s, "the server sees the request canceled", func() bool { return s.Cancelled("tiny") == 1 })
			if err := p.WaitFor(t.Context(), func(st faultproxy.Stats) bool { return st.Handlers == 0 }); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestStallAndDelay(t *testing.T) {
	const d = 150 * time.Millisecond
	for _, f := range []faultproxy.Fault{faultproxy.Stall(d), faultproxy.StallAfter(2, d), faultproxy.Delay(d)} {
		t.Run(f.String(), func(t *testing.T) {
			_, p, hc := setup(t, 4, faultproxy.Options{})
			p.Push("", f)
			start := time.Now()
			status, body, err := generate(t.Context(), hc, p, `"0s"`)
			if err != nil || status != 200 || len(lines(body)) != 5 {
				t.Fatalf("status %d, %d lines, err %v", status, len(lines(body)), err)
			}
			if el := time.Since(start); el < d {
				t.Errorf("took %v, less than the %v fault", el, d)
			}
		})
	}
}

func TestDelayPS(t *testing.T) {
	_, p, hc := setup(t, 1, faultproxy.Options{})
	p.Push("/api/ps", faultproxy.Delay(200*time.Millisecond))
	// The generation is not delayed: the fault is for /api/ps.
	start := time.Now()
	if _, _, err := generate(t.Context(), hc, p, `"0s"`); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Logf("generation took %v (slow machine?)", d)
	}
	start = time.Now()
	resp, err := hc.Get(p.URL().String() + "/api/ps")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("/api/ps answered after %v, before its delay", d)
	}
}

func TestRuleAndQueue(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	rule := func(r *faultproxy.Request) faultproxy.Fault {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s %s unload=%v gen=%v", r.Method, r.Path, r.IsUnload(), r.IsGeneration()))
		if r.IsGeneration() {
			return faultproxy.Busy()
		}
		return faultproxy.Pass()
	}
	_, p, hc := setup(t, 2, faultproxy.Options{Rule: rule})
	// The queue is used first, the rule after it.
	p.Push("/api/generate", faultproxy.Pass())
	if st, _, err := generate(t.Context(), hc, p, `"0s"`); err != nil || st != 200 {
		t.Fatalf("queued pass: %d, %v", st, err)
	}
	if st, _, _ := generate(t.Context(), hc, p, `"0s"`); st != 503 {
		t.Fatalf("rule: status %d, want 503", st)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.URL().String()+"/api/generate",
		strings.NewReader(`{"model":"tiny","keep_alive":0}`))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("unload: status %d", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"POST /api/generate unload=false gen=true", "POST /api/generate unload=true gen=false"}
	if strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Errorf("rule saw %q, want %q", seen, want)
	}
	if p.Pending() != 0 {
		t.Errorf("%d faults still queued", p.Pending())
	}
}

func TestGoAwayAndResume(t *testing.T) {
	_, p, hc := setup(t, 1, faultproxy.Options{})
	if _, _, err := generate(t.Context(), hc, p, `"0s"`); err != nil {
		t.Fatal(err)
	}
	if err := p.GoAway(); err != nil {
		t.Fatal(err)
	}
	// A pooled connection may see the close as EOF; a new one is refused.
	hc.CloseIdleConnections()
	_, _, err := generate(t.Context(), hc, p, `"0s"`)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after GoAway: %v, want connection refused", err)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := generate(t.Context(), hc, p, `"0s"`); err != nil {
		t.Fatalf("after Resume: %v", err)
	}
}

// TestGoAwayDuringStall: a request stalled in the proxy ends when the
// proxy goes away, and its upstream request is canceled.
func TestGoAwayDuringStall(t *testing.T) {
	s, p, hc := setupModel(t, vramguardtest.ModelConfig{Name: "tiny", Chunks: 1000, TokenLatency: 5 * time.Millisecond}, faultproxy.Options{})
	p.Push("", faultproxy.StallAfter(1, time.Hour))
	errc := make(chan error, 1)
	go func() {
		_, _, err := generate(context.WithoutCancel(t.Context()), hc, p, `"0s"`)
		errc <- err
	}()
	if err := p.WaitFor(t.Context(), func(st faultproxy.Stats) bool { return st.Faults[faultproxy.KindStallAfter] == 1 }); err != nil {
		t.Fatal(err)
	}
	waitSim(t, s, "the generation started", func() bool { return s.InFlight("tiny") == 1 })
	if err := p.GoAway(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !isReset(err) {
			t.Errorf("client got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client hung after GoAway")
	}
	waitSim(t, s, "upstream canceled", func() bool { return s.Cancelled("tiny") == 1 })
}

// TestCloseEndsEverything: Close while requests stall returns promptly and
// leaves no connection open on either side.
func TestCloseEndsEverything(t *testing.T) {
	s, p, hc := setupModel(t, vramguardtest.ModelConfig{Name: "tiny", Chunks: 1000, TokenLatency: 5 * time.Millisecond}, faultproxy.Options{Rule: func(*faultproxy.Request) faultproxy.Fault {
		return faultproxy.StallAfter(1, time.Hour)
	}})
	const n = 8
	errc := make(chan error, n)
	for range n {
		go func() {
			_, _, err := generate(context.WithoutCancel(t.Context()), hc, p, `"0s"`)
			errc <- err
		}()
	}
	waitSim(t, s, "all generations running", func() bool { return s.InFlight("tiny") == n })
	st := p.Stats()
	if st.Open != n || st.UpstreamOpen != n || st.Handlers != n {
		t.Errorf("stats %+v, want %d open on both sides", st, n)
	}
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	for range n {
		if err := <-errc; err == nil {
			t.Error("a stalled request ended cleanly")
		}
	}
	st = p.Stats()
	if st.Open != 0 || st.UpstreamOpen != 0 || st.Handlers != 0 {
		t.Errorf("after Close: %+v", st)
	}
	waitSim(t, s, "every upstream request canceled", func() bool { return s.Cancelled("tiny") == n })
	if err := p.GoAway(); !errors.Is(err, faultproxy.ErrClosed) {
		t.Errorf("GoAway after Close: %v", err)
	}
}

// TestConcurrentFaults runs many requests with mixed faults at once (run
// with -race): every request ends, the counters add up, and nothing is
// left open.
func TestConcurrentFaults(t *testing.T) {
	s, p, hc := setup(t, 4, faultproxy.Options{})
	fs := []faultproxy.Fault{
		faultproxy.Pass(), faultproxy.ResetAfterLines(2), faultproxy.ResetAfterBytes(0), faultproxy.Busy(),
		faultproxy.DropDone(), faultproxy.StallAfter(1, 5*time.Millisecond), faultproxy.Garbage([]byte("?")),
	}
	p.SetRule(func(r *faultproxy.Request) faultproxy.Fault { return fs[int(r.Seq)%len(fs)] })
	const n = 70
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _ = generate(t.Context(), hc, p, `"0s"`)
		}()
	}
	wg.Wait()
	st := p.Stats()
	total := 0
	for _, v := range st.Faults {
		total += v
	}
	if st.Requests != n || total != n-n/len(fs) {
		t.Errorf("requests %d, faults %v (%d)", st.Requests, st.Faults, total)
	}
	hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := p.WaitFor(ctx, func(st faultproxy.Stats) bool { return st.Open == 0 && st.Handlers == 0 }); err != nil {
		t.Fatalf("connections still open: %+v", p.Stats())
	}
	waitSim(t, s, "nothing listed", func() bool { return len(s.Running()) == 0 })
}

func TestNewRefusesNoHost(t *testing.T) {
	if _, err := faultproxy.New(nil, faultproxy.Options{}); err == nil {
		t.Error("nil upstream accepted")
	}
}

func TestResetCarriesNoStaleData(t *testing.T) {
	// A reset after n bytes delivers at most n body bytes.
	_, p, hc := setup(t, 20, faultproxy.Options{})
	for _, n := range []int{1, 37, 200} {
		p.Push("", faultproxy.ResetAfterBytes(n))
		_, body, err := generate(t.Context(), hc, p, `"0s"`)
		if !isReset(err) || len(body) > n {
			t.Errorf("n=%d: %d bytes, err %v", n, len(body), err)
		}
	}
	_ = net.ErrClosed
}
