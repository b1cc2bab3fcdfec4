package integration_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// cmd/vramgate in front of each real server: the programs that do not
// import vramguard (Ollama's own CLI, its api.Client, a chat UI speaking
// raw HTTP) get verified unloads, admitted loads and leases through it, and
// the vramguard programs on the same host see the HTTP leases.

// The real `ollama` CLI through the gate: run (a load with --keepalive
// 5m), ps, and stop, whose exit already means the model is gone from the
// server's own /api/ps. Ollama's api.Client through the gate sees what it
// sees straight at the server: the models, Show, the version, /api/ps,
// and a streamed generation of as many chunks.
func TestGateCLI(t *testing.T) {
	gateBin := buildVramgate(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "needs the server's own CLI")
		cli := ollamaCLI(t, s)
		// `ollama run` has no flag for num_predict, and a model of random
		// weights may never stop (v0.6.5's does not): the CLI runs a model
		// that shares ModelA's weights with a limit baked in, as
		// TestUnloadDuringLoad's does. Registered before the gate starts,
		// so that it is deleted only after the gate stopped.
		const capped = "tiny-a-gate"
		cappedName := vramguard.NormalizeModelName(capped)
		if err := s.Client().Create(t.Context(), &api.CreateRequest{Model: capped, From: modelA,
			Parameters: map[string]any{"num_predict": 8, "seed": 7}}, func(api.ProgressResponse) error { return nil }); err != nil {
			t.Fatalf("create %s from %s: %v", capped, modelA, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.Client().Delete(ctx, &api.DeleteRequest{Model: capped}); err != nil {
				t.Errorf("delete %s: %v", capped, err)
			}
		})
		g := startVramgate(t, gateBin, s)

		t.Run("ollama CLI", func(t *testing.T) {
			out := g.cli(t, cli, "a castle at dawn\n", "run", capped, "--keepalive", "5m", "--nowordwrap")
			t.Logf("ollama run %s: %q", capped, out)
			if ms := psNames(t, s); !slices.Equal(ms, names(capped)) {
				t.Fatalf("after ollama run through the gate the server lists %v, want %v", ms, names(capped))
			}
			out = g.cli(t, cli, "", "ps")
			t.Logf("ollama ps:\n%s", out)
			if !strings.Contains(out, cappedName) {
				t.Errorf("ollama ps through the gate does not name %s:\n%s", cappedName, out)
			}
			out = g.cli(t, cli, "", "stop", capped)
			// No wait: the gate answered the stop once the model was gone.
			if ms := running(t, s); len(ms) != 0 {
				t.Fatalf("right after ollama stop (through the gate) exited 0 the server's /api/ps lists %v; want nothing (stop's output %q)", ms, out)
			}
		})

		t.Run("api client", func(t *testing.T) {
			gc := api.NewClient(g.URL, g.hc)
			sc := s.Client()
			list, err := gc.List(t.Context())
			if err != nil {
				t.Fatalf("List through the gate: %v", err)
			}
			var listed []string
			for _, m := range list.Models {
				listed = append(listed, vramguard.NormalizeModelName(m.Name))
			}
			for _, m := range names(modelA, modelB) {
				if !slices.Contains(listed, m) {
					t.Errorf("List through the gate: %v, want %s among them", listed, m)
				}
			}
			show, err := gc.Show(t.Context(), &api.ShowRequest{Model: modelA})
			if err != nil {
				t.Fatalf("Show through the gate: %v", err)
			}
			direct, err := sc.Show(t.Context(), &api.ShowRequest{Model: modelA})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(show.Details, direct.Details) || show.Modelfile != direct.Modelfile || show.Template != direct.Template {
				t.Errorf("Show through the gate: details %+v, modelfile %q; straight: %+v, %q", show.Details, show.Modelfile, direct.Details, direct.Modelfile)
			}
			v, err := gc.Version(t.Context())
			if err != nil {
				t.Fatalf("Version through the gate: %v", err)
			}
			if dv, err := sc.Version(t.Context()); err != nil || v != dv {
				t.Errorf("Version through the gate %q, straight %q (%v)", v, dv, err)
			}
			ps, err := gc.ListRunning(t.Context())
			if err != nil {
				t.Fatalf("ListRunning through the gate: %v", err)
			}
			if len(ps.Models) != 0 {
				t.Errorf("ListRunning through the gate: %d models, want none", len(ps.Models))
			}

			// The same greedy generation through the gate (its load goes
			// through it) and then straight.
			t.Cleanup(func() { g.unloadAll(t) })
			generate := func(c *api.Client) (int, string) {
				t.Helper()
				gr := &api.GenerateRequest{Model: modelA, Prompt: "a castle at dawn", KeepAlive: &api.Duration{Duration: 5 * time.Minute},
					Options: map[string]any{"num_predict": 8, "seed": 42, "temperature": 0}}
				chunks, text := 0, ""
				if err := c.Generate(t.Context(), gr, func(r api.GenerateResponse) error {
					chunks++
					text += r.Response
					return nil
				}); err != nil {
					t.Fatalf("streamed Generate: %v", err)
				}
				return chunks, text
			}
			gChunks, gText := generate(gc)
			sChunks, sText := generate(sc)
			t.Logf("through the gate: %d chunks %q; straight: %d chunks %q", gChunks, gText, sChunks, sText)
			if gChunks != sChunks || gChunks < 2 {
				t.Errorf("through the gate %d chunks, straight %d: want the same, and more than one", gChunks, sChunks)
			}
			if gText != sText {
				t.Logf("the texts differ (not asserted)")
			}
		})
	})
}

