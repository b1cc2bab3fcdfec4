package comfyui_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
)

// TestFreeAfterARender: a free sent while a prompt runs is pending (with
// the prompt's id) and moves nothing; with Wait it is freed only once the
// fake GPU shows the memory back, after the prompt and the settle lag.
func TestFreeAfterARender(t *testing.T) {
	const lag = 500 * time.Millisecond // several readings (100 ms apart) before the memory moves
	p := newPair(t, comfyuitest.Config{SettleLag: lag})
	c := p.client(t, p.ollama.GPU())
	q, err := c.Submit(t.Context(), workflow(30, nil)) // 300 ms
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.comfy.Held().Models == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	held := p.comfy.Held()
	if held.Models == 0 {
		t.Fatal("the checkpoint never loaded")
	}
	rc, err := c.Free(t.Context(), comfyui.FreeRequest{})
	if err != nil || rc.Outcome != comfyui.OutcomePending || rc.PromptID != q.PromptID || rc.Released() != 0 {
		t.Fatalf("Free during the render = %+v, %v; want pending on %s, nothing released", rc, err, q.PromptID)
	}
	if got := p.comfy.Held(); got.Models != held.Models {
		t.Errorf("a pending free unloaded the model at once: %+v", got)
	}
	rc, err = c.Free(t.Context(), comfyui.FreeRequest{Wait: true})
	if err != nil || rc.Outcome != comfyui.OutcomeFreed || !rc.Settled || rc.Waited <= 0 {
		t.Fatalf("Free with Wait = %s, %v; want freed after waiting for the prompt", rc, err)
	}
	settled := p.eventTime(comfyuitest.FreeSettled)
	if settled.IsZero() || p.comfy.Held().Models != 0 || p.comfy.Held().Cache != 0 {
		t.Errorf("receipt freed, but the fake settled at %v and holds %+v", settled, p.comfy.Held())
	}
	if !rc.Process.Known || !rc.Torch.Known || rc.Released() < 6*gib || rc.Process.After > p.comfy.Held().Total()+rc.Tolerance {
		t.Errorf("receipt %s; want the process and torch's pool measured, 8 GiB back", rc)
	}
	applied := p.eventTime(comfyuitest.FreeApplied)
	if ended := p.eventTime(comfyuitest.PromptEnd); applied.Before(ended) {
		t.Errorf("the fake applied the free at %v, before the prompt ended at %v", applied, ended)
	}
}

