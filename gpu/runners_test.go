package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

const (
	runHexA = "6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	runHexB = "e8ad13eff07a78d89926e9e8b882317d082ef5bf9768ad7b50fcdbbcd63748de"
	runHexC = "0c9d4b2e1f5a6d7e8f90123456789abcdef0123456789abcdef0123456789ab0"
	blobA   = "sha256:" + runHexA
	blobB   = "sha256:" + runHexB
	blobC   = "sha256:" + runHexC
)

// countingTransport counts the requests a client sends, by path, and
// records when each /api/ps request went out.
type countingTransport struct {
	mu    sync.Mutex
	paths map[string]int
	ps    []time.Time
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	if c.paths == nil {
		c.paths = make(map[string]int)
	}
	c.paths[r.URL.Path]++
	if r.URL.Path == "/api/ps" {
		c.ps = append(c.ps, time.Now())
	}
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *countingTransport) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if path == "" {
		n := 0
		for _, v := range c.paths {
			n += v
		}
		return n
	}
	return c.paths[path]
}

// namingSim has: tiny (weights A, loaded), copy (weights A too, as `ollama
// cp` makes), small (weights B, not loaded) and other (default weights).
func namingSim(t *testing.T) (*vramguardtest.Server, *vramguard.OllamaClient, *countingTransport) {
	t.Helper()
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "tiny", Blob: blobA},
		vramguardtest.ModelConfig{Name: "copy", Blob: blobA},
		vramguardtest.ModelConfig{Name: "small", Blob: blobB},
		vramguardtest.ModelConfig{Name: "user/other:q4"},
	)
	forever := &api.Duration{Duration: -1}
	if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "hi", KeepAlive: forever},
		func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	tr := &countingTransport{}
	c := newTestClient(t, s, vramguard.Options{HTTPClient: &http.Client{Transport: tr}, KeepModelsOnClose: true})
	return s, c, tr
}

func TestNameRunners(t *testing.T) {
	runner := func(pid uint32, blob, model string) vramguard.GPUProcess {
		return vramguard.GPUProcess{PID: pid, UsedBytes: 1 << 30, UsedKnown: true, Role: vramguard.RoleOllamaRunner, Blob: blob, Model: model}
	}
	t.Run("loaded, loading, unknown", func(t *testing.T) {
		_, c, tr := namingSim(t)
		snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{
			{Index: 0, Processes: []vramguard.GPUProcess{
				runner(1, blobA, ""),     // tiny, loaded: named from /api/ps
				runner(2, blobB, ""),     // small, loading: not in /api/ps yet
				runner(3, blobC, ""),     // weights the server does not have
				runner(4, blobA, "kept"), // already named
				runner(5, "", ""),        // no blob on its command line
				{PID: 6, Role: vramguard.RoleOllamaDiscovery, Blob: blobB},
				{PID: 7, Role: vramguard.RoleOther, Blob: blobA},
			}},
			{Index: 1, Processes: []vramguard.GPUProcess{runner(1, blobA, "")}}, // the same runner on a second GPU
		}}
		if err := NameRunners(t.Context(), c, snap); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range snap.Devices {
			for _, p := range d.Processes {
				got = append(got, p.Model)
			}
		}
		want := []string{"tiny:latest", "small:latest", "", "kept", "", "", "", "tiny:latest"}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("models = %q, want %q", got, want)
		}
		// /api/ps, one show for tiny, then /api/tags and the rest for B and C.
		if ps, tags := tr.count("/api/ps"), tr.count("/api/tags"); ps != 1 || tags != 1 {
			t.Errorf("%d /api/ps and %d /api/tags requests, want 1 each", ps, tags)
		}
		if n := tr.count("/api/show"); n != 4 {
			t.Errorf("%d /api/show requests, want 4 (each model once)", n)
		}
	})
	t.Run("loaded runners need no listing of every model", func(t *testing.T) {
		_, c, tr := namingSim(t)
		snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{runner(1, blobA, "")}}}}
		if err := NameRunners(t.Context(), c, snap); err != nil {
			t.Fatal(err)
		}
		if m := snap.Devices[0].Processes[0].Model; m != "tiny:latest" {
			t.Errorf("model %q, want the loaded tiny:latest over its copy", m)
		}
		if tr.count("/api/tags") != 0 || tr.count("/api/show") != 1 {
			t.Errorf("requests %v, want /api/ps and one /api/show", tr.paths)
		}
	})
	t.Run("shared weights, none loaded: first name", func(t *testing.T) {
		s, c, _ := namingSim(t)
		if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
			t.Fatal(err)
		}
		if s.Listed("tiny") {
			t.Fatal("tiny still listed")
		}
		snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{runner(1, blobA, "")}}}}
		if err := NameRunners(t.Context(), c, snap); err != nil {
			t.Fatal(err)
		}
		if m := snap.Devices[0].Processes[0].Model; m != "copy:latest" {
			t.Errorf("model %q, want copy:latest, first in name order", m)
		}
	})
	t.Run("nothing to name costs no request", func(t *testing.T) {
		_, c, tr := namingSim(t)
		before := tr.count("")
		for _, snap := range []*vramguard.VRAMSnapshot{nil, {}, {Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{runner(1, "", ""), runner(2, blobA, "tiny")}}}}} {
			if err := NameRunners(t.Context(), c, snap); err != nil {
				t.Errorf("NameRunners(%+v) = %v", snap, err)
			}
		}
		if n := tr.count("") - before; n != 0 {
			t.Errorf("%d requests, want none", n)
		}
	})
	t.Run("server down", func(t *testing.T) {
		s, c, _ := namingSim(t)
		s.Close()
		snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{runner(1, blobA, "")}}}}
		err := NameRunners(t.Context(), c, snap)
		if !errors.Is(err, vramguard.KindUnavailable) && !errors.Is(err, vramguard.KindTransient) {
			t.Errorf("got %v (kind %v), want unavailable or transient", err, vramguard.KindOf(err))
		}
		if snap.Devices[0].Processes[0].Model != "" {
			t.Error("a name without a server")
		}
	})
}