// `ollama stop` through the gate while another program's request is still
// loading the model (its runner shows, /api/ps does not list it yet): the
// stop returns once the model is gone, and it stays gone after that
// program's generation returns. Straight at the server the same stop is
// lost on v0.17 and later (FIELD_NOTES §2): that baseline is logged, not
// asserted, since it depends on timing.
func TestGateStopDuringLoad(t *testing.T) {
	gateBin := buildVramgate(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "watches the server's runner processes and runs its CLI")
		cli := ollamaCLI(t, s)
		g := startVramgate(t, gateBin, s)

		t.Run("through the gate", func(t *testing.T) {
			r := stopDuringLoad(t, s, func() (string, error) { return g.cliRun(t, cli, "", "stop", modelB) })
			if r.stopErr != nil {
				t.Fatalf("ollama stop %s through the gate: %v\n%s", modelB, r.stopErr, r.stopOut)
			}
			if len(r.afterStop) != 0 {
				t.Errorf("right after ollama stop (through the gate) returned, /api/ps lists %v; want nothing", r.afterStop)
			}
			if len(r.afterGen) != 0 {
				t.Errorf("after the other program's generation returned, /api/ps listed %v within 1 s; want nothing", r.afterGen)
			}
		})

		t.Run("baseline straight to the server (logged only)", func(t *testing.T) {
			c := newClient(t, s, vramguard.Options{})
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if rep, err := c.UnloadModel(ctx, modelB); err != nil || !rep.Verified {
					t.Errorf("unload after the baseline: %+v, %v", rep, err)
				}
			})
			r := stopDuringLoad(t, s, func() (string, error) {
				return runCLI(t, cli, s.URL().Host, "", "stop", modelB)
			})
			t.Logf("baseline on %s: stop err %v; /api/ps right after stop %v, in the second after the generation %v, at its end %v: unload lost %v",
				s.Version(), r.stopErr, r.afterStop, r.afterGen, r.lastGen, len(r.lastGen) != 0)
		})
	})
}

// stopRace is what stopDuringLoad saw.
type stopRace struct {
	stopOut   string
	stopErr   error
	afterStop []string // /api/ps right after the stop returned
	afterGen  []string // the first non-empty /api/ps in the second after the generation returned
	lastGen   []string // /api/ps at the end of that second
}

// stopDuringLoad starts another program's generation on ModelB (raw
// api.Client straight at the server, the default keep-alive), runs stop
// as soon as its runner process shows, and reads /api/ps after the stop
// and, for a second, after the generation.
func stopDuringLoad(t *testing.T, s *ollamatest.Server, stop func() (string, error)) *stopRace {
	t.Helper()
	requireEmpty(t, s, "before the load")
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	started := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- s.Client().Generate(ctx, &api.GenerateRequest{Model: modelB, Prompt: "a castle at dawn", Options: short(4)},
			func(api.GenerateResponse) error { return nil })
	}()
	var genErr error
	genDone := false
	t.Cleanup(func() {
		cancel()
		if !genDone {
			<-done
		}
	})
	waitGen := func() {
		select {
		case genErr = <-done:
			genDone = true
		case <-time.After(60 * time.Second):
			t.Fatalf("the other program's generation on %s did not return within 60 s", modelB)
		}
	}

	deadline := time.Now().Add(30 * time.Second)
	for len(runners(t, s)) == 0 {
		select {
		case genErr = <-done:
			genDone = true
			t.Fatalf("the generation on %s ended (%v) before its runner process was seen", modelB, genErr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no runner process for %s within 30 s of the generation's start", modelB)
		}
		time.Sleep(time.Millisecond)
	}
	seen := time.Since(started)
	listed := psNames(t, s)
	stopStart := time.Now()
	r := &stopRace{}
	r.stopOut, r.stopErr = stop()
	r.afterStop = psNames(t, s)
	t.Logf("runner seen %v after the generation started; /api/ps then %v; stop took %v (err %v)",
		seen.Round(time.Millisecond), listed, time.Since(stopStart).Round(time.Millisecond), r.stopErr)
	if len(listed) != 0 {
		t.Logf("/api/ps listed %v at the stop: not caught before the listing (Ollama %s)", listed, s.Version())
	}

	waitGen()
	if genErr != nil {
		t.Logf("the other program's generation failed: %v", genErr)
	} else {
		t.Logf("the other program's generation succeeded")
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		r.lastGen = psNames(t, s)
		if len(r.lastGen) != 0 && r.afterGen == nil {
			r.afterGen = r.lastGen
		}
	}
	return r
}