// TestFreeNeverClaimsWhatItDidNotMeasure: pinned memory is reported as
// such, never as freed; without a reader the stats carry the receipt and
// the reader is named as not checked; with neither it is not measured; a
// reader without the stats cannot tell an empty ComfyUI from pinned
// memory.
func TestFreeNeverClaimsWhatItDidNotMeasure(t *testing.T) {
	pinNode := comfyui.Workflow{"10": {ClassType: "PinLoader", Inputs: map[string]any{}}}
	t.Run("pinned", func(t *testing.T) {
		p := newPair(t, comfyuitest.Config{CustomNodes: map[string]comfyuitest.CustomNode{"PinLoader": {PinBytes: 2 * gib, Output: true}}})
		c := p.client(t, p.ollama.GPU())
		if _, err := c.Run(t.Context(), workflow(2, pinNode)); err != nil {
			t.Fatal(err)
		}
		rc, err := c.Free(t.Context(), comfyui.FreeRequest{Settle: 2 * time.Second})
		if err != nil || rc.Outcome != comfyui.OutcomePartlyFreed || !rc.PinnedKnown || rc.Pinned < 2*gib-rc.Tolerance || rc.Pinned > 2*gib+rc.Tolerance {
			t.Fatalf("Free = %s, %v; want partly freed with 2 GiB pinned", rc, err)
		}
		if !strings.Contains(rc.String(), "pinned") {
			t.Errorf("receipt %q does not name the pinned memory", rc)
		}
	})
	t.Run("stats only", func(t *testing.T) {
		// Torch's pool is a secondary view, never the only source of a
		// freed: here (ModelPatcher) it shows the checkpoint leave.
		p := newPair(t, comfyuitest.Config{Mode: comfyuitest.ModelPatcher})
		c := p.client(t, nil)
		if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
			t.Fatal(err)
		}
		rc, err := c.Free(t.Context(), comfyui.FreeRequest{})
		if err != nil || rc.Outcome != comfyui.OutcomeNotMeasured || rc.Process.Known || !rc.Torch.Known || rc.Torch.Before < 6*gib ||
			rc.Torch.After > rc.Tolerance || rc.Released() != 0 || !strings.Contains(strings.Join(rc.NotChecked, ";"), "no reader") {
			t.Errorf("Free = %s, %v; want not measured, torch's pool read (6 GiB → 0), the GPU named as not checked", rc, err)
		}
	})
	t.Run("neither", func(t *testing.T) {
		p := newPair(t, comfyuitest.Config{})
		url := noStats(t, p.comfy)
		c, err := comfyui.New(comfyui.Options{URL: url, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
			t.Fatal(err)
		}
		rc, err := c.Free(t.Context(), comfyui.FreeRequest{Settle: 300 * time.Millisecond})
		if err != nil || rc.Outcome != comfyui.OutcomeNotMeasured || rc.Released() != 0 || len(rc.NotChecked) < 2 {
			t.Errorf("Free = %s, %v; want not measured, both checks named", rc, err)
		}
		if p.eventTime(comfyuitest.FreeRequested).IsZero() {
			t.Error("the free was not sent")
		}
	})
	t.Run("reader only, nothing loaded", func(t *testing.T) {
		p := newPair(t, comfyuitest.Config{})
		url := noStats(t, p.comfy)
		c, err := comfyui.New(comfyui.Options{URL: url, VRAM: p.ollama.GPU(), PID: p.comfy.PID()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rc, err := c.Free(t.Context(), comfyui.FreeRequest{Settle: 300 * time.Millisecond})
		if err != nil || rc.Outcome == comfyui.OutcomeFreed || !rc.Process.Known {
			t.Errorf("Free = %s, %v; want the process measured and no claim of freed", rc, err)
		}
	})
}

// noStats puts a proxy before f that answers 404 to /system_stats.
func noStats(t *testing.T, f *comfyuitest.Server) string {
	t.Helper()
	rp := httputil.NewSingleHostReverseProxy(f.URL())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/system_stats") {
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSlowStatsIsBusy: /system_stats answering late while ComfyUI frees is
// ErrBusy (KindTransient), not a server that is down; Free skips those
// readings and still measures; a server that does not answer is
// KindUnavailable.
func TestSlowStatsIsBusy(t *testing.T) {
	p := newPair(t, comfyuitest.Config{SettleLag: 300 * time.Millisecond, StatsDelay: 400 * time.Millisecond})
	c, err := comfyui.New(comfyui.Options{URL: p.comfy.URL().String(), VRAM: p.ollama.GPU(), PID: p.comfy.PID(), StatsTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
		t.Fatal(err)
	}
	rc, err := c.Free(t.Context(), comfyui.FreeRequest{Settle: 5 * time.Second})
	if err != nil || rc.Outcome == comfyui.OutcomeNotMeasured || !rc.Process.Known || rc.Released() < 6*gib {
		t.Errorf("Free beside a slow /system_stats = %s, %v; want the process measured back", rc, err)
	}
	down, err := comfyui.New(comfyui.Options{URL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	if _, err := down.SystemStats(t.Context()); vramguard.KindOf(err) != vramguard.KindUnavailable {
		t.Errorf("SystemStats of nothing = %v (kind %v); want KindUnavailable", err, vramguard.KindOf(err))
	}
	if _, err := down.Free(t.Context(), comfyui.FreeRequest{}); vramguard.KindOf(err) != vramguard.KindUnavailable {
		t.Errorf("Free of nothing = %v; want KindUnavailable", err)
	}
}

// TestStatsBusyWhileFreeing: a /system_stats that answers later than
// StatsTimeout while the fake applies a free is ErrBusy, KindTransient.
func TestStatsBusyWhileFreeing(t *testing.T) {
	p := newPair(t, comfyuitest.Config{SettleLag: time.Second, StatsDelay: 500 * time.Millisecond})
	c, err := comfyui.New(comfyui.Options{URL: p.comfy.URL().String(), StatsTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Run(t.Context(), workflow(1, nil)); err != nil {
		t.Fatal(err)
	}
	// A short settle: Free returns while the fake still frees (SettleLag).
	if _, err := c.Free(t.Context(), comfyui.FreeRequest{Settle: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if p.eventTime(comfyuitest.FreeApplied).IsZero() || !p.eventTime(comfyuitest.FreeSettled).IsZero() {
		t.Fatal("the fake is not freeing; the test needs it to")
	}
	_, err = c.SystemStats(t.Context())
	if !errors.Is(err, comfyui.ErrBusy) || vramguard.KindOf(err) != vramguard.KindTransient {
		t.Errorf("SystemStats while freeing = %v (kind %v); want ErrBusy, KindTransient", err, vramguard.KindOf(err))
	}
}
