package comfyui_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// busy is a pair whose ComfyUI runs a render of steps 10 ms steps, once
// it samples (8.25 GiB held: context, checkpoint, activations).
func busy(t *testing.T, cfg comfyuitest.Config, steps int) (*pair, *comfyui.Client, *comfyui.Queued) {
	t.Helper()
	p := newPair(t, cfg)
	c := p.client(t, p.ollama.GPU())
	q, err := c.Submit(t.Context(), workflow(steps, nil))
	if err != nil {
		t.Fatal(err)
	}
	waitFake(t, p, func() bool { return p.comfy.Held().Work > 0 })
	return p, c, q
}

// Defect 1 and 2 of issue #46: EnsureFree{Timeout: 1s} waited out a whole
// 10 s render (the tenant's wait for the queue ignored the call's
// timeout), and when such a wait did end the error was KindInternal or
// canceled, without a *RoomError, a holder or DeadlineExceeded. Now the
// wait ends with the call's bound: a *RoomError of KindTimeout naming
// ComfyUI among the holders, errors.Is(err, context.DeadlineExceeded),
// and the running prompt's id and queue length in a *comfyui.WaitError.
func TestTenantWaitEndsWithTheCallsTimeout(t *testing.T) {
	p, c, q := busy(t, comfyuitest.Config{}, 1000) // a 10 s render
	oc := ollamaClient(t, p, c, 0, false)
	if _, err := oc.RegisterTenant(c.Tenant(comfyui.TenantOptions{First: true})); err != nil {
		t.Fatal(err)
	}
	const timeout = time.Second
	start := time.Now()
	_, err := oc.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, Timeout: timeout})
	took := time.Since(start)
	if !p.eventTime(comfyuitest.PromptEnd).IsZero() {
		t.Errorf("EnsureFree returned after the render ended (%v); want within its 1 s timeout", took)
	}
	var re *vramguard.RoomError
	var we *comfyui.WaitError
	switch {
	case !errors.As(err, &re):
		t.Fatalf("EnsureFree = %v (%T); want a *RoomError", err, err)
	case vramguard.KindOf(err) != vramguard.KindTimeout || !errors.Is(err, vramguard.KindTimeout):
		t.Errorf("kind %v; want timeout (%v)", vramguard.KindOf(err), err)
	case !errors.Is(err, context.DeadlineExceeded):
		t.Errorf("errors.Is(err, DeadlineExceeded) false: %v", err)
	case !errors.As(err, &we) || we.PromptID != q.PromptID || we.Queued != 1:
		t.Errorf("WaitError %+v; want prompt %s, 1 in the queue (%v)", we, q.PromptID, err)
	}
	if re != nil && !slices.ContainsFunc(re.Holders, func(h vramguard.MemoryHolder) bool { return h.Name == comfyui.HolderName }) {
		t.Errorf("holders %+v; want ComfyUI named", re.Holders)
	}
	if !strings.Contains(err.Error(), q.PromptID) {
		t.Errorf("error %q does not name the prompt", err)
	}
}

// Defect 3 of issue #46: a free that settles slower than Settle reported
// the memory still on its way back as pinned. Now a free whose readings
// had not settled when its bound ended is pending, with what is still
// held on its way; in both modes.
func TestSlowSettleIsPendingNotPinned(t *testing.T) {
	for _, mode := range []comfyuitest.Mode{comfyuitest.DynamicVRAM, comfyuitest.ModelPatcher} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, comfyuitest.Config{Mode: mode, SettleLag: 3 * time.Second})
			c := p.client(t, p.ollama.GPU())
			if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
				t.Fatal(err)
			}
			rc, err := c.Free(t.Context(), comfyui.FreeRequest{Settle: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if rc.Outcome != comfyui.OutcomePending || rc.Settled || rc.Pinned > rc.Tolerance || strings.Contains(rc.String(), "B pinned") {
				t.Errorf("receipt %s; want pending, nothing called pinned", rc)
			}
			if rc.Pending < 4*gib || rc.Pending > 6*gib+256*mib+rc.Tolerance {
				t.Errorf("Pending %d; want the checkpoint's memory still on its way (%s)", rc.Pending, rc)
			}
		})
	}
}

