package comfyuitest_test

import (
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// torchFigures is /system_stats' torch pool figures.
func torchFigures(t *testing.T, c *comfyuitest.Server) (total, free float64) {
	t.Helper()
	d := comfyGet(t, c, "/system_stats")["devices"].([]any)[0].(map[string]any)
	return d["torch_vram_total"].(float64), d["torch_vram_free"].(float64)
}

// In DynamicVRAM mode (the default) the weights are outside torch's pool:
// an idle ComfyUI holding a 6 GiB checkpoint reads about 0 in
// /system_stats' torch figures while the GPU lists the process with all of
// it; a prompt with another checkpoint leaves the first resident (no move
// into torch's cache, no gc gives it back), and only /free does.
func TestDynamicVRAMWeightsOutsideTorchPool(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{
		Models: map[string]uint64{"a.safetensors": 6 * gib, "b.safetensors": 2 * gib}, WorkBytes: gib,
	})
	if _, outcome := runPrompt(t, c, txt2img("a.safetensors", 2, "x")); outcome != "success" {
		t.Fatal(outcome)
	}
	waitEvent(t, c, comfyuitest.CacheEmptied, "", 0) // the first prompt's activations go back at once
	if total, free := torchFigures(t, c); total != 0 || free != 0 {
		t.Errorf("idle with a 6 GiB checkpoint, torch_vram_total %v, torch_vram_free %v; want 0 and 0", total, free)
	}
	if got := processBytes(t, s.GPU(), c.PID()); got != comfyCtx+6*gib {
		t.Errorf("the GPU lists %d bytes for ComfyUI; want the context and the checkpoint", got)
	}
	if _, outcome := runPrompt(t, c, txt2img("b.safetensors", 2, "y")); outcome != "success" {
		t.Fatal(outcome)
	}
	want := comfyuitest.Memory{Context: comfyCtx, Models: 8 * gib, Cache: gib}
	if h := c.Held(); h != want {
		t.Fatalf("after a prompt without it: Held() = %+v; want %+v (a still resident)", h, want)
	}
	if total, free := torchFigures(t, c); total != float64(gib) || free != float64(gib) {
		t.Errorf("torch_vram_total %v, torch_vram_free %v; want the activations' cache alone, 1 GiB", total, free)
	}
	sys := comfyGet(t, c, "/system_stats")["system"].(map[string]any)
	if sys["comfyui_version"] != comfyuitest.DefaultVersion {
		t.Errorf("comfyui_version %v; want %s", sys["comfyui_version"], comfyuitest.DefaultVersion)
	}
	comfyDo(t, c, http.MethodPost, "/free", map[string]bool{"unload_models": true})
	waitEvent(t, c, comfyuitest.FreeSettled, "", 0)
	if h := c.Held(); h != (comfyuitest.Memory{Context: comfyCtx}) {
		t.Errorf("after /free Held() = %+v; want the context alone", h)
	}
}

