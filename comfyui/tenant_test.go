package comfyui_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// rendered is a pair after one render: ComfyUI holds its 6 GiB
// checkpoint (6.25 GiB with its context; torch's cache was emptied after
// the first prompt, as ComfyUI's worker does), another program's "small"
// (1 GiB) stays loaded: 8.75 GiB free of 16.
func rendered(t *testing.T, cfg comfyuitest.Config) (*pair, *comfyui.Client) {
	t.Helper()
	p := newPair(t, cfg)
	c := p.client(t, p.ollama.GPU())
	if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
		t.Fatal(err)
	}
	forever := &api.Duration{Duration: -1}
	if err := p.ollama.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "small", Prompt: "x", KeepAlive: forever},
		func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return p, c
}

// ollamaClient is a vramguard client of p's Ollama reading the GPU
// through c's Reader, with a budget that makes room and keeps headroom
// GiB free.
func ollamaClient(t *testing.T, p *pair, c *comfyui.Client, headroom uint64, makeRoom bool) *vramguard.OllamaClient {
	t.Helper()
	return vramguardtest.NewClient(t, p.ollama, vramguard.Options{VRAM: c.Reader(p.ollama.GPU()), VRAMPollInterval: 10 * time.Millisecond,
		Budget: &vramguard.Budget{Headroom: headroom, MakeRoom: makeRoom}, Timeouts: vramguard.Timeouts{FirstChunk: 20 * time.Second}})
}

// TestTenantMakesRoomInOrder: an LLM load that needs ComfyUI's memory
// frees it, verified, in the order configured: with First ComfyUI goes
// and another program's small model stays; without it small goes first
// and ComfyUI keeps its cache. EnsureFree reports the release verified.
func TestTenantMakesRoomInOrder(t *testing.T) {
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("First=%v", first), func(t *testing.T) {
			p, c := rendered(t, comfyuitest.Config{SettleLag: 100 * time.Millisecond})
			oc := ollamaClient(t, p, c, 3*gib, true) // llm needs 9 GiB: 8.75 free
			var receipts []*comfyui.Receipt
			if _, err := oc.RegisterTenant(c.Tenant(comfyui.TenantOptions{First: first, OnFree: func(r *comfyui.Receipt) { receipts = append(receipts, r) }})); err != nil {
				t.Fatal(err)
			}
			gen, err := oc.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
			if err != nil || !gen.Loaded || gen.Offload != nil {
				t.Fatalf("GenerateStreaming = %v; want llm admitted, loaded on the GPU", err)
			}
			freed := p.comfy.Held().Models == 0
			if freed != first || p.ollama.Listed("small") != first {
				t.Errorf("ComfyUI freed %v, small listed %v; want ComfyUI freed only with First, small unloaded only without", freed, p.ollama.Listed("small"))
			}
			if first && (len(receipts) != 1 || receipts[0].Outcome != comfyui.OutcomeFreed) {
				t.Errorf("receipts %v; want one, freed", receipts)
			}
		})
	}
	t.Run("EnsureFree", func(t *testing.T) {
		p, c := rendered(t, comfyuitest.Config{})
		oc := ollamaClient(t, p, c, 0, false)
		if _, err := oc.RegisterTenant(c.Tenant(comfyui.TenantOptions{First: true})); err != nil {
			t.Fatal(err)
		}
		rep, err := oc.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, Timeout: 5 * time.Second})
		if err != nil || len(rep.Tenants) != 1 || !rep.Tenants[0].Verified || rep.Tenants[0].Name != comfyui.HolderName || len(rep.Evicted) != 0 {
			t.Errorf("EnsureFree = %+v, %v; want ComfyUI's release verified and enough, nothing evicted", rep, err)
		}
	})
}

// TestRefusalNamesComfyUI: a budget's refusal names ComfyUI's process by
// name among the holders (through Reader), not as "python main.py".
func TestRefusalNamesComfyUI(t *testing.T) {
	p, c := rendered(t, comfyuitest.Config{})
	oc := ollamaClient(t, p, c, 3*gib, false)
	_, err := oc.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	var re *vramguard.RoomError
	if !errors.As(err, &re) {
		t.Fatalf("GenerateStreaming = %v; want the budget's refusal", err)
	}
	i := slices.IndexFunc(re.Holders, func(h vramguard.MemoryHolder) bool { return h.Name == comfyui.HolderName })
	if i < 0 || re.Holders[i].PID != p.comfy.PID() || re.Holders[i].Bytes < 6*gib {
		t.Errorf("holders %+v; want ComfyUI (pid %d) with its 6.25 GiB", re.Holders, p.comfy.PID())
	}
	snap, err := p.ollama.GPU().Snapshot(t.Context())
	if err != nil || slices.ContainsFunc(snap.Devices[0].Processes, func(pr vramguard.GPUProcess) bool { return pr.Command == comfyui.HolderName }) {
		t.Errorf("the inner reader's snapshot was changed: %+v, %v", snap, err)
	}
}

