package vramguardtest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

func TestGenerateStreamsWithMetrics(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	res := mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "hello there"})
	if len(res.chunks) != 4 {
		t.Errorf("got %d chunks, want 4", len(res.chunks))
	}
	f := res.final
	if f.DoneReason != "stop" || f.Response != "" || f.Model != "tiny" {
		t.Errorf("final line = %+v, want done_reason stop, empty response, model tiny", f)
	}
	if f.TotalDuration <= 0 || f.LoadDuration <= 0 || f.EvalDuration <= 0 || f.EvalCount != 4 || f.PromptEvalCount != 2 {
		t.Errorf("metrics = %+v", f.Metrics)
	}

	again := mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "hello there"})
	if got, want := text(again), text(res); got != want {
		t.Errorf("reply not deterministic: %q then %q", want, got)
	}
}

func text(r result) string {
	var b strings.Builder
	for _, ch := range r.chunks {
		b.WriteString(ch.Response)
	}
	return b.String()
}

func TestStreamWireFormat(t *testing.T) {
	s, _ := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	body := `{"model":"tiny","prompt":"hi"}`
	resp, err := http.Post(s.URL().JoinPath("/api/generate").String(), "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("Content-Type = %q, want application/x-ndjson", ct)
	}
	var lines int
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines++
	}
	if lines != 5 {
		t.Errorf("got %d lines, want 4 chunks and a done line", lines)
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestNonStreaming(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	stream := false
	var replies []api.GenerateResponse
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "x", Stream: &stream},
		func(r api.GenerateResponse) error { replies = append(replies, r); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) != 1 || !replies[0].Done || len(strings.Fields(replies[0].Response)) != 4 {
		t.Errorf("replies = %+v, want one done reply of 4 words", replies)
	}
}

func TestNumPredictCapsChunks(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	res := mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "x", Options: map[string]any{"num_predict": 2}})
	if len(res.chunks) != 2 || res.final.DoneReason != "length" || res.final.EvalCount != 2 {
		t.Errorf("got %d chunks, final %+v; want 2 chunks and done_reason length", len(res.chunks), res.final)
	}
}

func TestLoadDurationOnlyOnLoadingRequest(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	first := mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "a"})
	second := mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "b"})
	if first.final.LoadDuration < 10*time.Millisecond {
		t.Errorf("loading request: load_duration = %v, want >= 10ms", first.final.LoadDuration)
	}
	if second.final.LoadDuration != 0 {
		t.Errorf("second request: load_duration = %v, want 0", second.final.LoadDuration)
	}
	if n := s.Loads("tiny"); n != 1 {
		t.Errorf("Loads = %d, want 1", n)
	}
}

func TestConcurrentRequestsShareOneLoad(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
		m.LoadLatency = 100 * time.Millisecond
	})}})

	const n = 3
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
		}()
	}
	// While loading, the model is not listed.
	waitFor(t, s, time.Second, "loading", func() bool { r, ok := runner(s, "tiny:latest"); return ok && r.Loading })
	if _, ok := ps(t, c, "tiny:latest"); ok {
		t.Error("/api/ps lists a model that is still loading")
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil || r.final == nil || r.final.LoadDuration <= 0 {
			t.Errorf("request %d: err %v, final %+v; want done with load_duration", i, r.err, r.final)
		}
	}
	if got := s.Loads("tiny"); got != 1 {
		t.Errorf("Loads = %d, want 1", got)
	}
}

func TestKeepAlive(t *testing.T) {
	tests := []struct {
		name      string
		keepAlive *api.Duration
		listed    bool          // still listed after settle
		expires   time.Duration // expected expires_at - now, roughly
	}{
		{name: "absent keeps default 5m", keepAlive: nil, listed: true, expires: 5 * time.Minute},
		{name: "duration", keepAlive: keepAlive(time.Hour), listed: true, expires: time.Hour},
		{name: "negative is forever", keepAlive: keepAlive(-1), listed: true, expires: 100 * 365 * 24 * time.Hour},
		{name: "zero unloads after request", keepAlive: keepAlive(0), listed: false},
		{name: "short expires", keepAlive: keepAlive(30 * time.Millisecond), listed: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

			mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p", KeepAlive: tt.keepAlive})
			if !tt.listed {
				waitFor(t, s, time.Second, "unload", func() bool { return !s.Listed("tiny") })
				if _, ok := ps(t, c, "tiny:latest"); ok {
					t.Fatal("/api/ps still lists the model")
				}
				if s.Unloads("tiny") != 1 {
					t.Errorf("Unloads = %d, want 1", s.Unloads("tiny"))
				}
				return
			}
			time.Sleep(50 * time.Millisecond) // longer than UnloadDelay
			m, ok := ps(t, c, "tiny:latest")
			if !ok {
				t.Fatal("/api/ps does not list the model")
			}
			if left := time.Until(m.ExpiresAt); left < tt.expires-time.Minute {
				t.Errorf("expires in %v, want about %v", left, tt.expires)
			}
			if m.Model != "tiny:latest" || m.SizeVRAM != 2<<30 || m.Digest == "" || m.ContextLength != vramguardtest.DefaultContextLength {
				t.Errorf("ps entry = %+v", m)
			}
		})
	}
}

