package probe_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/probe"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestReady(t *testing.T) {
	// tiny's runner, live; small's, loading (its server lists nothing yet).
	tinyRunner := fakeProc{pid: 4001, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", blobPath(hexTiny), "--port", "40125"}}
	smallRunner := fakeProc{pid: 4002, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", blobPath(hexSmall), "--port", "40126"}}
	serverOnly := []fakeProc{procInit, procServer}
	tests := []struct {
		name    string
		loaded  []string
		reserve uint64
		gpu     gpuKind
		procs   []fakeProc // nil: an empty tree (nothing listens at the simulator's port)
		down    bool
		query   string
		code    int
		check   func(t *testing.T, r *probe.Readiness)
		reasons []string // texts the reasons must contain, in order
	}{
		{
			name: "resident, verified", loaded: []string{"tiny"}, procs: procOne, query: "model=tiny", code: 200,
			check: func(t *testing.T, r *probe.Readiness) {
				m := r.Model
				if m == nil || m.Name != "tiny:latest" || m.State != probe.StateResident || !m.Verified || m.Checked != "ps+runner-processes" ||
					!slices.Equal(m.RunnerPIDs, []uint32{4001}) || m.SizeVRAM == nil || *m.SizeVRAM != 2*gib || m.ExpiresAt == nil || m.NoRunnerCheck != "" {
					t.Errorf("model %+v", m)
				}
				if r.Device != nil || len(r.Reasons) != 0 {
					t.Errorf("device %+v, reasons %q; want neither", r.Device, r.Reasons)
				}
			},
		},
		{
			name: "absent, verified", procs: serverOnly, query: "model=small", code: 503,
			check: func(t *testing.T, r *probe.Readiness) {
				if m := r.Model; m.State != probe.StateAbsent || !m.Verified || m.ExpiresAt != nil || m.SizeVRAM != nil {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"/api/ps does not list small:latest"},
		},
		{
			// Ollama lists a model only once it is loaded; its runner
			// shows from the start.
			name: "loading", loaded: []string{"tiny"}, procs: append(slices.Clip(procOne), smallRunner), query: "model=small", code: 503,
			check: func(t *testing.T, r *probe.Readiness) {
				if m := r.Model; m.State != probe.StateLoading || !m.Verified || !slices.Equal(m.RunnerPIDs, []uint32{4002}) {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"small:latest is loading: runner 4002 serves its weights"},
		},
		{
			name: "listed, runner gone", loaded: []string{"tiny"}, procs: serverOnly, query: "model=tiny", code: 503,
			check: func(t *testing.T, r *probe.Readiness) {
				if m := r.Model; m.State != probe.StateResident || m.Verified || m.Checked != "ps+runner-processes" {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"/api/ps lists tiny:latest but no live runner process serves its weights"},
		},
		{
			name: "runner of a dead server", loaded: []string{"tiny"}, query: "model=tiny", code: 503,
			procs: []fakeProc{procInit, procServer, {pid: 3999, ppid: 1, comm: "llama-server", args: tinyRunner.args}},
			check: func(t *testing.T, r *probe.Readiness) {
				if m := r.Model; m.State != probe.StateResident || m.Verified || len(m.RunnerPIDs) != 0 {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"no live runner process"},
		},
		{
			// The fake's runners are no processes, and what listens at its
			// port is this test binary: only /api/ps is asked, and the
			// answer says so.
			name: "no server process visible", loaded: []string{"tiny"}, query: "model=tiny", code: 200,
			procs: []fakeProc{procInit, {pid: 777, ppid: 1, comm: "probe.test", args: []string{"/tmp/probe.test"}, listen: atSim}},
			check: func(t *testing.T, r *probe.Readiness) {
				if m := r.Model; m.State != probe.StateResident || m.Verified || m.Checked != "ps" ||
					!strings.HasPrefix(m.NoRunnerCheck, "no ollama serve process visible on this machine listens on port ") {
					t.Errorf("model %+v", m)
				}
			},
		},
		{
			name: "unknown model", procs: serverOnly, query: "model=nope", code: 503,
			check: func(t *testing.T, r *probe.Readiness) {
				if m := r.Model; m.State != probe.StateAbsent || m.Verified || m.NoRunnerCheck != "model not found" {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"nope:latest: model not found on the server"},
		},
		{
			name: "Ollama down", down: true, query: "model=tiny", code: 503,
			check: func(t *testing.T, r *probe.Readiness) {
				if m := r.Model; m.State != probe.StateUnknown || m.Checked != "none" {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"Ollama at "},
		},
		{
			name: "free enough", reserve: 6 * gib, query: "free=" + itoa(16*gib), code: 200,
			check: func(t *testing.T, r *probe.Readiness) {
				d := r.Device
				if d == nil || d.Index != 0 || d.Free == nil || *d.Free != 18*gib || *d.Total != 24*gib || d.Need != 16*gib || !d.Enough ||
					len(d.Holders) != 1 || d.Holders[0] != (probe.Holder{Kind: "other", Name: "comfyui", PID: d.Holders[0].PID, Bytes: 6 * gib}) {
					t.Errorf("device %+v", d)
				}
			},
		},
		{
			name: "free too big, holders named", loaded: []string{"tiny", "small"}, gpu: gpuNamed, procs: procOne,
			query: "model=tiny&free=" + itoa(12*gib), code: 503,
			check: func(t *testing.T, r *probe.Readiness) {
				if !r.Model.Verified || r.Model.State != probe.StateResident {
					t.Errorf("model %+v: want resident, verified", r.Model)
				}
				d := r.Device
				names := []string{}
				for _, h := range d.Holders {
					names = append(names, h.Kind+" "+h.Name)
				}
				if d.Enough || *d.Free >= 12*gib || !slices.Equal(names, []string{"runner small:latest", "runner tiny:latest", "other /usr/lib/ollama/llama-server --list-devices"}) {
					t.Errorf("device %+v, holders %q", d, names)
				}
			},
			reasons: []string{"device 0 has 10.7 GiB free of 16.0 GiB, 12.0 GiB needed; held by: runner small:latest (3.0 GiB), runner tiny:latest (2.0 GiB), other /usr/lib/ollama/llama-server --list-devices (300.0 MiB)"},
		},
		{
			name: "no GPU reader", gpu: gpuNone, query: "free=1", code: 503,
			check: func(t *testing.T, r *probe.Readiness) {
				if d := r.Device; d.Enough || d.Free != nil || d.Total != nil || d.Need != 1 {
					t.Errorf("device %+v: want nothing measured, not enough", d)
				}
			},
			reasons: []string{"no GPU reader: device memory not measured"},
		},
		{name: "no such device", query: "device=3", code: 503, reasons: []string{"no device 3 in the GPU reader's snapshot"}},
		{name: "device alone", query: "device=0", code: 200},
		{name: "nothing asked", code: 200},
		{name: "nothing asked, Ollama down", down: true, code: 503, reasons: []string{"Ollama at "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, tt.loaded...)
			if tt.reserve > 0 {
				if err := s.Reserve("comfyui", tt.reserve); err != nil {
					t.Fatal(err)
				}
			}
			h := newHandler(t, s, tt.gpu, procTree(t, simPort(t, s), tt.procs...))
			hs := httptest.NewServer(h)
			t.Cleanup(hs.Close)
			if tt.down {
				s.Close()
			}
			resp, err := http.Get(hs.URL + "/ready?" + tt.query)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.code {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.code)
			}
			if ct, cc := resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"); ct != "application/json" || cc != "no-store" {
				t.Errorf("Content-Type %q, Cache-Control %q; want application/json, no-store", ct, cc)
			}
			var r probe.Readiness
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
				t.Fatal(err)
			}
			if r.Ready != (tt.code == 200) || r.Reasons == nil || (r.Ready && len(r.Reasons) != 0) {
				t.Errorf("ready %v, reasons %q; want ready %v with reasons only when not", r.Ready, r.Reasons, tt.code == 200)
			}
			if len(r.Reasons) != len(tt.reasons) {
				t.Errorf("reasons %q, want %d", r.Reasons, len(tt.reasons))
			}
			for i, want := range tt.reasons {
				if i < len(r.Reasons) && !strings.Contains(r.Reasons[i], want) {
					t.Errorf("reason %d %q does not say %q", i, r.Reasons[i], want)
				}
			}
			if tt.check != nil {
				tt.check(t, &r)
			}

			// Handler.Ready gives a program the same answer.
			v, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			q, err := probe.ParseQuery(v)
			if err != nil {
				t.Fatalf("ParseQuery(%q): %v", tt.query, err)
			}
			direct, err := json.Marshal(h.Ready(t.Context(), q))
			if err != nil {
				t.Fatal(err)
			}
			served, err := json.Marshal(&r)
			if err != nil {
				t.Fatal(err)
			}
			if string(direct) != string(served) {
				t.Errorf("Ready = %s\nGET /ready = %s", direct, served)
			}
		})
	}
}

// The runner check of /ready is the check of the server at the client's
// address (issue #35, item 3, as for unloads): another `ollama serve` on
// this machine (another port, another user's, a container's) neither
// makes the check claimed nor lends its runners of the same weights.
func TestReadyServerAtPort(t *testing.T) {
	tinyArgs := []string{"/usr/lib/ollama/llama-server", "--model", blobPath(hexTiny), "--port", "40125"}
	// other: an `ollama serve` on another port, and its runner of tiny.
	other := func(port int) []fakeProc {
		return []fakeProc{
			{pid: 200, ppid: 1, comm: "ollama", args: []string{"/usr/bin/ollama", "serve"}, listen: port},
			{pid: 4002, ppid: 200, comm: "llama-server", args: tinyArgs},
		}
	}
	ownRunner := fakeProc{pid: 4001, ppid: 100, comm: "llama-server", args: tinyArgs}
	tests := []struct {
		name    string
		loaded  bool // tiny is loaded
		procs   func(port int) []fakeProc
		code    int
		state   string
		checked string
		// why is NoRunnerCheck, %d the simulator's port; "" when checked.
		why      string
		verified bool
		pids     []uint32
		reason   string // a reason must contain it; "" for none
	}{
		{
			name: "another server, nothing at the port", loaded: true,
			procs: func(port int) []fakeProc { return append([]fakeProc{procInit}, other(otherPort(port))...) },
			code:  200, state: probe.StateResident, checked: "ps",
			why: "nothing listens on port %d in this network namespace",
		},
		{
			name: "another server, the listener no ollama serve", loaded: true,
			procs: func(port int) []fakeProc {
				return append([]fakeProc{procInit, {pid: 777, ppid: 1, comm: "python3", args: []string{"python", "main.py"}, listen: atSim}}, other(otherPort(port))...)
			},
			code: 200, state: probe.StateResident, checked: "ps",
			why: "no ollama serve process visible on this machine listens on port %d (an in-process server, or one in a container or another PID namespace)",
		},
		{
			name: "another server's runner, listed", loaded: true,
			procs: func(port int) []fakeProc { return append([]fakeProc{procInit, procServer}, other(otherPort(port))...) },
			code:  503, state: probe.StateResident, checked: "ps+runner-processes",
			reason: "/api/ps lists tiny:latest but no live runner process serves its weights",
		},
		{
			name:  "another server's runner, not listed",
			procs: func(port int) []fakeProc { return append([]fakeProc{procInit, procServer}, other(otherPort(port))...) },
			code:  503, state: probe.StateAbsent, checked: "ps+runner-processes", verified: true,
			reason: "/api/ps does not list tiny:latest",
		},
		{
			name: "both servers run one", loaded: true,
			procs: func(port int) []fakeProc {
				return append([]fakeProc{procInit, procServer, ownRunner}, other(otherPort(port))...)
			},
			code: 200, state: probe.StateResident, checked: "ps+runner-processes", verified: true, pids: []uint32{4001},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s *vramguardtest.Server
			if tt.loaded {
				s = newSim(t, "tiny")
			} else {
				s = newSim(t)
			}
			port := simPort(t, s)
			hs := endpoints(t, s, gpuNone, procTree(t, port, tt.procs(port)...))
			code, body := get(t, hs.URL+"/ready?model=tiny")
			var r probe.Readiness
			if err := json.Unmarshal([]byte(body), &r); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			why := ""
			if tt.why != "" {
				why = fmt.Sprintf(tt.why, port)
			}
			m := r.Model
			if code != tt.code || m == nil || m.State != tt.state || m.Checked != tt.checked || m.NoRunnerCheck != why ||
				m.Verified != tt.verified || !slices.Equal(m.RunnerPIDs, tt.pids) {
				t.Errorf("%d %s\nwant %d, state %s, checked %s, no_runner_check %q, verified %v, runner_pids %v",
					code, body, tt.code, tt.state, tt.checked, why, tt.verified, tt.pids)
			}
			if tt.reason != "" && (len(r.Reasons) != 1 || !strings.Contains(r.Reasons[0], tt.reason)) {
				t.Errorf("reasons %q; want one that says %q", r.Reasons, tt.reason)
			}
		})
	}
}

// What keeps the runner check from being made is the answer's
// no_runner_check: the socket tables or the process table unreadable.
func TestReadyNoRunnerCheck(t *testing.T) {
	t.Run("no socket tables", func(t *testing.T) {
		s := newSim(t, "tiny")
		root := procTree(t, simPort(t, s), procOne...)
		if err := os.Remove(filepath.Join(root, "net", "tcp")); err != nil {
			t.Fatal(err)
		}
		m := newHandler(t, s, gpuNone, root).Ready(t.Context(), probe.Query{Model: "tiny"}).Model
		if m.Checked != "ps" || m.Verified || !strings.HasPrefix(m.NoRunnerCheck, "cannot read this machine's socket tables: ") {
			t.Errorf("model %+v; want checked ps, not verified, the socket tables unreadable", m)
		}
	})
	t.Run("process table unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads a directory whatever its mode")
		}
		s := newSim(t, "tiny")
		root := procTree(t, simPort(t, s), procOne...)
		// Its files can be opened, not listed.
		if err := os.Chmod(root, 0o311); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(root, 0o755) })
		m := newHandler(t, s, gpuNone, root).Ready(t.Context(), probe.Query{Model: "tiny"}).Model
		if m.Checked != "ps" || m.Verified || !strings.HasPrefix(m.NoRunnerCheck, "process table: ") {
			t.Errorf("model %+v; want checked ps, not verified, the process table unreadable", m)
		}
	})
}