// Defect 4 of issue #46: a Free where nothing moves waited the whole
// Settle (15 s by default) before saying so. Now it says so once the
// readings have agreed with the first for FreeRequest.Quiet.
func TestNothingMovedEndsEarly(t *testing.T) {
	pin := comfyui.Workflow{"1": {ClassType: "PinLoader", Inputs: map[string]any{}}}
	p := newPair(t, comfyuitest.Config{CustomNodes: map[string]comfyuitest.CustomNode{"PinLoader": {PinBytes: 2 * gib, Output: true}}})
	c := p.client(t, p.ollama.GPU())
	if _, err := c.Run(t.Context(), pin); err != nil {
		t.Fatal(err)
	}
	const settle = 20 * time.Second
	rc, err := c.Free(t.Context(), comfyui.FreeRequest{Settle: settle, Quiet: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Elapsed > settle/4 {
		t.Errorf("a free where nothing moved took %v; want it said well before Settle (%v)", rc.Elapsed, settle)
	}
	if rc.Outcome != comfyui.OutcomePartlyFreed || !rc.Settled || rc.Released() > rc.Tolerance || rc.Pinned < 2*gib-rc.Tolerance {
		t.Errorf("receipt %s; want partly freed, settled, nothing back, 2 GiB pinned", rc)
	}
}

// An idle DynamicVRAM ComfyUI holding a 6 GiB checkpoint reads about 0 in
// torch's pool; the tenant's size comes from the device (its process), a
// dry run plans it, a real EnsureFree that needs the room frees it, and
// the receipt's figures are the fake GPU's per-process memory; the mode is
// in the receipt.
func TestDynamicVRAMTenantMeasuredFromTheDevice(t *testing.T) {
	p, c := rendered(t, comfyuitest.Config{})
	st, err := c.SystemStats(t.Context())
	if err != nil || st.Devices[0].TorchVRAMTotal > 64*mib {
		t.Fatalf("torch pool %+v, %v; want about 0 (weights outside it)", st, err)
	}
	if got := st.Mode(); got != comfyui.ModeDynamicVRAM {
		t.Errorf("SystemStats.Mode() = %q; want DynamicVRAM", got)
	}
	held := p.comfy.Held().Total()
	var receipts []*comfyui.Receipt
	tenant := c.Tenant(comfyui.TenantOptions{First: true, OnFree: func(r *comfyui.Receipt) { receipts = append(receipts, r) }})
	size, err := tenant.Size(t.Context())
	if err != nil || size < 6*gib || size > held {
		t.Errorf("tenant Size = %d, %v; want at least the 6 GiB checkpoint, at most the process's %d", size, err, held)
	}
	oc := ollamaClient(t, p, c, 0, false)
	if _, err := oc.RegisterTenant(tenant); err != nil {
		t.Fatal(err)
	}
	// 8.75 GiB free of 16: 12 needs ComfyUI's memory.
	dry, err := oc.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, DryRun: true})
	if err != nil || !slices.Contains(dry.Plan, comfyui.HolderName) {
		t.Errorf("dry run = %+v, %v; want ComfyUI planned", dry, err)
	}
	rep, err := oc.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, Timeout: 10 * time.Second})
	if err != nil || len(rep.Tenants) != 1 || !rep.Tenants[0].Verified {
		t.Fatalf("EnsureFree = %+v, %v; want ComfyUI's release verified", rep, err)
	}
	if len(receipts) != 1 {
		t.Fatalf("%d receipts; want 1", len(receipts))
	}
	rc := receipts[0]
	after := p.comfy.Held().Total()
	if rc.Outcome != comfyui.OutcomeFreed || rc.Mode != comfyui.ModeDynamicVRAM || !rc.Process.Known ||
		rc.Process.Before != held || rc.Process.After != after || rc.Released() != held-after {
		t.Errorf("receipt %s (mode %q); want freed, DynamicVRAM, the process %d → %d as the fake GPU lists it", rc, rc.Mode, held, after)
	}
}