// TestArbitration: while a render runs, a load that needs its memory
// waits for the queue to drain and goes on then (Wait), or is refused at
// once with a retry-after (Refuse); a load that fits beside the render
// goes ahead during it.
func TestArbitration(t *testing.T) {
	const steps = 40 // 400 ms of render
	start := func(t *testing.T, mode comfyui.WhileBusy) (*pair, *comfyui.Client, *vramguard.OllamaClient, *comfyui.Queued) {
		p := newPair(t, comfyuitest.Config{SettleLag: 50 * time.Millisecond})
		c := p.client(t, p.ollama.GPU())
		oc := ollamaClient(t, p, c, 2*gib, true) // llm needs 8 GiB, small 3: 7.75 free while sampling
		if _, err := oc.RegisterTenant(c.Tenant(comfyui.TenantOptions{WhileBusy: mode, RetryAfter: 3 * time.Second})); err != nil {
			t.Fatal(err)
		}
		q, err := c.Submit(t.Context(), workflow(steps, nil))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for p.comfy.Held().Work == 0 && time.Now().Before(deadline) { // sampling: 8.25 GiB held
			time.Sleep(5 * time.Millisecond)
		}
		return p, c, oc, q
	}
	t.Run("Wait", func(t *testing.T) {
		p, c, oc, q := start(t, comfyui.Wait)
		_, err := oc.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		if err != nil || !p.eventTime(comfyuitest.PromptEnd).IsZero() {
			t.Errorf("small (fits beside the render) = %v, render ended %v; want it run during the render", err, !p.eventTime(comfyuitest.PromptEnd).IsZero())
		}
		gen, err := oc.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		done := time.Now()
		if err != nil || !gen.Loaded {
			t.Fatalf("llm during the render = %v; want it admitted once the queue drained", err)
		}
		ended := p.eventTime(comfyuitest.PromptEnd)
		loadReq := lastEvent(p.ollama, vramguardtest.EventLoaded, "llm:latest")
		if ended.IsZero() || loadReq.Before(ended) {
			t.Errorf("llm loaded at %v, the render ended at %v: the load did not wait", loadReq, ended)
		}
		// Bounded from the injected event: the render's end, plus the
		// fake's settle lag and a few polls, not the wall clock of the test.
		if d := done.Sub(ended); d > 3*time.Second {
			t.Errorf("llm admitted %v after the render ended; want within a few polls of it", d)
		}
		res, err := c.Wait(t.Context(), q.PromptID)
		if err != nil || res.Status != "success" {
			t.Errorf("the render = %+v, %v; want it left to finish", res, err)
		}
	})
	t.Run("Refuse", func(t *testing.T) {
		p, c, oc, q := start(t, comfyui.Refuse)
		_, err := oc.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		var re *vramguard.RoomError
		var be *comfyui.BusyError
		if !errors.As(err, &re) || !errors.As(err, &be) || be.PromptID != q.PromptID || re.RetryAfter < 3*time.Second {
			t.Fatalf("llm during the render = %v; want a *RoomError with RetryAfter >= 3s and the *BusyError naming %s", err, q.PromptID)
		}
		if !p.eventTime(comfyuitest.PromptEnd).IsZero() {
			t.Error("refused only after the render ended; want at once")
		}
		if p.ollama.Listed("llm") {
			t.Error("llm was loaded anyway")
		}
		res, err := c.Wait(t.Context(), q.PromptID)
		if err != nil || res.Status != "success" || !p.eventTime(comfyuitest.FreeRequested).IsZero() {
			t.Errorf("the render = %+v, %v, free sent %v; want it untouched", res, err, !p.eventTime(comfyuitest.FreeRequested).IsZero())
		}
	})
}

// lastEvent is when s last logged kind for model, zero if never.
func lastEvent(s *vramguardtest.Server, kind vramguardtest.EventKind, model string) time.Time {
	var at time.Time
	for _, e := range s.Events(model) {
		if e.Kind == kind {
			at = e.At
		}
	}
	return at
}
