package vramguard_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

// gateStandIn stands at a client's address in front of the simulator as
// cmd/vramgate does (its real self is tested in cmd/vramgate and, on real
// servers, in the integration suite): it forwards everything, and answers
// an unload request (keep_alive 0, no prompt) once the simulator has
// unloaded the model (unless keep: a gate that says what it did not do),
// with answer(model) as its "vramgate" object (none when nil) and header
// as X-Vramgate-Unload.
func gateStandIn(t *testing.T, sim *vramguardtest.Server, answer func(model string) map[string]any, header string, keep bool) *httptest.Server {
	t.Helper()
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(sim.URL()) }}
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		var q struct {
			Model     string        `json:"model"`
			Prompt    string        `json:"prompt"`
			KeepAlive *api.Duration `json:"keep_alive"`
		}
		_ = json.Unmarshal(body, &q)
		if r.URL.Path != "/api/generate" || q.KeepAlive == nil || q.KeepAlive.Duration != 0 || q.Prompt != "" {
			r.Body = io.NopCloser(bytes.NewReader(body))
			proxy.ServeHTTP(w, r)
			return
		}
		if keep {
			// Says it verified, unloads nothing.
		} else if err := sim.APIClient().Generate(r.Context(), &api.GenerateRequest{Model: q.Model, KeepAlive: &api.Duration{}},
			func(api.GenerateResponse) error { return nil }); err != nil {
			http.Error(w, `{"error":"unload failed"}`, http.StatusBadGateway)
			return
		}
		for !keep && sim.Listed(q.Model) && r.Context().Err() == nil {
			time.Sleep(time.Millisecond) // the simulator may remove the model after it replied
		}
		reply := map[string]any{"model": q.Model, "done": true, "done_reason": "unload", "response": ""}
		if answer != nil {
			reply["vramgate"] = answer(q.Model)
		}
		if header != "" {
			w.Header().Set("X-Vramgate-Unload", header)
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_ = json.NewEncoder(w).Encode(reply)
	}))
	t.Cleanup(gate.Close)
	return gate
}