// TestNameRunnersSharePolls: concurrent NameRunners calls on one client
// share its /api/ps listings (the poller of vramguard's unloads): at most
// one request per poll interval, not one per call.
func TestNameRunnersSharePolls(t *testing.T) {
	const (
		n        = 8
		interval = 50 * time.Millisecond
	)
	s, _, _ := namingSim(t)
	tr := &countingTransport{}
	c := newTestClient(t, s, vramguard.Options{PollInterval: interval, HTTPClient: &http.Client{Transport: tr}, KeepModelsOnClose: true})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	snaps := make([]*vramguard.VRAMSnapshot, n)
	for i := range n {
		snaps[i] = &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{
			{PID: uint32(i + 1), Role: vramguard.RoleOllamaRunner, Blob: blobA},
		}}}}
		wg.Go(func() { errs[i] = NameRunners(t.Context(), c, snaps[i]) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i := range n {
		if m := snaps[i].Devices[0].Processes[0].Model; errs[i] != nil || m != "tiny:latest" {
			t.Errorf("call %d: model %q, %v; want tiny:latest", i, m, errs[i])
		}
	}
	tr.mu.Lock()
	at := tr.ps
	tr.mu.Unlock()
	// One request per interval, plus the first.
	if max := int(elapsed/interval) + 1; len(at) > max {
		t.Errorf("%d /api/ps requests in %v: more than one per %v interval (%d)", len(at), elapsed, interval, max)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < interval/2 {
			t.Errorf("/api/ps requests %d and %d went out %v apart, within one %v interval", i-1, i, gap, interval)
		}
	}
	t.Logf("%d calls in %v sent %d /api/ps requests", n, elapsed.Round(time.Millisecond), len(at))
}

// TestNameRunnersSkipsBrokenModels: a model /api/show fails for does not
// stop the search; a failure of the server itself does.
func TestNameRunnersSkipsBrokenModels(t *testing.T) {
	var busy atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/ps":
			if busy.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprint(w, `{"error":"server busy, please try again.  maximum pending requests exceeded"}`)
				return
			}
			fmt.Fprint(w, `{"models":[{"name":"broken:latest","model":"broken:latest"},{"name":"good:latest","model":"good:latest"}]}`)
		case "/api/show":
			var req api.ShowRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			if req.Model == "broken:latest" {
				w.WriteHeader(http.StatusInternalServerError)
				fmt.Fprint(w, `{"error":"open /root/.ollama/models/blobs/sha256-00: no such file or directory"}`)
				return
			}
			fmt.Fprintf(w, `{"modelfile":"# Modelfile generated by \"ollama show\"\nFROM /m/blobs/sha256-%s\n"}`, runHexA)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: srv.URL, KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{{PID: 1, Role: vramguard.RoleOllamaRunner, Blob: blobA}}}}}
	if err := NameRunners(t.Context(), c, snap); err != nil {
		t.Fatal(err)
	}
	if m := snap.Devices[0].Processes[0].Model; m != "good:latest" {
		t.Errorf("model %q, want good:latest past the broken one", m)
	}
	busy.Store(true)
	snap.Devices[0].Processes[0].Model = ""
	if err := NameRunners(t.Context(), c, snap); !errors.Is(err, vramguard.KindTransient) {
		t.Errorf("busy server: %v, want KindTransient", err)
	}
}

// TestRunnersClosedClient: a closed client fails fast and sends nothing.
func TestRunnersClosedClient(t *testing.T) {
	_, c, tr := namingSim(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	before := tr.count("")
	snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{{PID: 1, Role: vramguard.RoleOllamaRunner, Blob: blobA}}}}}
	if err := NameRunners(t.Context(), c, snap); !errors.Is(err, vramguard.KindUnavailable) || !errors.Is(err, vramguard.ErrClosed) {
		t.Errorf("NameRunners on a closed client = %v", err)
	}
	if n := tr.count("") - before; n != 0 {
		t.Errorf("a closed client sent %d requests", n)
	}
}