func TestReadyBadQuery(t *testing.T) {
	s := newSim(t)
	hs := endpoints(t, s, gpuSim, t.TempDir())
	tests := []struct{ query, err string }{
		{"modle=tiny", `unknown parameter "modle" (want model, free, device)`},
		{"free=8GiB", `free="8GiB": want a number of bytes`},
		{"free=-1", `free="-1": want a number of bytes`},
		{"free=" + itoa(vramguard.MaxBytes+1), "want a number of bytes"},
		{"device=-1", `device="-1": want a device index (0, 1, ...)`},
		{"device=x", "want a device index"},
		{"model=", "model is empty"},
		{"model=a&model=b", "model given 2 times"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			resp, err := http.Get(hs.URL + "/ready?" + tt.query)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct{ Error string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 400 || !strings.Contains(body.Error, tt.err) || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("status %d, %s, error %q; want 400, JSON, %q", resp.StatusCode, resp.Header.Get("Content-Type"), body.Error, tt.err)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", cc)
			}

			// ParseQuery's error is typed, and its cause is the message
			// the body carries.
			v, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			_, err = probe.ParseQuery(v)
			var e *vramguard.Error
			if !errors.As(err, &e) || e.Kind != vramguard.KindInvalidInput || e.Err == nil || e.Err.Error() != body.Error {
				t.Errorf("ParseQuery(%q) = %v; want a KindInvalidInput *vramguard.Error whose cause says %q", tt.query, err, body.Error)
			}
		})
	}
	if code, _ := get(t, hs.URL+"/nothing"); code != 404 {
		t.Errorf("GET /nothing: %d, want 404", code)
	}
	for _, path := range []string{"/ready", "/metrics"} {
		resp, err := http.Post(hs.URL+path, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 {
			t.Errorf("POST %s: %d, want 405", path, resp.StatusCode)
		}
	}
}