// Under pressure in its own prompt DynamicVRAM gives back an idle
// checkpoint's pages first, then streams part of the prompt's own: the
// prompt succeeds, with slower steps than the same prompt fully resident
// (measured in the same run).
func TestDynamicVRAMPagesUnderPressure(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 8 * gib})
	t.Cleanup(s.Close)
	const steps = 40
	c := startComfy(t, s, comfyuitest.Config{
		Models:   map[string]uint64{"a.safetensors": 2 * gib, "b.safetensors": 30 * gib},
		StepTime: 5 * time.Millisecond,
	})
	timed := func(ckpt, text string) time.Duration {
		id, outcome := runPrompt(t, c, txt2img(ckpt, steps, text))
		if outcome != "success" {
			t.Fatalf("%s ended %q: %v", ckpt, outcome, messages(history(t, c, id))["execution_error"])
		}
		start, _ := event(c, comfyuitest.PromptStart, id, 0)
		end, _ := event(c, comfyuitest.PromptEnd, id, 0)
		return end.Time.Sub(start.Time)
	}
	resident := timed("a.safetensors", "x") // 2 GiB of 8: all of it
	// b (30 GiB) on 8: a's pages go, then three quarters of b stream: 8
	// GiB less the 256 MiB context and the 256 MiB headroom is resident
	// (steps about 3.25 times as long).
	paged := timed("b.safetensors", "y")
	e, ok := event(c, comfyuitest.WeightsEvicted, "", 0)
	if !ok || e.Detail != fmt.Sprintf("a.safetensors: %d bytes", 2*gib) {
		t.Errorf("first eviction %+v (%v); want all of a.safetensors's pages", e, ok)
	}
	if h := c.Held(); h.Models != 8*gib-512<<20 {
		t.Errorf("Held().Models = %d; want b resident up to 8 GiB less the context and the headroom", h.Models)
	}
	if _, _, free := s.Memory(); free != 256<<20 {
		t.Errorf("device free %d; want the 256 MiB headroom kept", free)
	}
	if paged < resident*3/2 {
		t.Errorf("a prompt with most of its weights paged took %v, fully resident %v; want it slower", paged, resident)
	}
}

// Activations need real VRAM: when even every weight page given back is
// not enough, the prompt fails with aimdo's RuntimeError "VRAM grow
// failed: N bytes", and the models stay loaded (ComfyUI's out-of-memory
// path does not match it).
func TestDynamicVRAMGrowFailed(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 8 * gib})
	t.Cleanup(s.Close)
	if err := s.Reserve("other program", 4*gib); err != nil {
		t.Fatal(err)
	}
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: 2 * gib}, WorkBytes: 6 * gib})
	id, outcome := runPrompt(t, c, txt2img(sd15, 2, "x"))
	if outcome != "error" {
		t.Fatalf("ended %q; want error", outcome)
	}
	e := messages(history(t, c, id))["execution_error"]
	// 8 GiB less 4 (the other program), the context and the headroom.
	if e["exception_type"] != "RuntimeError" || e["exception_message"] != fmt.Sprintf("VRAM grow failed: %d bytes", 6*gib) || e["node_id"] != "3" {
		t.Errorf("execution_error %v; want KSampler's RuntimeError VRAM grow failed: %d bytes", e, 6*gib)
	}
	if h := c.Held(); h.Work != 0 || h.Models != 2*gib {
		t.Errorf("after the failure Held() = %+v; want the checkpoint still resident, no activations", h)
	}
	for _, ev := range c.Events() {
		if ev.Kind == comfyuitest.FreeApplied {
			t.Errorf("a free was applied after the failure: %+v", ev)
		}
	}
}

// --reserve-vram caps ComfyUI's own total at the device's total less the
// reserve (weights beyond it stream), and both flags appear in argv.
func TestDynamicVRAMReserveAndHeadroom(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 12 * gib})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{
		Models:      map[string]uint64{sd15: 10 * gib},
		ReserveVRAM: 4 * gib, VRAMHeadroom: gib / 2,
	})
	sys := comfyGet(t, c, "/system_stats")["system"].(map[string]any)
	if want := []any{"main.py", "--reserve-vram", "4", "--vram-headroom", "0.5"}; !reflect.DeepEqual(sys["argv"], want) {
		t.Errorf("argv %v; want %v", sys["argv"], want)
	}
	if _, outcome := runPrompt(t, c, txt2img(sd15, 2, "x")); outcome != "success" {
		t.Fatal(outcome)
	}
	if got := c.Held().Total(); got != 8*gib {
		t.Errorf("ComfyUI holds %d; want the cap, 12 GiB less the 4 GiB reserve", got)
	}
}