func TestDefaultKeepAliveConfig(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}, DefaultKeepAlive: 30 * time.Millisecond})
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
	waitFor(t, s, time.Second, "expiry", func() bool { return !s.Listed("tiny") })
	if st := s.Stats(""); st.Requests != 1 || st.Loads != 1 || st.Unloads != 1 || st.Completed != 1 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestKeepAliveIsStickyLastWriterWins(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "a", KeepAlive: keepAlive(time.Hour)})
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "b"}) // no keep_alive: keeps 1h
	if r, _ := runner(s, "tiny:latest"); r.KeepAlive != time.Hour {
		t.Fatalf("after a request without keep_alive: keep-alive %v, want 1h", r.KeepAlive)
	}
	if m, _ := ps(t, c, "tiny:latest"); time.Until(m.ExpiresAt) < 59*time.Minute {
		t.Errorf("expires_at %v, want about 1h ahead", m.ExpiresAt)
	}

	// Long enough that "d" arrives before the expiry on a busy machine
	// (after it, "d" would load the model again with the server's default).
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "c", KeepAlive: keepAlive(300 * time.Millisecond)})
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "d"}) // inherits 300ms
	waitFor(t, s, 3*time.Second, "expiry", func() bool { return !s.Listed("tiny") })
	if s.Loads("tiny") != 1 {
		t.Errorf("Loads = %d, want 1", s.Loads("tiny"))
	}
}

func TestUnloadReplyPrecedesRemoval(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}, UnloadDelay: 200 * time.Millisecond})
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})

	got := unload(t, c, "tiny")
	if !got.Done || got.DoneReason != "unload" || got.Model != "tiny" {
		t.Fatalf("unload reply = %+v", got)
	}
	m, ok := ps(t, c, "tiny:latest")
	if !ok {
		t.Fatal("model gone from /api/ps right after the unload reply; the reply must not be proof")
	}
	if !m.ExpiresAt.Before(time.Now()) {
		t.Errorf("expires_at %v not in the past after unload", m.ExpiresAt)
	}
	waitFor(t, s, 2*time.Second, "removal", func() bool { return !s.Listed("tiny") })
	if _, _, free := s.Memory(); free != vramguardtest.DefaultTotalVRAM {
		t.Errorf("free VRAM %d after unload, want all", free)
	}
}

func TestRequestAfterUnloadReloads(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}, UnloadDelay: time.Hour})
	mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
	unload(t, c, "tiny")
	// The unload is still pending, but a new request waits for it and loads
	// the model again rather than reusing the dying runner.
	res := mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
	if res.final.LoadDuration <= 0 || s.Loads("tiny") != 2 || s.Unloads("tiny") != 1 {
		t.Errorf("load_duration %v, %+v; want a reload", res.final.LoadDuration, s.Stats("tiny"))
	}
	if r, _ := runner(s, "tiny:latest"); r.Expiring || r.KeepAlive != vramguardtest.DefaultKeepAlive {
		t.Errorf("new runner %+v, want a fresh one with the default keep-alive", r)
	}
}