// A phase of another vramguard program (straight at the server, the
// gate's lease directory) keeps its model: with one slot (-max-loaded 1)
// a chat client's request for another model through the gate gets 503,
// Retry-After of -retry-after (a phase's lease has no end) and a body
// naming the phase's lease; the server never sees the load, and the
// phase's next step is a reuse.
func TestGatePhaseLease(t *testing.T) {
	gateBin := buildVramgate(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		g := startVramgate(t, gateBin, s, "-max-loaded", "1", "-retry-after", "7s")
		other := newClient(t, s, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: g.leaseDir}})
		ph, err := other.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := ph.End(ctx); err != nil {
				t.Errorf("phase End: %v", err)
			}
		})
		pg := ph.Guard()
		step := func() *vramguard.Generation {
			t.Helper()
			gen, err := pg.Generate(t.Context(), req(modelA, 4), nil)
			if err != nil {
				t.Fatalf("the phase's step on %s: %v", modelA, err)
			}
			return gen
		}
		if gen := step(); !gen.Loaded {
			t.Fatalf("the phase's first step did not load %s: %+v", modelA, gen)
		}

		resp, body := g.do(t, "POST", "/api/chat",
			fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":false,"options":{"num_predict":4}}`, modelB),
			"X-Vramgate-Client", "chat-ui")
		t.Logf("chat for %s through the gate: %d, Retry-After %q: %s", modelB, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("chat for %s while the phase holds %s in the only slot: %d, want 503", modelB, modelA, resp.StatusCode)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "7" {
			t.Errorf("Retry-After %q, want 7 (-retry-after: the phase's lease has no end)", ra)
		}
		var ref struct {
			Reason          string `json:"reason"`
			RetryAfterKnown bool   `json:"retry_after_known"`
			Blockers        []struct {
				Kind   string `json:"kind"`
				Model  string `json:"model"`
				Holder string `json:"holder"`
			} `json:"blockers"`
		}
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("the refusal's body: %v", err)
		}
		named := false
		for _, b := range ref.Blockers {
			named = named || b.Kind == "lease" && b.Model == modelAName && strings.Contains(b.Holder, "phase prompts")
		}
		if ref.Reason != "leased" || ref.RetryAfterKnown || !named {
			t.Errorf("refusal: reason %q, retry_after_known %v, blockers %+v; want leased, false, and the lease of phase prompts on %s",
				ref.Reason, ref.RetryAfterKnown, ref.Blockers, modelAName)
		}
		if ms := psNames(t, s); !slices.Equal(ms, names(modelA)) {
			t.Errorf("after the refusal the server lists %v, want only %s", ms, modelAName)
		}
		if gen := step(); gen.Loaded {
			t.Errorf("the phase's next step loaded %s again: %+v", modelA, gen)
		}
		rep, err := ph.End(t.Context())
		if err != nil {
			t.Fatalf("phase End: %v", err)
		}
		t.Logf("phase ended: %+v", rep)
		requireEmpty(t, s, "after the phase ended")
	})
}