// Without a GPU reader the tenant's size is unknown (tried, not counted),
// whatever torch's pool says.
func TestTenantSizeUnknownWithoutAReader(t *testing.T) {
	p := newPair(t, comfyuitest.Config{Mode: comfyuitest.ModelPatcher})
	c := p.client(t, nil)
	if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
		t.Fatal(err)
	}
	if st, err := c.SystemStats(t.Context()); err != nil || st.Devices[0].TorchVRAMTotal < 6*gib {
		t.Fatalf("stats %+v, %v; want the checkpoint in torch's pool", st, err)
	}
	if size, err := c.Tenant(comfyui.TenantOptions{}).Size(t.Context()); err == nil {
		t.Errorf("tenant Size without a reader = %d; want unknown (an error)", size)
	}
}

// A prompt that fails with aimdo's "VRAM grow failed" is KindOutOfMemory,
// with the bytes.
func TestVRAMGrowFailedIsOutOfMemory(t *testing.T) {
	p := newPair(t, comfyuitest.Config{WorkBytes: 20 * gib})
	c := p.client(t, p.ollama.GPU())
	_, err := c.Run(t.Context(), workflow(2, nil))
	var ee *comfyui.ExecutionError
	if vramguard.KindOf(err) != vramguard.KindOutOfMemory || !errors.As(err, &ee) || ee.Bytes != 20*gib || ee.PromptID == "" {
		t.Errorf("Run = %v (%+v); want KindOutOfMemory, an ExecutionError with 20 GiB and the prompt id", err, ee)
	}
}

// Run whose ctx ends interrupts its own prompt: nothing is left running
// or queued on ComfyUI, and the error names the prompt; today through
// /api/jobs/{id}/cancel, on 0.3.64 (no /api/jobs) through /interrupt.
func TestRunCancelledLeavesNothingRunning(t *testing.T) {
	for _, mode := range []comfyuitest.Mode{comfyuitest.DynamicVRAM, comfyuitest.ModelPatcher} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, comfyuitest.Config{Mode: mode})
			c := p.client(t, p.ollama.GPU())
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				_ = p.comfy.WaitFor(ctx, func() bool { return p.comfy.Held().Work > 0 })
				cancel()
			}()
			_, err := c.Run(ctx, workflow(1000, nil)) // a 10 s render
			var we *comfyui.WaitError
			if !errors.Is(err, vramguard.KindCanceled) || !errors.As(err, &we) || we.PromptID == "" || !strings.Contains(err.Error(), we.PromptID) {
				t.Fatalf("Run = %v; want KindCanceled with a *WaitError naming the prompt", err)
			}
			waitFake(t, p, func() bool { return !p.eventTime(comfyuitest.PromptEnd).IsZero() })
			ev := p.comfy.Events()
			i := slices.IndexFunc(ev, func(e comfyuitest.Event) bool { return e.Kind == comfyuitest.PromptEnd })
			if ev[i].PromptID != we.PromptID || ev[i].Detail != "interrupted" {
				t.Errorf("the prompt ended %+v; want %s interrupted", ev[i], we.PromptID)
			}
			q, err := c.Queue(t.Context())
			if err != nil || q.Busy() {
				t.Errorf("queue %+v, %v; want nothing running or waiting", q, err)
			}
		})
	}
}