func TestUnloadCases(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	t.Run("not loaded", func(t *testing.T) {
		if got := unload(t, c, "tiny"); got.DoneReason != "unload" {
			t.Errorf("reply %+v, want done_reason unload", got)
		}
		if s.Unloads("tiny") != 0 || s.Loads("tiny") != 0 {
			t.Errorf("unload of an unloaded model had an effect: %+v", s.Stats("tiny"))
		}
	})
	t.Run("unknown model", func(t *testing.T) {
		err := c.Generate(t.Context(), &api.GenerateRequest{Model: "nope", KeepAlive: keepAlive(0)},
			func(api.GenerateResponse) error { return nil })
		if se := statusError(t, err); se.StatusCode != http.StatusNotFound || se.ErrorMessage != "model 'nope' not found" {
			t.Errorf("got %+v, want 404 model 'nope' not found", se)
		}
	})
	t.Run("chat without messages", func(t *testing.T) {
		mustGenerate(t, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
		var got api.ChatResponse
		err := c.Chat(t.Context(), &api.ChatRequest{Model: "tiny", KeepAlive: keepAlive(0)},
			func(r api.ChatResponse) error { got = r; return nil })
		if err != nil || got.DoneReason != "unload" {
			t.Fatalf("chat unload: %v, %+v", err, got)
		}
		waitFor(t, s, time.Second, "removal", func() bool { return !s.Listed("tiny") })
	})
	t.Run("empty prompt loads", func(t *testing.T) {
		var got api.GenerateResponse
		err := c.Generate(t.Context(), &api.GenerateRequest{Model: "tiny"},
			func(r api.GenerateResponse) error { got = r; return nil })
		if err != nil || got.DoneReason != "load" {
			t.Fatalf("load request: %v, %+v", err, got)
		}
		if _, ok := ps(t, c, "tiny:latest"); !ok {
			t.Error("model not listed after a load request")
		}
	})
}

func TestUnloadDuringLoad(t *testing.T) {
	tests := []struct {
		name    string
		honor   bool
		version string
		listed  bool
	}{
		{name: "lost by default, like v0.17.4", listed: true},
		{name: "honored when asked", honor: true, listed: false},
		{name: "honored by a v0.6.5", version: "0.6.5", listed: false},
		{name: "lost by a v0.34.4", version: "v0.34.4", listed: true},
		{name: "lost by an unparsed version", version: "main", listed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := start(t, vramguardtest.Config{
				Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
					m.LoadLatency = 150 * time.Millisecond
				})},
				HonorUnloadDuringLoad: tt.honor,
				Version:               tt.version,
			})
			done := make(chan result, 1)
			go func() { done <- generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"}) }()
			waitFor(t, s, time.Second, "loading", func() bool { r, ok := runner(s, "tiny:latest"); return ok && r.Loading })

			if got := unload(t, c, "tiny"); got.DoneReason != "unload" {
				t.Errorf("unload reply %+v", got)
			}
			if res := <-done; res.err != nil || res.final == nil {
				t.Fatalf("loading request failed: %v", res.err)
			}
			time.Sleep(60 * time.Millisecond) // past UnloadDelay
			m, listed := ps(t, c, "tiny:latest")
			if listed != tt.listed {
				t.Fatalf("listed = %v, want %v", listed, tt.listed)
			}
			if listed && time.Until(m.ExpiresAt) < 4*time.Minute {
				t.Errorf("lost unload: expires_at %v, want the loading request's 5m keep-alive", m.ExpiresAt)
			}
			var kinds []vramguardtest.EventKind
			for _, ev := range s.Events("tiny") {
				kinds = append(kinds, ev.Kind)
			}
			want := []vramguardtest.EventKind{vramguardtest.EventRequest, vramguardtest.EventUnloadRequest, vramguardtest.EventLoaded, vramguardtest.EventUnloaded}
			if tt.listed {
				want = []vramguardtest.EventKind{vramguardtest.EventRequest, vramguardtest.EventUnloadRequest, vramguardtest.EventUnloadLost, vramguardtest.EventLoaded}
			}
			if !slices.Equal(kinds, want) {
				t.Errorf("events %v, want %v", kinds, want)
			}
		})
	}
}

func TestSetLoseUnloadDuringLoad(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
		m.LoadLatency = 100 * time.Millisecond
	})}})
	s.SetLoseUnloadDuringLoad(false)
	done := make(chan result, 1)
	go func() { done <- generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"}) }()
	waitFor(t, s, time.Second, "loading", func() bool { r, ok := runner(s, "tiny:latest"); return ok && r.Loading })
	unload(t, c, "tiny")
	<-done
	waitFor(t, s, time.Second, "removal", func() bool { return !s.Listed("tiny") })
}

