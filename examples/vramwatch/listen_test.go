package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// endpoints serves -listen's handler for s: a watcher as run builds it,
// with the case's GPU reader and procfs tree.
func endpoints(t *testing.T, s *vramguardtest.Server, g gpuKind, procRoot string) *httptest.Server {
	t.Helper()
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := client.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	w := &watcher{ollama: client, host: s.URL().String(), timeout: 5 * time.Second, procRoot: procRoot}
	w.gpu, w.gpuErr = g.open(s)(t.Context())
	h, stop, err := newEndpoints(w)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return hs
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

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
		procs   []fakeProc // nil: an empty tree (no server visible)
		down    bool
		query   string
		code    int
		check   func(t *testing.T, r *readiness)
		reasons []string // texts the reasons must contain, in order
	}{
		{
			name: "resident, verified", loaded: []string{"tiny"}, procs: procOne, query: "model=tiny", code: 200,
			check: func(t *testing.T, r *readiness) {
				m := r.Model
				if m == nil || m.Name != "tiny:latest" || m.State != stateResident || !m.Verified || m.Checked != "ps+runner-processes" ||
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
			check: func(t *testing.T, r *readiness) {
				if m := r.Model; m.State != stateAbsent || !m.Verified || m.ExpiresAt != nil || m.SizeVRAM != nil {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"/api/ps does not list small:latest"},
		},
		{
			// Ollama lists a model only once it is loaded; its runner
			// shows from the start.
			name: "loading", loaded: []string{"tiny"}, procs: append(slices.Clip(procOne), smallRunner), query: "model=small", code: 503,
			check: func(t *testing.T, r *readiness) {
				if m := r.Model; m.State != stateLoading || !m.Verified || !slices.Equal(m.RunnerPIDs, []uint32{4002}) {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"small:latest is loading: runner 4002 serves its weights"},
		},
		{
			name: "listed, runner gone", loaded: []string{"tiny"}, procs: serverOnly, query: "model=tiny", code: 503,
			check: func(t *testing.T, r *readiness) {
				if m := r.Model; m.State != stateResident || m.Verified || m.Checked != "ps+runner-processes" {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"/api/ps lists tiny:latest but no live runner process serves its weights"},
		},
		{
			name: "runner of a dead server", loaded: []string{"tiny"}, query: "model=tiny", code: 503,
			procs: []fakeProc{procInit, procServer, {pid: 3999, ppid: 1, comm: "llama-server", args: tinyRunner.args}},
			check: func(t *testing.T, r *readiness) {
				if m := r.Model; m.State != stateResident || m.Verified || len(m.RunnerPIDs) != 0 {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"no live runner process"},
		},
		{
			// The fake's runners are no processes: only /api/ps is asked,
			// and the answer says so.
			name: "no server process visible", loaded: []string{"tiny"}, query: "model=tiny", code: 200,
			check: func(t *testing.T, r *readiness) {
				if m := r.Model; m.State != stateResident || m.Verified || m.Checked != "ps" || m.NoRunnerCheck != "no Ollama server process visible on this machine" {
					t.Errorf("model %+v", m)
				}
			},
		},
		{
			name: "unknown model", procs: serverOnly, query: "model=nope", code: 503,
			check: func(t *testing.T, r *readiness) {
				if m := r.Model; m.State != stateAbsent || m.Verified || m.NoRunnerCheck != "model not found" {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"nope:latest: model not found on the server"},
		},
		{
			name: "Ollama down", down: true, query: "model=tiny", code: 503,
			check: func(t *testing.T, r *readiness) {
				if m := r.Model; m.State != stateUnknown || m.Checked != "none" {
					t.Errorf("model %+v", m)
				}
			},
			reasons: []string{"Ollama at "},
		},
		{
			name: "free enough", reserve: 6 * gib, query: "free=" + itoa(16*gib), code: 200,
			check: func(t *testing.T, r *readiness) {
				d := r.Device
				if d == nil || d.Index != 0 || d.Free == nil || *d.Free != 18*gib || *d.Total != 24*gib || d.Need != 16*gib || !d.Enough ||
					len(d.Holders) != 1 || d.Holders[0] != (holder{Kind: "other", Name: "comfyui", PID: d.Holders[0].PID, Bytes: 6 * gib}) {
					t.Errorf("device %+v", d)
				}
			},
		},
		{
			name: "free too big, holders named", loaded: []string{"tiny", "small"}, gpu: gpuNamed, procs: procOne,
			query: "model=tiny&free=" + itoa(12*gib), code: 503,
			check: func(t *testing.T, r *readiness) {
				if !r.Model.Verified || r.Model.State != stateResident {
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
			check: func(t *testing.T, r *readiness) {
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
			hs := endpoints(t, s, tt.gpu, procTree(t, tt.procs...))
			if tt.down {
				s.Close()
			}
			code, body := get(t, hs.URL+"/ready?"+tt.query)
			if code != tt.code {
				t.Errorf("status %d, want %d; body %s", code, tt.code, body)
			}
			var r readiness
			if err := json.Unmarshal([]byte(body), &r); err != nil {
				t.Fatalf("body %q: %v", body, err)
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
		})
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

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
		})
	}
	if code, _ := get(t, hs.URL+"/nothing"); code != 404 {
		t.Errorf("GET /nothing: %d, want 404", code)
	}
}

func TestMetrics(t *testing.T) {
	s := newSim(t, "tiny")
	if err := s.Reserve("comfyui", 6*gib); err != nil {
		t.Fatal(err)
	}
	hs := endpoints(t, s, gpuSim, procTree(t, procAll...))
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

// The whole command: -listen serves until the signal (ctx), then shuts
// down and exits 0.
func TestListen(t *testing.T) {
	s := newSim(t, "tiny")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	up := make(chan struct{})
	var once sync.Once
	stderr := &safeBuffer{onWrite: func(int) { once.Do(func() { close(up) }) }}
	c := &cmd{stdout: &safeBuffer{}, stderr: stderr, getenv: func(string) string { return "" }, procRoot: t.TempDir()}
	exit := make(chan int, 1)
	go func() {
		exit <- c.main(ctx, []string{"-host", s.URL().String(), "-listen", "127.0.0.1:0", "-gpu=false"})
	}()
	select {
	case <-up:
	case code := <-exit:
		t.Fatalf("exit %d before serving: %s", code, stderr.String())
	}
	m := regexp.MustCompile(`^vramwatch: serving (http://127\.0\.0\.1:\d+)/metrics and /ready\n$`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("stderr %q", stderr.String())
	}
	if code, body := get(t, m[1]+"/ready?model=tiny"); code != 200 || !strings.Contains(body, `"state": "resident"`) {
		t.Errorf("/ready?model=tiny: %d %s", code, body)
	}
	if code, body := get(t, m[1]+"/ready?free=1"); code != 503 || !strings.Contains(body, "no GPU reader: device memory not measured") {
		t.Errorf("/ready?free=1 without a GPU reader: %d %s", code, body)
	}
	if code, body := get(t, m[1]+"/metrics"); code != 200 || !strings.Contains(body, "vramguard_model_resident{") || strings.Contains(body, "vramguard_device_memory_bytes") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	cancel() // SIGTERM
	if code := <-exit; code != 0 {
		t.Errorf("exit %d after the signal, want 0; stderr %q", code, stderr.String())
	}
	if _, err := http.Get(m[1] + "/ready"); err == nil {
		t.Error("still serving after the signal")
	}
	if out := c.stdout.(*safeBuffer).String(); out != "" {
		t.Errorf("stdout %q, want nothing", out)
	}
}

func TestIsLocal(t *testing.T) {
	for host, want := range map[string]bool{
		"http://127.0.0.1:11434": true, "127.0.0.1:11434": true, "localhost": true, "http://[::1]:11434": true,
		"0.0.0.0:11434": true, "gpu.localhost": true, "http://gpu-box:11434": false, "10.0.0.5": false, "https://ollama.com": false,
	} {
		if got := isLocal(host); got != want {
			t.Errorf("isLocal(%q) = %v, want %v", host, got, want)
		}
	}
}