// A lease an HTTP client takes through the gate keeps the model from
// another vramguard program's unload; when the client vanishes (never
// extends, never releases) the lease ends at its TTL and the other
// program's unload goes through, verified.
func TestGateHTTPLeaseTTL(t *testing.T) {
	gateBin := buildVramgate(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		g := startVramgate(t, gateBin, s)
		t.Cleanup(func() { g.unloadAll(t) })
		gc := api.NewClient(g.URL, g.hc)
		if err := gc.Generate(t.Context(), &api.GenerateRequest{Model: modelA, Prompt: "a castle at dawn", Options: short(2),
			KeepAlive: &api.Duration{Duration: 5 * time.Minute}}, func(api.GenerateResponse) error { return nil }); err != nil {
			t.Fatalf("load %s through the gate: %v", modelA, err)
		}
		const ttl = time.Second
		resp, body := g.do(t, "POST", "/vramgate/leases", fmt.Sprintf(`{"model":%q,"holder":"render-box","ttl":%q}`, modelA, ttl))
		var l struct {
			ID     string    `json:"id"`
			Model  string    `json:"model"`
			Holder string    `json:"holder"`
			Until  time.Time `json:"until"`
		}
		if err := json.Unmarshal(body, &l); err != nil || resp.StatusCode != http.StatusCreated || l.ID == "" || l.Model != modelAName || l.Holder != "render-box" {
			t.Fatalf("take a lease: %d %s (%v)", resp.StatusCode, body, err)
		}
		t.Logf("lease: %s", body)

		other := newClient(t, s, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: g.leaseDir}})
		asked := time.Now()
		rep, err := other.UnloadModel(t.Context(), modelA)
		switch {
		case err == nil && asked.Before(l.Until):
			t.Fatalf("another program's UnloadModel while the HTTP lease holds %s: %+v, no error; want ErrLeased", modelA, rep)
		case err == nil:
			t.Fatalf("the first UnloadModel was asked %v after the lease's end (this machine was too slow for a TTL of %v): nothing tested", asked.Sub(l.Until), ttl)
		case !errors.Is(err, vramguard.ErrLeased):
			t.Fatalf("another program's UnloadModel while the HTTP lease holds %s: %v, want ErrLeased", modelA, err)
		}
		t.Logf("while leased: %v", err)

		// The client vanishes: nothing is sent to the gate from here on.
		bound := 10 * time.Second
		for {
			rep, err = other.UnloadModel(t.Context(), modelA)
			if err == nil {
				break
			}
			if !errors.Is(err, vramguard.ErrLeased) {
				t.Fatalf("UnloadModel after the lease's TTL: %v", err)
			}
			if time.Since(l.Until) > bound {
				t.Fatalf("the HTTP lease (TTL %v, until %s) still keeps %s %v after its end", ttl, l.Until.Format(time.RFC3339Nano), modelA, bound)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("the other program's unload went through %v after the lease's end: %+v", time.Since(l.Until).Round(time.Millisecond), rep)
		if !rep.Verified || !rep.WasLoaded {
			t.Errorf("UnloadModel after the TTL: %+v, want verified, was loaded", rep)
		}
		requireEmpty(t, s, "after the unload")
		if resp, body := g.do(t, "GET", "/vramgate/leases", ""); resp.StatusCode != http.StatusOK || strings.Contains(string(body), "render-box") {
			t.Errorf("GET /vramgate/leases after the TTL: %d %s, want no lease of render-box", resp.StatusCode, body)
		}
	})
}