func TestUnloadWhileRequestInFlight(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
		m.Chunks = 10
		m.TokenLatency = 20 * time.Millisecond
	})}})
	done := make(chan result, 1)
	go func() { done <- generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"}) }()
	if err := s.WaitInFlight(t.Context(), "tiny", 1); err != nil {
		t.Fatal(err)
	}

	unload(t, c, "tiny")
	time.Sleep(50 * time.Millisecond) // longer than UnloadDelay
	m, ok := ps(t, c, "tiny:latest")
	if !ok {
		t.Fatal("model gone while a request still holds it")
	}
	if !m.ExpiresAt.Before(time.Now()) {
		t.Errorf("expires_at %v, want in the past", m.ExpiresAt)
	}
	if res := <-done; res.err != nil || res.final == nil {
		t.Fatalf("in-flight request: %v, final %v", res.err, res.final)
	}
	waitFor(t, s, time.Second, "removal", func() bool { return !s.Listed("tiny") })
}

func TestClientCancel(t *testing.T) {
	t.Run("mid-stream", func(t *testing.T) {
		s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
			m.Chunks = 100
			m.TokenLatency = 5 * time.Millisecond
		})}})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var n int
		err := c.Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: "p", KeepAlive: keepAlive(0)},
			func(api.GenerateResponse) error {
				if n++; n == 2 {
					cancel()
				}
				return nil
			})
		t.Logf("Generate after cancel returned %v", err) // often nil: the client's trap 1
		waitFor(t, s, time.Second, "cancel counted", func() bool { return s.Cancelled("tiny") == 1 })
		// The reference is dropped, so keep_alive 0 unloads the model.
		waitFor(t, s, time.Second, "unload", func() bool { return !s.Listed("tiny") })
		if s.InFlight("tiny") != 0 {
			t.Errorf("InFlight = %d, want 0", s.InFlight("tiny"))
		}
	})
	t.Run("during load", func(t *testing.T) {
		s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
			m.LoadLatency = 100 * time.Millisecond
		})}})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancel()
		res := generate(ctx, c, &api.GenerateRequest{Model: "tiny", Prompt: "p"})
		if res.err == nil {
			t.Fatal("request cancelled during load succeeded")
		}
		waitFor(t, s, time.Second, "cancel counted", func() bool { return s.Cancelled("tiny") == 1 })
		// The load still finishes, and then, like Ollama 0.17.4 (measured),
		// the abandoned runner is dropped: it is never listed.
		waitFor(t, s, time.Second, "load finished", func() bool { return s.Loads("tiny") == 1 })
		if s.Listed("tiny") || len(s.Running()) != 0 {
			t.Errorf("abandoned load still resident: %+v", s.Running())
		}
	})
}

