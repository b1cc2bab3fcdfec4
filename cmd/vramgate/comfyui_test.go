package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// newComfy starts the test double's fake ComfyUI on sim's GPU, and a
// client of it; both end with the test.
func newComfy(t *testing.T, sim *vramguardtest.Server, cfg comfyuitest.Config) (*comfyuitest.Server, *comfyui.Client) {
	t.Helper()
	fake, err := comfyuitest.NewServer(sim, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	cu, err := comfyui.New(comfyui.Options{URL: fake.URL().String(), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cu.Close() })
	return fake, cu
}

// With -comfyui, a load that needs ComfyUI's memory is refused (503, a
// Retry-After) while ComfyUI renders, and admitted once the render ended:
// the gate frees ComfyUI's checkpoint, verified on the device, first.
// ComfyUI is the test double's fake (comfyuitest.NewServer), which
// follows ComfyUI 0.3.64's source: no ComfyUI can run here.
func TestComfyUIRender(t *testing.T) {
	const ckpt = "sdxl.safetensors"
	gib := uint64(1 << 30)
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib, StrictVRAM: true, Models: []vramguardtest.ModelConfig{
		{Name: "llm", SizeVRAM: 6 * gib, Chunks: 2},
	}})
	fake, cu := newComfy(t, sim, comfyuitest.Config{Models: map[string]uint64{ckpt: 6 * gib},
		WorkBytes: 2 * gib, StepTime: 10 * time.Millisecond, SettleLag: 50 * time.Millisecond})
	// llm's estimate and 4 GiB kept free do not fit beside the render (7.75
	// GiB free while it samples) nor beside the checkpoint alone.
	g := startGate(t, sim.URL().String(), sim.GPU(), "-comfyui", fake.URL().String(), "-make-room",
		"-reserve", fmt.Sprint(4*gib), "-unload-timeout", "20s")
	wf := comfyui.Workflow{
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": ckpt}},
		"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 512, "height": 512, "batch_size": 1}},
		"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "a lighthouse", "clip": []any{"4", 1}}},
		"7": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "blurry", "clip": []any{"4", 1}}},
		"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"7", 0},
			"latent_image": []any{"5", 0}, "seed": 1, "steps": 60, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
		"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "t"}},
	}
	q, err := cu.Submit(t.Context(), wf)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for fake.Held().Work == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if fake.Held().Work == 0 {
		t.Fatal("the render did not start sampling")
	}
	code, hdr, body := do(t, "POST", g.URL+"/api/generate", `{"model":"llm","prompt":"hi","stream":false}`, clientHeader, "prompt-writer")
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), `"reason":"no room"`) || !strings.Contains(string(body), `"kind":"tenant","holder":"ComfyUI, rendering prompt `+q.PromptID) {
		t.Fatalf("llm during the render: %d %q %s", code, hdr.Get("Retry-After"), body)
	}
	if sim.Requests("llm") != 0 {
		t.Fatal("the refused load reached Ollama")
	}
	res, err := cu.Wait(t.Context(), q.PromptID)
	if err != nil || res.Status != "success" {
		t.Fatalf("the render was disturbed: %+v, %v", res, err)
	}
	for _, e := range fake.Events() {
		if e.Kind == comfyuitest.FreeRequested {
			t.Fatal("the gate asked ComfyUI to free during its render")
		}
	}
	code, hdr, body = do(t, "POST", g.URL+"/api/generate", `{"model":"llm","prompt":"hi","stream":false}`, clientHeader, "prompt-writer")
	var reply struct {
		Done bool `json:"done"`
	}
	if code != 200 || json.Unmarshal(body, &reply) != nil || !reply.Done || !sim.Listed("llm") {
		t.Fatalf("llm after the render: %d %s", code, body)
	}
	if fake.Held().Models != 0 {
		t.Fatalf("ComfyUI still holds %d bytes of checkpoints after the gate made room", fake.Held().Models)
	}
	if a := hdr.Get("X-Vramgate-Admission"); !strings.Contains(a, "checked: memory") {
		t.Fatalf("X-Vramgate-Admission %q", a)
	}
}

// A reservation's make_room asks ComfyUI too (-comfyui), as the gate's
// admissions do: with Ollama's idle model not enough, the room is made
// by freeing ComfyUI's cached checkpoint as well, verified on the device,
// and the receipt names both. Before, make_room ran on a client without
// the tenant and was refused.
func TestMakeRoomAsksComfyUI(t *testing.T) {
	const ckpt = "sdxl.safetensors"
	gib := uint64(1 << 30)
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib, StrictVRAM: true, Models: []vramguardtest.ModelConfig{
		{Name: "llm", SizeVRAM: 6 * gib, Chunks: 2},
	}})
	fake, cu := newComfy(t, sim, comfyuitest.Config{Models: map[string]uint64{ckpt: 6 * gib}, StepTime: time.Millisecond})
	g := startGate(t, sim.URL().String(), sim.GPU(), "-comfyui", fake.URL().String())
	q, err := cu.Submit(t.Context(), comfyui.Workflow{
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": ckpt}},
		"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 512, "height": 512, "batch_size": 1}},
		"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "a lighthouse", "clip": []any{"4", 1}}},
		"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"6", 0},
			"latent_image": []any{"5", 0}, "seed": 1, "steps": 2, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
		"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "t"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := cu.Wait(t.Context(), q.PromptID); err != nil || res.Status != "success" {
		t.Fatalf("render: %+v, %v", res, err)
	}
	if fake.Held().Models == 0 {
		t.Fatal("ComfyUI keeps no checkpoint after its render: nothing for make_room to ask of it")
	}
	load(t, sim.APIClient(), "llm")
	_, _, free := sim.Memory()
	need := free + 6*gib + 2*gib // more than the idle llm alone makes
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", fmt.Sprintf(`{"device":0,"bytes":%d,"for":"render","holder":"script","make_room":true}`, need))
	var a struct {
		Receipt *receipt `json:"receipt"`
	}
	if err := json.Unmarshal(body, &a); err != nil || code != 201 || a.Receipt == nil || len(a.Receipt.Evicted) != 1 ||
		len(a.Receipt.Tenants) != 1 || !a.Receipt.Tenants[0].Verified || a.Receipt.FreeAfter < need {
		t.Fatalf("make_room past Ollama's models: %d %s; want llm evicted and ComfyUI's cache freed, verified", code, body)
	}
	if fake.Held().Models != 0 || sim.Listed("llm") {
		t.Fatalf("ComfyUI holds %d bytes of checkpoints, llm listed %v", fake.Held().Models, sim.Listed("llm"))
	}
}