// A client whose address is a vramgate takes the gate's verified answer to
// its unload request: the runner check the gate made is in Checked and
// RunnerCheckBy names the gate; an answer without one (or one that is not
// verified, not readable, or for another model) leaves the verdict to
// /api/ps, and NoRunnerCheck says what the gate said. On a caller's
// api.Client the gate's answer cannot be read, and nothing claims it.
func TestUnloadBehindAGate(t *testing.T) {
	verified := func(checked, noRunner string) func(string) map[string]any {
		return func(m string) map[string]any {
			return map[string]any{"model": m, "was_loaded": true, "verified": true, "checked": checked, "no_runner_check": noRunner,
				"attempts": 1, "elapsed_ms": 12.5, "runner_seen": true}
		}
	}
	tests := []struct {
		name      string
		answer    func(string) map[string]any
		header    string
		ownAPI    bool // the client runs on a caller's api.Client
		checked   Checks
		by        string // RunnerCheckBy, with ADDR for the gate's host:port
		noRunner  string // a part of NoRunnerCheck, with ADDR
		runnerSaw bool
	}{
		{name: "verified with the gate's runner check", answer: verified("ps+runner-processes", ""), header: "verified; checked=ps+runner-processes",
			checked: CheckPS | CheckRunnerProcesses, by: "vramgate at ADDR", runnerSaw: true},
		{name: "a gate behind a gate", answer: func(m string) map[string]any {
			a := verified("ps+runner-processes", "")(m)
			a["runner_check_by"] = "vramgate at 10.0.0.2:11434"
			return a
		}, checked: CheckPS | CheckRunnerProcesses, by: "vramgate at ADDR, which took it from vramgate at 10.0.0.2:11434", runnerSaw: true},
		{name: "verified by the gate's /api/ps alone", answer: verified("ps", "remote server http://gpu-box:11434"),
			checked: CheckPS, noRunner: "vramgate at ADDR made no runner check: remote server http://gpu-box:11434"},
		{name: "the gate says it did not verify", answer: func(m string) map[string]any {
			return map[string]any{"model": m, "verified": false, "checked": "none"}
		}, header: "not verified", checked: CheckPS, noRunner: `vramgate at ADDR did not verify the unload (X-Vramgate-Unload: "not verified")`},
		{name: "an answer for another model", answer: func(string) map[string]any {
			return map[string]any{"model": "small", "verified": true, "checked": "ps+runner-processes"}
		}, checked: CheckPS, noRunner: `vramgate at ADDR answered the unload of "tiny" for model "small"`},
		{name: "a header and no object", header: "verified; checked=ps+runner-processes", checked: CheckPS,
			noRunner: "vramgate at ADDR answered the unload without a readable vramgate object"},
		{name: "a malformed object", answer: func(string) map[string]any { return map[string]any{"verified": "yes"} }, header: "verified",
			checked: CheckPS, noRunner: "without a readable vramgate object"},
		{name: "on a caller's api.Client the answer is not read", answer: verified("ps+runner-processes", ""), ownAPI: true, checked: CheckPS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sim := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Size: 1 << 30}, vramguardtest.ModelConfig{Name: "small", Size: 1 << 30})
			gate := gateStandIn(t, sim, tt.answer, tt.header, false)
			opts := Options{}
			if tt.ownAPI {
				u, err := url.Parse(gate.URL)
				if err != nil {
					t.Fatal(err)
				}
				opts.API = api.NewClient(u, gate.Client())
			}
			c := newClientAt(t, gate.URL, opts)
			if err := sim.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "hi"}, func(api.GenerateResponse) error { return nil }); err != nil {
				t.Fatal(err)
			}
			rep, err := c.UnloadModel(t.Context(), "tiny")
			if err != nil {
				t.Fatalf("UnloadModel: %v", err)
			}
			addr := strings.TrimPrefix(gate.URL, "http://")
			by := strings.ReplaceAll(tt.by, "ADDR", addr)
			t.Logf("checked %v, by %q, no runner check %q, runner seen %v", rep.Checked, rep.RunnerCheckBy, rep.NoRunnerCheck, rep.RunnerSeen)
			if !rep.Verified || rep.Checked != tt.checked || rep.RunnerCheckBy != by || rep.RunnerSeen != tt.runnerSaw {
				t.Errorf("report %+v; want verified, checked %v, RunnerCheckBy %q, RunnerSeen %v", rep, tt.checked, by, tt.runnerSaw)
			}
			if rep.Checked&CheckRunnerProcesses == 0 && rep.NoRunnerCheck == "" {
				t.Errorf("no runner check and no reason: %+v", rep)
			}
			if want := strings.ReplaceAll(tt.noRunner, "ADDR", addr); !strings.Contains(rep.NoRunnerCheck, want) {
				t.Errorf("NoRunnerCheck %q, want it to contain %q", rep.NoRunnerCheck, want)
			}
			if tt.ownAPI && strings.Contains(rep.NoRunnerCheck, "vramgate") {
				t.Errorf("on a caller's api.Client the report claims to know the gate: %q", rep.NoRunnerCheck)
			}
			if sim.Listed("tiny") {
				t.Error("tiny is listed after a verified unload")
			}
		})
	}
}

// A gate's word alone verifies nothing: one that says it verified the
// unload with its runner check while the model stays listed (with its
// keep-alive) gets the unload again at every listing, and the unload
// times out unverified; the report claims no check.
func TestUnloadBehindAGateThatSaysWhatItDidNotDo(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Size: 1 << 30})
	gate := gateStandIn(t, sim, func(m string) map[string]any {
		return map[string]any{"model": m, "verified": true, "checked": "ps+runner-processes"}
	}, "verified; checked=ps+runner-processes", true)
	c := newClientAt(t, gate.URL, Options{UnloadTimeout: 300 * time.Millisecond})
	if err := sim.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "hi"}, func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	rep, err := c.UnloadModel(t.Context(), "tiny")
	if !errors.Is(err, KindTimeout) || !errors.Is(err, ErrStillResident) {
		t.Fatalf("UnloadModel behind a gate that unloads nothing: %v, want KindTimeout wrapping ErrStillResident", err)
	}
	t.Logf("%v; attempts %d, polls %d", err, rep.Attempts, rep.Polls)
	if rep.Verified || rep.Checked != 0 || rep.RunnerCheckBy != "" || rep.Attempts < 2 || !sim.Listed("tiny") {
		t.Errorf("report %+v; want unverified, no checks, the unload sent again (tiny listed: %v)", rep, sim.Listed("tiny"))
	}
}