func TestNotFoundAndBadRequest(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny()}})

	t.Run("generate 404", func(t *testing.T) {
		res := generate(t.Context(), c, &api.GenerateRequest{Model: "nope", Prompt: "p"})
		se := statusError(t, res.err)
		if se.StatusCode != 404 || se.ErrorMessage != "model 'nope' not found" {
			t.Errorf("got %+v", se)
		}
	})
	t.Run("chat 404", func(t *testing.T) {
		err := c.Chat(t.Context(), &api.ChatRequest{Model: "nope", Messages: []api.Message{{Role: "user", Content: "x"}}},
			func(api.ChatResponse) error { return nil })
		if se := statusError(t, err); se.StatusCode != 404 {
			t.Errorf("got %+v", se)
		}
	})
	t.Run("chat without model", func(t *testing.T) {
		err := c.Chat(t.Context(), &api.ChatRequest{Messages: []api.Message{{Role: "user", Content: "x"}}},
			func(api.ChatResponse) error { return nil })
		if se := statusError(t, err); se.StatusCode != 400 || se.ErrorMessage != "model is required" {
			t.Errorf("got %+v", se)
		}
	})
	t.Run("show 404", func(t *testing.T) {
		_, err := c.Show(t.Context(), &api.ShowRequest{Model: "nope"})
		if se := statusError(t, err); se.StatusCode != 404 || se.ErrorMessage != "model 'nope' not found" {
			t.Errorf("got %+v", se)
		}
	})

	post := func(t *testing.T, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL().JoinPath("/api/generate").String(), strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		http.DefaultClient.CloseIdleConnections()
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	tests := []struct {
		name, body string
		code       int
		want       string
	}{
		{"keep_alive string without unit", `{"model":"tiny","prompt":"p","keep_alive":"300"}`, 400, `{"error":"time: missing unit in duration \"300\""}`},
		{"missing body", ``, 400, `{"error":"missing request body"}`},
		{"keep_alive number is seconds", `{"model":"tiny","prompt":"","keep_alive":300}`, 200, `"done_reason":"load"`},
		{"keep_alive string zero unloads", `{"model":"tiny","prompt":"","keep_alive":"0"}`, 200, `"done_reason":"unload"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, tt.body)
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Errorf("got %d %s, want %d containing %s", code, body, tt.code, tt.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "tiny"},
		{Name: "user/foo:q4"},
		{Name: "library/bar:7b"},
	}})
	if err := s.AddModel(vramguardtest.ModelConfig{Name: "tiny:latest"}); err == nil {
		t.Error("AddModel accepted a duplicate")
	}
	list, err := c.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list.Models {
		names = append(names, m.Name)
	}
	// Like Ollama's DisplayShortest: the default "library/" namespace is dropped.
	if got := strings.Join(names, ","); !sameSet(got, "tiny:latest,user/foo:q4,bar:7b") {
		t.Errorf("tags = %s", got)
	}
	for _, req := range []string{"TINY", "user/foo:q4", "bar:7b", "library/bar:7b", "registry.ollama.ai/library/bar:7b"} {
		mustGenerate(t, c, &api.GenerateRequest{Model: req, Prompt: "p"})
	}
	resp, err := c.ListRunning(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	names = nil
	for _, m := range resp.Models {
		names = append(names, m.Model)
	}
	if got := strings.Join(names, ","); !sameSet(got, "tiny:latest,user/foo:q4,bar:7b") {
		t.Errorf("ps = %s", got)
	}
	if s.Loads("") != 3 {
		t.Errorf("Loads = %d, want 3", s.Loads(""))
	}
}

func sameSet(a, b string) bool {
	as, bs := strings.Split(a, ","), strings.Split(b, ",")
	if len(as) != len(bs) {
		return false
	}
	seen := map[string]int{}
	for _, x := range as {
		seen[x]++
	}
	for _, x := range bs {
		if seen[x]--; seen[x] < 0 {
			return false
		}
	}
	return true
}

func TestMiscEndpoints(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) { m.Thinking = true })}})

	if err := c.Heartbeat(t.Context()); err != nil {
		t.Errorf("Heartbeat: %v", err)
	}
	if v, err := c.Version(t.Context()); err != nil || v != vramguardtest.DefaultVersion {
		t.Errorf("Version = %q, %v", v, err)
	}
	show, err := c.Show(t.Context(), &api.ShowRequest{Model: "tiny"})
	if err != nil || show.Details.Family != "llama" || len(show.Capabilities) != 2 {
		t.Errorf("Show = %+v, %v", show, err)
	}
}

func TestThinking(t *testing.T) {
	_, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		tiny(func(m *vramguardtest.ModelConfig) { m.Thinking = true }),
		{Name: "plain", Chunks: 2},
	}})
	chat := func(model string, think *api.ThinkValue) (thinking, content string, err error) {
		err = c.Chat(t.Context(), &api.ChatRequest{Model: model, Think: think, Messages: []api.Message{{Role: "user", Content: "q"}}},
			func(r api.ChatResponse) error {
				thinking += r.Message.Thinking
				content += r.Message.Content
				return nil
			})
		return thinking, content, err
	}
	if th, ct, err := chat("tiny", nil); err != nil || th == "" || ct == "" {
		t.Errorf("thinking model: thinking %q, content %q, %v", th, ct, err)
	}
	if th, _, err := chat("tiny", &api.ThinkValue{Value: false}); err != nil || th != "" {
		t.Errorf("think false: thinking %q, %v", th, err)
	}
	if _, _, err := chat("plain", &api.ThinkValue{Value: true}); statusError(t, err).StatusCode != 400 {
		t.Errorf("think on a plain model: %v, want 400", err)
	}
}

func TestPSDelay(t *testing.T) {
	s, c := start(t, vramguardtest.Config{})
	s.SetPSDelay(80 * time.Millisecond)
	begin := time.Now()
	if _, err := c.ListRunning(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d < 80*time.Millisecond {
		t.Errorf("/api/ps answered in %v, want >= 80ms", d)
	}
}

func TestCloseCutsRequestsShort(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(func(m *vramguardtest.ModelConfig) {
		m.LoadLatency = time.Hour
	})}})
	c := s.APIClient()
	done := make(chan result, 1)
	go func() { done <- generate(context.Background(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p"}) }()
	waitFor(t, s, time.Second, "loading", func() bool { _, ok := runner(s, "tiny:latest"); return ok })
	s.Close()
	s.Close() // idempotent
	if res := <-done; res.final != nil {
		t.Error("request completed after Close")
	}
}

// KillRunner kills a loaded model's runner: it stays listed, dead, its
// memory is freed, and the next request loads it again. A model that is
// not loaded has nothing to kill.
func TestKillRunner(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", SizeVRAM: 1 << 20}}})
	defer s.Close()
	if s.KillRunner("tiny") {
		t.Fatal("KillRunner of a model that is not loaded reported a kill")
	}
	simGen(t, s, "tiny", &api.Duration{Duration: time.Hour})
	if !s.KillRunner("tiny") {
		t.Fatal("KillRunner of a loaded model reported none")
	}
	if !s.Listed("tiny") || len(s.Holders()) != 0 {
		t.Errorf("after the kill: listed %v, holders %v; want listed, no memory held", s.Listed("tiny"), s.Holders())
	}
	if s.KillRunner("tiny") {
		t.Error("a dead runner was killed twice")
	}
	simGen(t, s, "tiny", &api.Duration{Duration: time.Hour})
	if got := s.Loads("tiny"); got != 2 {
		t.Errorf("loads %d, want 2: the request after the kill reloads", got)
	}
}

// Restart cuts the requests in flight and leaves nothing loaded; the
// models stay registered.
func TestRestart(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", TokenLatency: 50 * time.Millisecond, Chunks: 100}}})
	defer s.Close()
	simGen(t, s, "tiny", &api.Duration{Duration: time.Hour})
	errc := make(chan error, 1)
	go func() {
		errc <- s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "x"}, func(api.GenerateResponse) error { return nil })
	}()
	if err := s.WaitInFlight(t.Context(), "tiny", 1); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("the request in flight ended well across the restart; want it cut")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request in flight still runs 5 s after the restart")
	}
	if err := s.WaitFor(t.Context(), func() bool { return !s.Listed("tiny") && len(s.Running()) == 0 }); err != nil {
		t.Fatalf("after the restart: running %+v", s.Running())
	}
	simGen(t, s, "tiny", &api.Duration{Duration: 0})
}

// simGen runs one short generation with keepAlive and fails the test if it
// fails.
func simGen(t *testing.T, s *vramguardtest.Server, model string, keepAlive *api.Duration) {
	t.Helper()
	err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: model, Prompt: "x", KeepAlive: keepAlive,
		Options: map[string]any{"num_predict": 2}}, func(api.GenerateResponse) error { return nil })
	if err != nil {
		t.Fatalf("generate %s: %v", model, err)
	}
}

// Events records what arrived with its keep-alive and what the scheduler
// did, per model and across models, oldest first.
func TestEvents(t *testing.T) {
	s, c := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{tiny(), tiny(func(m *vramguardtest.ModelConfig) { m.Name = "other" })}})
	hour := &api.Duration{Duration: time.Hour}
	if res := generate(t.Context(), c, &api.GenerateRequest{Model: "tiny", Prompt: "p", KeepAlive: hour}); res.err != nil {
		t.Fatal(res.err)
	}
	if err := c.Chat(t.Context(), &api.ChatRequest{Model: "other", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(api.ChatResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	unload(t, c, "tiny")
	waitFor(t, s, time.Second, "removal", func() bool { return !s.Listed("tiny") })

	type got struct {
		kind     vramguardtest.EventKind
		model    string
		endpoint string
		ka       string
	}
	var all []got
	for _, ev := range s.Events("") {
		ka := "none"
		if ev.KeepAlive != nil {
			ka = ev.KeepAlive.String()
		}
		all = append(all, got{ev.Kind, ev.Model, ev.Endpoint, ka})
	}
	want := []got{
		{vramguardtest.EventRequest, "tiny:latest", "generate", "1h0m0s"},
		{vramguardtest.EventLoaded, "tiny:latest", "", "none"},
		{vramguardtest.EventRequest, "other:latest", "chat", "none"},
		{vramguardtest.EventLoaded, "other:latest", "", "none"},
		{vramguardtest.EventUnloadRequest, "tiny:latest", "generate", "0s"},
		{vramguardtest.EventUnloaded, "tiny:latest", "", "none"},
	}
	if !slices.Equal(all, want) {
		t.Errorf("events\n%v\nwant\n%v", all, want)
	}
	if n := len(s.Events("other")); n != 2 {
		t.Errorf("%d events for other, want 2", n)
	}
	if evs := s.Events("no-such-model"); evs != nil {
		t.Errorf("events of an unknown model: %v", evs)
	}
}