// A ComfyUI whose version says nothing is judged by how it behaves: a
// process holding far more than torch's pool holds DynamicVRAM's weights.
func TestModeFromBehaviour(t *testing.T) {
	p := newPair(t, comfyuitest.Config{Version: "nightly"})
	c := p.client(t, p.ollama.GPU())
	if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
		t.Fatal(err)
	}
	st, err := c.SystemStats(t.Context())
	if err != nil || st.Mode() != comfyui.ModeUnknown {
		t.Fatalf("SystemStats.Mode() = %v, %v; want unknown for version nightly", st, err)
	}
	rc, err := c.Free(t.Context(), comfyui.FreeRequest{})
	if err != nil || rc.Mode != comfyui.ModeDynamicVRAM || rc.Outcome != comfyui.OutcomeFreed {
		t.Errorf("Free = %s, %v; want freed, mode DynamicVRAM from the readings", rc, err)
	}
}

// The tenant's debug log line, while it waits for the queue, names
// ComfyUI's mode, reserve and headroom.
func TestTenantLogsTheLaunch(t *testing.T) {
	p := newPair(t, comfyuitest.Config{ReserveVRAM: 4 * gib, VRAMHeadroom: gib})
	var logs safeBuffer
	c, err := comfyui.New(comfyui.Options{URL: p.comfy.URL().String(), VRAM: p.ollama.GPU(), PID: p.comfy.PID(), PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Submit(t.Context(), workflow(1000, nil)); err != nil {
		t.Fatal(err)
	}
	waitFake(t, p, func() bool { return p.comfy.Held().Work > 0 })
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err = c.Tenant(comfyui.TenantOptions{}).Release(ctx)
	if !errors.Is(err, vramguard.KindTimeout) {
		t.Errorf("Release = %v; want KindTimeout", err)
	}
	out := logs.String()
	for _, want := range []string{"waits for the queue to drain", "mode=DynamicVRAM", `reserve_vram="4.0 GiB"`, `vram_headroom="1.0 GiB"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
}

// safeBuffer is a bytes.Buffer safe for concurrent use.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *safeBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// ComfyUI's 400 and 409 for a prompt are *PromptError values of
// KindInvalidInput with the status.
func TestPromptIDRefusals(t *testing.T) {
	for _, tt := range []struct {
		code int
		body string
		typ  string
	}{
		{http.StatusBadRequest, `{"error": {"type": "invalid_prompt_id", "message": "Invalid prompt_id", "details": "", "extra_info": {}}, "node_errors": {}}`, "invalid_prompt_id"},
		{http.StatusConflict, `{"error": {"type": "prompt_id_exists", "message": "prompt_id already exists", "details": "", "extra_info": {}}, "node_errors": {}}`, "prompt_id_exists"},
		{http.StatusConflict, `prompt_id already exists`, ""},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(tt.code)
			_, _ = w.Write([]byte(tt.body))
		}))
		c, err := comfyui.New(comfyui.Options{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Submit(t.Context(), workflow(1, nil))
		var pe *comfyui.PromptError
		if vramguard.KindOf(err) != vramguard.KindInvalidInput || !errors.As(err, &pe) || pe.Status != tt.code || pe.Type != tt.typ {
			t.Errorf("%d %s: Submit = %v (%+v); want KindInvalidInput, a *PromptError with the status and type %q", tt.code, tt.body, err, pe, tt.typ)
		}
		c.Close()
		srv.Close()
	}
}

// SystemStats.Mode from what ComfyUI reports, and GBFlag on the argv
// forms ComfyUI takes (and what it does not).
func TestModeAndFlagsFromStats(t *testing.T) {
	stats := func(version, typ string, argv ...string) *comfyui.SystemStats {
		st := &comfyui.SystemStats{Devices: []comfyui.StatsDevice{{Type: typ}}}
		st.System.ComfyUIVersion, st.System.Argv = version, argv
		return st
	}
	for _, tt := range []struct {
		st   *comfyui.SystemStats
		want comfyui.Mode
	}{
		{stats("0.25.0", "cuda", "main.py"), comfyui.ModeDynamicVRAM},
		{stats("0.18.0", "cuda"), comfyui.ModeDynamicVRAM},
		{stats("1.2.3", "cuda"), comfyui.ModeDynamicVRAM},
		{stats("0.17.9", "cuda"), comfyui.ModeModelPatcher},
		{stats("0.3.64", "cuda"), comfyui.ModeModelPatcher},
		{stats("0.25.0", "cuda", "main.py", "--disable-dynamic-vram"), comfyui.ModeModelPatcher},
		{stats("0.25.0", "cuda", "main.py", "--highvram"), comfyui.ModeModelPatcher},
		{stats("0.25.0", "mps"), comfyui.ModeModelPatcher},
		{stats("", "cuda"), comfyui.ModeUnknown},
		{stats("nightly", "cuda"), comfyui.ModeUnknown},
	} {
		if got := tt.st.Mode(); got != tt.want {
			t.Errorf("Mode(%q, %q, %q) = %q; want %q", tt.st.System.ComfyUIVersion, tt.st.Devices[0].Type, tt.st.System.Argv, got, tt.want)
		}
	}
	for _, tt := range []struct {
		argv []string
		want uint64
		ok   bool
	}{
		{[]string{"main.py", "--reserve-vram", "4"}, 4 * gib, true},
		{[]string{"main.py", "--reserve-vram=0.5"}, gib / 2, true},
		{[]string{"main.py", "--reserve-vram"}, 0, false},
		{[]string{"main.py", "--reserve-vram", "-1"}, 0, false},
		{[]string{"main.py", "--reserve-vram", "lots"}, 0, false},
		{[]string{"main.py", "--reserve-vram", "1e300"}, 0, false},
		{[]string{"main.py", "--reserve-vram", "NaN"}, 0, false},
		{[]string{"main.py", "--vram-headroom", "2"}, 0, false},
		{nil, 0, false},
	} {
		got, ok := stats("0.25.0", "cuda", tt.argv...).GBFlag("--reserve-vram")
		if got != tt.want || ok != tt.ok {
			t.Errorf("GBFlag(--reserve-vram) in %q = %d, %v; want %d, %v", tt.argv, got, ok, tt.want, tt.ok)
		}
	}
}

// Where the reader lists processes but not ComfyUI's (a container, a PID
// not found), the tenant's size is the device's used memory less what
// Ollama's processes hold.
func TestTenantSizeWithoutItsProcess(t *testing.T) {
	p, _ := rendered(t, comfyuitest.Config{})
	c, err := comfyui.New(comfyui.Options{URL: p.comfy.URL().String(), VRAM: hide{p.ollama.GPU(), p.comfy.PID()}, PID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	size, err := c.Tenant(comfyui.TenantOptions{}).Size(t.Context())
	if held := p.comfy.Held().Total(); err != nil || size != held {
		t.Errorf("Size = %d, %v; want the memory Ollama's runner (small) does not account for, ComfyUI's %d", size, err, held)
	}
	// Listed but not found (no PID): another program's memory counts as
	// ComfyUI's too, never less than ComfyUI holds.
	if err := p.ollama.Reserve("other program", gib); err != nil {
		t.Fatal(err)
	}
	c2, err := comfyui.New(comfyui.Options{URL: p.comfy.URL().String(), VRAM: p.ollama.GPU(), PID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	size, err = c2.Tenant(comfyui.TenantOptions{}).Size(t.Context())
	if held := p.comfy.Held().Total(); err != nil || size != held+gib {
		t.Errorf("Size = %d, %v; want ComfyUI's %d and the other program's 1 GiB", size, err, held)
	}
}

// hide is a reader whose snapshots do not list one process (its memory
// still counted as used).
type hide struct {
	inner vramguard.VRAMReader
	pid   uint32
}

func (h hide) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	snap, err := h.inner.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	out := *snap
	out.Devices = slices.Clone(snap.Devices)
	for i := range out.Devices {
		out.Devices[i].Processes = slices.DeleteFunc(slices.Clone(out.Devices[i].Processes), func(p vramguard.GPUProcess) bool { return p.PID == h.pid })
	}
	return &out, nil
}

// A budget's load that needs a busy ComfyUI's memory waits for the render
// within the generation's first-chunk timeout, not the render's length:
// the refusal is the *RoomError naming ComfyUI, with the first-chunk
// timeout, context.DeadlineExceeded and KindTimeout in its chain, and the
// *WaitError naming the running prompt. (Its KindOf is the budget's
// refusal, KindOutOfMemory.)
func TestBudgetWaitEndsWithTheFirstChunkTimeout(t *testing.T) {
	p, c, q := busy(t, comfyuitest.Config{}, 1000) // a 10 s render
	oc := vramguardtest.NewClient(t, p.ollama, vramguard.Options{VRAM: c.Reader(p.ollama.GPU()), VRAMPollInterval: 10 * time.Millisecond,
		Budget: &vramguard.Budget{Headroom: 2 * gib, MakeRoom: true}, Timeouts: vramguard.Timeouts{FirstChunk: time.Second}})
	if _, err := oc.RegisterTenant(c.Tenant(comfyui.TenantOptions{})); err != nil {
		t.Fatal(err)
	}
	_, err := oc.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	if !p.eventTime(comfyuitest.PromptEnd).IsZero() {
		t.Error("the load was refused only after the render ended; want at its first-chunk timeout")
	}
	var re *vramguard.RoomError
	var we *comfyui.WaitError
	if !errors.As(err, &re) || !errors.Is(err, vramguard.ErrFirstChunkTimeout) || !errors.Is(err, context.DeadlineExceeded) ||
		!errors.Is(err, vramguard.KindTimeout) || !errors.As(err, &we) || we.PromptID != q.PromptID {
		t.Fatalf("GenerateStreaming = %v; want a *RoomError with the first-chunk timeout, DeadlineExceeded, KindTimeout and the *WaitError of %s", err, q.PromptID)
	}
	if !slices.ContainsFunc(re.Holders, func(h vramguard.MemoryHolder) bool { return h.Name == comfyui.HolderName }) {
		t.Errorf("holders %+v; want ComfyUI named", re.Holders)
	}
}

// A Submit whose answer comes later than Options.Timeout may have queued
// its prompt: the error (ErrBusy) names the id, and the prompt is
// cancelled, so that nothing runs that no one waits for.
func TestSubmitBusyCancelsItsPrompt(t *testing.T) {
	p := newPair(t, comfyuitest.Config{})
	target := p.comfy.URL()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := p.comfy.Client().Do(mustProxy(t, r, target.String()))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		if r.URL.Path == "/prompt" {
			<-r.Context().Done() // the answer never comes in time
			return
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	defer slow.Close()
	c, err := comfyui.New(comfyui.Options{URL: slow.URL, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Submit(t.Context(), workflow(1000, nil))
	var we *comfyui.WaitError
	if !errors.Is(err, comfyui.ErrBusy) || !errors.As(err, &we) || we.PromptID == "" {
		t.Fatalf("Submit = %v; want ErrBusy with a *WaitError naming the prompt", err)
	}
	gone := func() bool {
		for _, e := range p.comfy.Events() {
			if e.PromptID == we.PromptID && (e.Kind == comfyuitest.PromptCancelled || e.Kind == comfyuitest.PromptEnd) {
				return true
			}
		}
		return false
	}
	waitFake(t, p, gone)
	if q, err := p.client(t, nil).Queue(t.Context()); err != nil || q.Busy() {
		t.Errorf("queue %+v, %v; want the prompt gone (events %+v)", q, err, p.comfy.Events())
	}
}

// mustProxy is r sent on to target.
func mustProxy(t *testing.T, r *http.Request, target string) *http.Request {
	t.Helper()
	out, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, target+r.URL.RequestURI(), r.Body)
	if err != nil {
		t.Error(err)
		return r
	}
	out.Header = r.Header.Clone()
	return out
}

// waitFake waits for cond on p's fake ComfyUI, failing the test after 30 s
// (a bound far above what the fake takes, for a hang, not a timing).
func waitFake(t *testing.T, p *pair, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := p.comfy.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting on the fake ComfyUI: %v", err)
	}
}