// A real Prometheus scrapes the gate's /metrics: a request of a named
// client is counted by that name, and vramguard's own series (Ollama up)
// are there. The gate's /ready answers as vramwatch's. One version is
// enough: the series are the gate's own.
func TestGateMetricsScrapedByPrometheus(t *testing.T) {
	prom := prometheusBinary(t)
	gateBin := buildVramgate(t)
	first := ollamatest.Versions()[0]
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		if s.Version() != first {
			t.Skipf("one version is enough (the gate's own series): tested on %s", first)
		}
		g := startVramgate(t, gateBin, s)
		t.Cleanup(func() { g.unloadAll(t) })

		// A chat UI's generation with keep_alive 0: its done line comes
		// once the model is verified gone, which the trailer says.
		resp, body := g.do(t, "POST", "/api/generate",
			fmt.Sprintf(`{"model":%q,"prompt":"a castle at dawn","keep_alive":0,"stream":false,"options":{"num_predict":2}}`, modelA),
			"X-Vramgate-Client", "chat-ui")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("generate through the gate: %d %s", resp.StatusCode, body)
		}
		t.Logf("X-Vramgate-Admission %q, trailer X-Vramgate-Unload %q", resp.Header.Get("X-Vramgate-Admission"), resp.Trailer.Get("X-Vramgate-Unload"))
		if tr := resp.Trailer.Get("X-Vramgate-Unload"); !strings.HasPrefix(tr, "verified") {
			t.Errorf("trailer X-Vramgate-Unload %q, want verified", tr)
		}
		requireEmpty(t, s, "once the keep_alive 0 reply through the gate ended")

		p := startPrometheus(t, prom, map[string]string{"vramgate": g.Host})
		p.await(t, `up{job="vramgate"}`, "the gate scraped", value(func(x float64) bool { return x == 1 }))
		p.await(t, `vramgate_requests_total{job="vramgate",client="chat-ui"}`, "the chat UI's request counted by its name",
			func(v []sample) bool { return len(v) >= 1 })
		p.await(t, `vramguard_ollama_up{job="vramgate"}`, "Ollama up", value(func(x float64) bool { return x == 1 }))

		// /ready: with no query, whether Ollama answers.
		resp, body = g.do(t, "GET", "/ready", "")
		var plain struct {
			Ready *bool `json:"ready"`
		}
		if err := json.Unmarshal(body, &plain); err != nil || resp.StatusCode != http.StatusOK || plain.Ready == nil || !*plain.Ready {
			t.Errorf("GET /ready: %d %s (%v), want 200 and ready true", resp.StatusCode, body, err)
		}
		// With a model, as vramwatch's: resident and verified by its
		// runner process, then absent after a verified unload.
		w := &vramwatch{URL: g.URL, hc: g.hc}
		if err := api.NewClient(g.URL, g.hc).Generate(t.Context(), &api.GenerateRequest{Model: modelA, Prompt: "a castle at dawn",
			Options: short(2), KeepAlive: &api.Duration{Duration: time.Hour}}, func(api.GenerateResponse) error { return nil }); err != nil {
			t.Fatalf("load %s through the gate: %v", modelA, err)
		}
		r := w.ready(t, "model="+modelA, http.StatusOK)
		if m := r.Model; m == nil || m.State != "resident" || !m.Verified || m.ExpiresAt == nil || !m.ExpiresAt.After(time.Now().Add(50*time.Minute)) {
			t.Errorf("/ready?model=%s after a load: %+v; want resident, verified, expiring in about an hour", modelA, r.Model)
		}
		if !s.External() {
			pids := runners(t, s)
			if m := r.Model; m == nil || m.Checked != "ps+runner-processes" || len(m.RunnerPIDs) != 1 || !slices.Contains(pids, int(m.RunnerPIDs[0])) {
				t.Errorf("/ready?model=%s after a load: %+v; want checked by its runner process %v", modelA, r.Model, pids)
			}
		}
		resp, body = g.do(t, "POST", "/api/unload", fmt.Sprintf(`{"model":%q}`, modelA))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"verified":true`) {
			t.Fatalf("POST /api/unload %s: %d %s", modelA, resp.StatusCode, body)
		}
		r = w.ready(t, "model="+modelA, http.StatusServiceUnavailable)
		if m := r.Model; m == nil || m.State != "absent" || !m.Verified || len(m.RunnerPIDs) != 0 {
			t.Errorf("/ready?model=%s after a verified unload: %+v; want absent, verified", modelA, r.Model)
		}
	})
}

// gateBuild is the vramgate binary of this test process: built once (go
// build is incremental, but linking takes seconds on two cores), as
// ollamatest builds its stand-in.
var gateBuild struct {
	sync.Mutex
	path string
}

// buildVramgate builds cmd/vramgate once per test process into
// ollamatest.CacheDir()/vramgate/<checkout>, through a temporary file
// renamed into place, so that another test process never runs a partly
// written binary. <checkout> is named after this package's directory: the
// cache is shared by every checkout on the machine, and a gate built from
// another checkout's sources (renamed into a shared path while this
// process's gates start) would test that checkout's code.
func buildVramgate(t *testing.T) string {
	t.Helper()
	gateBuild.Lock()
	defer gateBuild.Unlock()
	if gateBuild.path != "" {
		return gateBuild.path
	}
	root, err := ollamatest.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "vramgate", fmt.Sprintf("%x", sha256.Sum256([]byte(wd)))[:16])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", filepath.Join(tmp, "vramgate"), "github.com/vramguard/vramguard/cmd/vramgate")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build vramgate: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "vramgate") // the name its leases show
	if err := os.Rename(filepath.Join(tmp, "vramgate"), path); err != nil {
		t.Fatal(err)
	}
	gateBuild.path = path
	return path
}

// vramgate is a running vramgate.
type vramgate struct {
	*url.URL
	leaseDir string
	hc       *http.Client
}

var gateLineRE = regexp.MustCompile(`^vramgate: (http://127\.0\.0\.1:\d+) -> (\S+) \(GET /metrics, /ready; leases at /vramgate/leases\)$`)

// startVramgate starts bin in front of s on a port of its choosing, with
// no GPU reader, debug logging and a lease directory of the test's own
// (mode 0700), and stops it at the end of the test: SIGTERM, which must
// end it with status 0. Its log is shown when the test failed.
func startVramgate(t *testing.T, bin string, s *ollamatest.Server, extraArgs ...string) *vramgate {
	t.Helper()
	return startVramgateWith(t, bin, s.URL().String(), nil, extraArgs...)
}

// startVramgateEnv is startVramgate with env (KEY=VALUE) added to the
// gate's environment.
func startVramgateEnv(t *testing.T, bin string, s *ollamatest.Server, env []string, extraArgs ...string) *vramgate {
	t.Helper()
	return startVramgateWith(t, bin, s.URL().String(), env, extraArgs...)
}

// startVramgateAt is startVramgate in front of the server at upstream
// (another gate).
func startVramgateAt(t *testing.T, bin, upstream string, extraArgs ...string) *vramgate {
	t.Helper()
	return startVramgateWith(t, bin, upstream, nil, extraArgs...)
}

// startVramgateWith is startVramgate in front of upstream, with env added
// to the gate's environment.
func startVramgateWith(t *testing.T, bin, upstream string, env []string, extraArgs ...string) *vramgate {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "leases")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-listen", "127.0.0.1:0", "-ollama", upstream, "-gpu=false", "-lease-dir", dir, "-v"}, extraArgs...)
	var out *lineBuffer
	// Registered first, so that it runs after the gate stopped.
	t.Cleanup(func() {
		if t.Failed() && out != nil {
			t.Logf("vramgate %s:\n%s", strings.Join(args, " "), out)
		}
	})
	gate := exec.Command(bin, args...)
	if env != nil {
		gate.Env = append(os.Environ(), env...)
	}
	out, exited := startStopped(t, gate, "vramgate", true)
	var line string
	select {
	case line = <-out.first:
	case err := <-exited:
		t.Fatalf("vramgate exited before it listened: %v\n%s", err, out)
	case <-time.After(30 * time.Second):
		t.Fatalf("vramgate printed no line within 30 s:\n%s", out)
	}
	m := gateLineRE.FindStringSubmatch(line)
	if m == nil || m[2] != upstream {
		t.Fatalf("vramgate's first line %q; want %q", line, gateLineRE)
	}
	u, err := url.Parse(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return &vramgate{URL: u, leaseDir: dir, hc: testHTTPClient(t)}
}

// do sends one request to the gate, with header name-value pairs, and
// returns the response, whose body (returned) is read and closed, so that
// its trailers are there.
func (g *vramgate) do(t *testing.T, method, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	r, err := http.NewRequestWithContext(t.Context(), method, g.String()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := g.hc.Do(r)
	if err != nil {
		t.Fatalf("%s %s through the gate: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s through the gate: reading the body: %v", method, path, err)
	}
	return resp, b
}

// unloadAll asks the gate to unload every model, verified (POST
// /api/unload {"all": true}), for a cleanup: it runs detached from the
// test's context, which is done by then.
func (g *vramgate) unloadAll(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, "POST", g.String()+"/api/unload", strings.NewReader(`{"all":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := g.hc.Do(r)
	if err != nil {
		t.Errorf("POST /api/unload all through the gate: %v", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"verified":true`) {
		t.Errorf("POST /api/unload all through the gate: %d %s", resp.StatusCode, b)
	}
}

// psNames is the server's /api/ps, normalized and sorted, read as running
// reads it (a failed listing is read again).
func psNames(t *testing.T, s *ollamatest.Server) []string {
	t.Helper()
	return names(running(t, s)...)
}

// ollamaCLI is the path of the real `ollama` binary of s's version.
func ollamaCLI(t *testing.T, s *ollamatest.Server) string {
	t.Helper()
	bin, _, err := ollamatest.Binary(t.Context(), s.Version(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// cli runs the ollama CLI against the gate, which must exit 0, and
// returns its standard output.
func (g *vramgate) cli(t *testing.T, bin, stdin string, args ...string) string {
	t.Helper()
	out, err := g.cliRun(t, bin, stdin, args...)
	if err != nil {
		t.Fatalf("ollama %s through the gate: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (g *vramgate) cliRun(t *testing.T, bin, stdin string, args ...string) (string, error) {
	return runCLI(t, bin, g.Host, stdin, args...)
}

// runCLI runs the ollama CLI with OLLAMA_HOST=host and a HOME of its own
// (no user configuration), bounded by 2 minutes, and returns its standard
// output; on failure the error carries its standard error.
func runCLI(t *testing.T, bin, host, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.WaitDelay = 5 * time.Second
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OLLAMA_") && !strings.HasPrefix(kv, "HOME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir(), "OLLAMA_HOST="+host)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w (stderr %q)", err, stderr.String())
	}
	return stdout.String(), nil
}

// Ollama's own guards and the gate's stay in step (FIELD_NOTES §10): the
// same requests, a web page's text/plain POST from a foreign origin and
// a request naming a foreign host (DNS rebinding), are sent to the real
// server and to the gate in front of it; both answer 403 with no body.
// The same requests without the foreign origin or host are answered by
// both (not 403), so that the refusals are the guards' and nothing else's.
func TestGateKeepsOllamasGuards(t *testing.T) {
	gateBin := buildVramgate(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "needs a server listening on loopback, whose Host check is on")
		g := startVramgate(t, gateBin, s)
		hc := testHTTPClient(t)
		var lastHeader http.Header // of the last answer send read
		send := func(base *url.URL, method, path, body string, hdr ...string) (int, string) {
			t.Helper()
			r, err := http.NewRequestWithContext(t.Context(), method, base.String()+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(hdr); i += 2 {
				r.Header.Set(hdr[i], hdr[i+1])
			}
			if h := r.Header.Get("Host"); h != "" {
				r.Host = strings.ReplaceAll(h, "PORT", base.Port())
				r.Header.Del("Host")
			}
			if o := r.Header.Get("Origin"); o != "" {
				r.Header.Set("Origin", strings.ReplaceAll(o, "PORT", base.Port()))
			}
			resp, err := hc.Do(r)
			if err != nil {
				t.Fatalf("%s %s at %s: %v", method, path, base, err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("%s %s at %s: %d, reading the body: %v", method, path, base, resp.StatusCode, err)
			}
			lastHeader = resp.Header
			return resp.StatusCode, string(b)
		}
		// Harmless if let through: nothing is resident, the unloads find
		// nothing, the generation asks for no model.
		reqs := []struct{ method, path, body string }{
			{"POST", "/api/generate", fmt.Sprintf(`{"model":%q,"keep_alive":0}`, modelA)},
			{"POST", "/api/chat", fmt.Sprintf(`{"model":%q,"keep_alive":0}`, modelA)},
			{"POST", "/api/show", fmt.Sprintf(`{"model":%q}`, modelA)},
			{"GET", "/api/tags", ""},
			{"GET", "/api/ps", ""},
			{"GET", "/api/version", ""},
			{"GET", "/", ""},
		}
		serverURL := s.URL()
		for _, attack := range []struct {
			name string
			hdr  []string
		}{
			{"cross-origin", []string{"Origin", "http://evil.example", "Content-Type", "text/plain"}},
			{"rebinding", []string{"Host", "evil.example:PORT", "Content-Type", "text/plain"}},
			{"rebinding, same-origin", []string{"Host", "evil.example:PORT", "Origin", "http://evil.example:PORT"}},
		} {
			for _, q := range reqs {
				sc, sb := send(serverURL, q.method, q.path, q.body, attack.hdr...)
				gc, gb := send(g.URL, q.method, q.path, q.body, attack.hdr...)
				if sc != http.StatusForbidden {
					t.Errorf("%s: %s %s straight to Ollama: %d %q; the guard this test keeps in step is gone (FIELD_NOTES §10)", attack.name, q.method, q.path, sc, sb)
				}
				if gc != sc || gb != sb {
					t.Errorf("%s: %s %s: Ollama %d %q, the gate %d %q", attack.name, q.method, q.path, sc, sb, gc, gb)
				}
			}
			// The gate's own routes answer as Ollama's do.
			for _, own := range []string{"/vramgate/leases", "/api/unload"} {
				body := fmt.Sprintf(`{"model":%q,"holder":"page","ttl":"10m"}`, modelA)
				if own == "/api/unload" {
					body = `{"all":true}`
				}
				if gc, gb := send(g.URL, "POST", own, body, attack.hdr...); gc != http.StatusForbidden || gb != "" {
					t.Errorf("%s: POST %s at the gate: %d %q, want 403 as Ollama", attack.name, own, gc, gb)
				}
			}
		}
		for _, ok := range [][]string{{"Origin", "http://localhost:3000"}, {"Host", "localhost:PORT"}, {}} {
			for _, q := range reqs[2:] {
				sc, _ := send(serverURL, q.method, q.path, q.body, ok...)
				sh := lastHeader
				gc, gb := send(g.URL, q.method, q.path, q.body, ok...)
				if sc == http.StatusForbidden || gc != sc {
					t.Errorf("%v: %s %s: Ollama %d, the gate %d %q; want the same answer, not 403", ok, q.method, q.path, sc, gc, gb)
				}
				// Ollama's CORS reply headers reach the client once.
				for _, h := range []string{"Access-Control-Allow-Origin", "Vary"} {
					if s, g := sh.Values(h), lastHeader.Values(h); !slices.Equal(s, g) {
						t.Errorf("%v: %s %s: %s from Ollama %q, through the gate %q", ok, q.method, q.path, h, s, g)
					}
				}
			}
		}
		// A browser's preflight, on a route the gate answers itself and on
		// one it forwards: Ollama answers it (204 from an allowed origin,
		// 403 from a foreign one) and the gate answers the same.
		for _, path := range []string{"/api/chat", "/vramgate/leases", "/api/tags"} {
			for _, origin := range []string{"http://localhost:3000", "http://evil.example"} {
				pre := []string{"Origin", origin, "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type"}
				sc, _ := send(serverURL, "OPTIONS", path, "", pre...)
				gc, _ := send(g.URL, "OPTIONS", path, "", pre...)
				want := http.StatusNoContent
				if origin == "http://evil.example" {
					want = http.StatusForbidden
				}
				if sc != want || gc != sc {
					t.Errorf("preflight of %s from %s: Ollama %d, the gate %d; want %d from both", path, origin, sc, gc, want)
				}
			}
		}
		if resp, body := g.do(t, "GET", "/vramgate/leases", ""); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"leases":[]`) {
			t.Errorf("a refused request took a lease: %d %s", resp.StatusCode, body)
		}
	})
}

// OLLAMA_ORIGINS, as Ollama reads it: a server of each version started
// with it and a gate given the same value answer the same origins alike
// (an origin it names served, a wildcard honoured, another refused 403,
// the defaults kept).
func TestGateHonoursOllamaOrigins(t *testing.T) {
	gateBin := buildVramgate(t)
	const origins = ` "http://chat.example,https://*.corp.example" `
	for _, v := range ollamatest.Versions() {
		t.Run("ollama-"+v, func(t *testing.T) {
			s, err := ollamatest.Start(t.Context(), ollamatest.Options{Version: v, Env: []string{"OLLAMA_ORIGINS=" + origins}, Logf: t.Logf})
			if err != nil {
				t.Fatalf("ollama %s with OLLAMA_ORIGINS: %v", v, err)
			}
			t.Cleanup(func() {
				if err := s.Stop(); err != nil {
					t.Errorf("stop the server: %v", err)
				}
			})
			skipIfExternal(t, s, "needs a server started with OLLAMA_ORIGINS")
			g := startVramgateEnv(t, gateBin, s, []string{"OLLAMA_ORIGINS=" + origins})
			hc := testHTTPClient(t)
			get := func(base *url.URL, origin string) int {
				r, err := http.NewRequestWithContext(t.Context(), "GET", base.String()+"/api/version", nil)
				if err != nil {
					t.Fatal(err)
				}
				r.Header.Set("Origin", origin)
				resp, err := hc.Do(r)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			for origin, want := range map[string]int{
				"http://chat.example": 200, "https://a.corp.example": 200, "http://localhost:8080": 200, "app://x": 200,
				"http://other.example": 403, "http://chat.example.evil.net": 403, "https://corp.example.evil.net": 403,
			} {
				if sc, gc := get(s.URL(), origin), get(g.URL, origin); sc != want || gc != sc {
					t.Errorf("Origin %s: Ollama %d, the gate %d; want %d from both", origin, sc, gc, want)
				}
			}
		})
	}
}

// A vramguard program pointed at the gate (OLLAMA_HOST = the gate) unloads
// a model while another program's request, straight at the server, is
// loading it. The client cannot see the runners behind the gate (nothing
// that listens at its address is `ollama serve`), so it takes the gate's
// verified answer: its report names the runner check as the gate's
// (UnloadReport.RunnerCheckBy), never a verdict of /api/ps alone that does
// not say so; and the model is gone when UnloadModel returns and stays
// gone after that program's generation returns. Behind a second gate in
// front of the first, the report names both.
func TestGateClientUnloadTakesTheGatesRunnerCheck(t *testing.T) {
	gateBin := buildVramgate(t)
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		skipIfExternal(t, s, "watches the server's runner processes")
		g := startVramgate(t, gateBin, s)
		outer := startVramgateAt(t, gateBin, g.String())
		tests := []struct {
			name string
			at   *vramgate
			by   string // UnloadReport.RunnerCheckBy
		}{
			{name: "one gate", at: g, by: "vramgate at " + g.Host},
			{name: "a gate in front of the gate", at: outer, by: "vramgate at " + outer.Host + ", which took it from vramgate at " + g.Host},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				tr := http.DefaultTransport.(*http.Transport).Clone()
				t.Cleanup(tr.CloseIdleConnections)
				c, err := vramguard.NewClient(vramguard.Options{Host: tt.at.String(), HTTPClient: &http.Client{Transport: tr}, PollInterval: 25 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := c.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				})
				var rep *vramguard.UnloadReport
				r := stopDuringLoad(t, s, func() (string, error) {
					var err error
					rep, err = c.UnloadModel(t.Context(), modelB)
					return "", err
				})
				if r.stopErr != nil {
					t.Fatalf("UnloadModel(%s) through the gate during another program's load: %v", modelB, r.stopErr)
				}
				t.Logf("report: verified %v, checked %v, runner check by %q, no runner check %q, runner seen %v, attempts %d, polls %d, elapsed %v",
					rep.Verified, rep.Checked, rep.RunnerCheckBy, rep.NoRunnerCheck, rep.RunnerSeen, rep.Attempts, rep.Polls, rep.Elapsed.Round(time.Millisecond))
				if !rep.Verified || rep.Checked&vramguard.CheckRunnerProcesses == 0 || rep.RunnerCheckBy != tt.by || rep.NoRunnerCheck != "" {
					t.Errorf("report %+v; want verified, with the runner check made by %q and no NoRunnerCheck", rep, tt.by)
				}
				if len(r.afterStop) != 0 {
					t.Errorf("right after UnloadModel returned, /api/ps lists %v; want nothing", r.afterStop)
				}
				if len(r.afterGen) != 0 {
					t.Errorf("after the other program's generation returned, /api/ps listed %v within 1 s; want nothing", r.afterGen)
				}
			})
		}
	})
}