func TestParseQuery(t *testing.T) {
	tests := []struct {
		query string
		want  probe.Query
	}{
		{"", probe.Query{}},
		{"model=+tiny+", probe.Query{Model: "tiny"}},
		{"free=0", probe.Query{HasFree: true}},
		{"free=" + itoa(vramguard.MaxBytes) + "&device=2&model=small", probe.Query{Model: "small", Free: vramguard.MaxBytes, HasFree: true, Device: 2, HasDevice: true}},
	}
	for _, tt := range tests {
		v, err := url.ParseQuery(tt.query)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := probe.ParseQuery(v); err != nil || got != tt.want {
			t.Errorf("ParseQuery(%q) = %+v, %v; want %+v", tt.query, got, err, tt.want)
		}
	}
}

func TestMetrics(t *testing.T) {
	s := newSim(t, "tiny")
	if err := s.Reserve("comfyui", 6*gib); err != nil {
		t.Fatal(err)
	}
	hs := endpoints(t, s, gpuSim, procTree(t, simPort(t, s), procAll...))
	code, body := get(t, hs.URL+"/metrics")
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	body = strings.ReplaceAll(body, s.URL().Host, "HOST")
	for _, l := range []string{
		`vramguard_model_resident{model="tiny:latest",server="HOST"} 1`,
		`vramguard_model_vram_bytes{model="tiny:latest",server="HOST"} 2.147483648e+09`,
		`vramguard_ollama_up{server="HOST"} 1`,
		`vramguard_device_reader_up 1`,
		`vramguard_device_memory_bytes{device="0",holder="comfyui",kind="other"} 6.442450944e+09`,
		`vramguard_device_memory_bytes{device="0",holder="",kind="free"} 1.7179869184e+10`,
		`vramguard_device_memory_bytes{device="0",holder="tiny:latest",kind="runner"} 2.147483648e+09`,
		`vramwatch_runner_processes{model="tiny:latest",server_gone="false"} 1`,
		`vramwatch_runner_processes{model="small:latest",server_gone="true"} 1`,
		`vramwatch_runner_processes{model="qwen3:latest",server_gone="false"} 1`,
		`vramwatch_runner_processes{model="",server_gone="false"} 1`,
	} {
		if !strings.Contains(body, "\n"+l+"\n") {
			t.Errorf("no line %s in:\n%s", l, body)
		}
	}
}