// Today's POST /prompt refuses a client prompt_id that is not a canonical
// lowercase UUID (400) and a duplicate (409); /api/jobs/{id}/cancel takes
// a queued prompt out and interrupts the running one. ModelPatcher mode
// (0.3.64) takes any id.
func TestDynamicVRAMPromptIDsAndJobs(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: gib}, StepTime: 50 * time.Millisecond})
	post := func(c *comfyuitest.Server, id string) (int, map[string]any) {
		code, body := comfyDo(t, c, http.MethodPost, "/prompt", map[string]any{"prompt": txt2img(sd15, 1000, id), "prompt_id": id})
		return code, decode(t, body)
	}
	for _, id := range []string{"job-1", "0F8FAD5B-D9CB-469F-A165-70867728950E", "0f8fad5bd9cb469fa16570867728950e"} {
		if code, body := post(c, id); code != http.StatusBadRequest || body["error"].(map[string]any)["type"] != "invalid_prompt_id" {
			t.Errorf("prompt_id %q: %d %v; want 400 invalid_prompt_id", id, code, body)
		}
	}
	const running, queued = "0f8fad5b-d9cb-469f-a165-70867728950e", "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	if code, body := post(c, running); code != http.StatusOK || body["prompt_id"] != running {
		t.Fatalf("a canonical id: %d %v", code, body)
	}
	waitEvent(t, c, comfyuitest.PromptStart, running, 0)
	if code, body := post(c, running); code != http.StatusConflict || body["error"].(map[string]any)["message"] != "prompt_id already exists" {
		t.Errorf("a duplicate: %d %v; want 409 prompt_id already exists", code, body)
	}
	if code, _ := post(c, queued); code != http.StatusOK {
		t.Fatal(code)
	}
	cancel := func(id string) any {
		code, body := comfyDo(t, c, http.MethodPost, "/api/jobs/"+id+"/cancel", nil)
		if code != http.StatusOK {
			t.Fatalf("cancel %s: %d %s", id, code, body)
		}
		return decode(t, body)["cancelled"]
	}
	if got := cancel(queued); got != true {
		t.Errorf("cancel a queued prompt: %v", got)
	}
	waitEvent(t, c, comfyuitest.PromptCancelled, queued, 0)
	if got := cancel(running); got != true {
		t.Errorf("cancel the running prompt: %v", got)
	}
	if e := waitEvent(t, c, comfyuitest.PromptEnd, running, 0); e.Detail != "interrupted" {
		t.Errorf("the running prompt ended %q; want interrupted", e.Detail)
	}
	if got := cancel(running); got != false {
		t.Errorf("cancel an ended prompt: %v; want false", got)
	}

	old := startComfy(t, s, comfyuitest.Config{Mode: comfyuitest.ModelPatcher, Models: map[string]uint64{sd15: gib}})
	if code, body := post(old, "job-1"); code != http.StatusOK || body["prompt_id"] != "job-1" {
		t.Errorf("ModelPatcher (0.3.64) with prompt_id job-1: %d %v; want it taken", code, body)
	}
}

// A /free's memory leaves in quarters over SettleLag: a reading in the
// middle has moved but not settled.
func TestDynamicVRAMFreeSettlesGradually(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: 8 * gib}, SettleLag: 400 * time.Millisecond})
	if _, outcome := runPrompt(t, c, txt2img(sd15, 1, "x")); outcome != "success" {
		t.Fatal(outcome)
	}
	var seen []uint64
	comfyDo(t, c, http.MethodPost, "/free", map[string]bool{"unload_models": true})
	comfyWait(t, c, "the free to settle", func() bool {
		m := c.Held().Models
		if len(seen) == 0 || seen[len(seen)-1] != m {
			seen = append(seen, m)
		}
		return m == 0
	})
	if want := []uint64{8 * gib, 6 * gib, 4 * gib, 2 * gib, 0}; !reflect.DeepEqual(seen, want) && !reflect.DeepEqual(seen, want[1:]) {
		t.Errorf("the checkpoint's bytes went %v; want %v", seen, want)
	}
}