// A program's own collectors are served beside the built-in ones; Close
// ends the watch of the server (its gauges go, /ready stays), and a second
// Close does nothing.
func TestCollectorsAndClose(t *testing.T) {
	s := newSim(t, "tiny")
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	mine := prometheus.NewGauge(prometheus.GaugeOpts{Name: "mine_up", Help: "A program's own series."})
	mine.Set(1)
	h, err := probe.New(probe.Config{Client: client, ProcRoot: t.TempDir(), Collectors: []prometheus.Collector{mine}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	defer hs.Close()
	if h.Metrics() == nil {
		t.Fatal("Metrics() = nil")
	}
	_, body := get(t, hs.URL+"/metrics")
	for _, l := range []string{"\nmine_up 1\n", "\nvramguard_model_resident{"} {
		if !strings.Contains(body, l) {
			t.Errorf("no %q in:\n%s", l, body)
		}
	}
	if strings.Contains(body, "vramguard_device_") || strings.Contains(body, "vramwatch_runner_processes{") {
		t.Errorf("device or runner series without a GPU reader or runners:\n%s", body)
	}
	h.Close()
	h.Close()
	if _, body := get(t, hs.URL+"/metrics"); strings.Contains(body, "vramguard_model_resident{") || !strings.Contains(body, "\nmine_up 1\n") {
		t.Errorf("after Close, want no residency gauge and the program's own series:\n%s", body)
	}
	if code, body := get(t, hs.URL+"/ready?model=tiny"); code != 200 {
		t.Errorf("/ready after Close: %d %s", code, body)
	}
}

func TestNewInvalid(t *testing.T) {
	s := newSim(t)
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	dup := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vramwatch_runner_processes", Help: "A clash."})
	tests := []struct {
		name string
		cfg  probe.Config
		want string
	}{
		{"no client", probe.Config{}, "no client"},
		{"negative timeout", probe.Config{Client: client, Timeout: -time.Second}, "timeout -1s"},
		{"nil collector", probe.Config{Client: client, Collectors: []prometheus.Collector{nil}}, "collector 0 is nil"},
		{"duplicate series", probe.Config{Client: client, Collectors: []prometheus.Collector{dup}}, "collector 0: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := probe.New(tt.cfg)
			if h != nil || vramguard.KindOf(err) != vramguard.KindInvalidInput || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, %v; want a KindInvalidInput error saying %q", h, err, tt.want)
			}
		})
	}
}

// stuckReader answers no snapshot until ctx is done.
type stuckReader struct{}

func (stuckReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	<-ctx.Done()
	return nil, context.Cause(ctx)
}

// Config.Timeout bounds Ready's reads, under a ctx that has no deadline.
func TestReadyTimeout(t *testing.T) {
	s := newSim(t)
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	h, err := probe.New(probe.Config{Client: client, VRAM: stuckReader{}, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r := h.Ready(context.Background(), probe.Query{HasFree: true, Free: 1})
	if r.Ready || len(r.Reasons) != 1 || r.Reasons[0] != "GPU snapshot failed: context deadline exceeded" {
		t.Errorf("Ready = %+v; want the snapshot's deadline as the reason", r)
	}
}
