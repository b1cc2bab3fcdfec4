package comfyui_test

import (
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

const (
	gib  = 1 << 30
	mib  = 1 << 20
	ckpt = "sdxl.safetensors"
)

// pair is a fake Ollama and a fake ComfyUI sharing one 16 GiB fake GPU.
type pair struct {
	ollama *vramguardtest.Server
	comfy  *comfyuitest.Server
}

// newPair starts the two fakes: ComfyUI with a 6 GiB checkpoint, 2 GiB of
// working memory, 10 ms sampler steps (KSampler "steps"), plus cfg's
// settings; Ollama with "llm" (6 GiB) and "small" (1 GiB).
func newPair(t *testing.T, cfg comfyuitest.Config, models ...vramguardtest.ModelConfig) *pair {
	t.Helper()
	if len(models) == 0 {
		models = []vramguardtest.ModelConfig{{Name: "llm", SizeVRAM: 6 * gib}, {Name: "small", SizeVRAM: gib}}
	}
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 16 * gib, StrictVRAM: true, Models: models})
	t.Cleanup(s.Close)
	if cfg.Models == nil {
		cfg.Models = map[string]uint64{ckpt: 6 * gib}
	}
	if cfg.WorkBytes == 0 {
		cfg.WorkBytes = 2 * gib
	}
	if cfg.StepTime == 0 {
		cfg.StepTime = 10 * time.Millisecond
	}
	f, err := comfyuitest.NewServer(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return &pair{ollama: s, comfy: f}
}

// client is a comfyui client of p's ComfyUI reading p's GPU (nil reader:
// none), polling quickly.
func (p *pair) client(t *testing.T, reader vramguard.VRAMReader) *comfyui.Client {
	t.Helper()
	c, err := comfyui.New(comfyui.Options{URL: p.comfy.URL().String(), VRAM: reader, PID: p.comfy.PID(), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// workflow is a text-to-image graph on ckpt with steps sampler steps, and
// extra nodes.
func workflow(steps int, extra comfyui.Workflow) comfyui.Workflow {
	wf := comfyui.Workflow{
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": ckpt}},
		"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 512, "height": 512, "batch_size": 1}},
		"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "a lighthouse", "clip": []any{"4", 1}}},
		"7": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "blurry", "clip": []any{"4", 1}}},
		"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"7", 0},
			"latent_image": []any{"5", 0}, "seed": 1, "steps": steps, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
		"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "t"}},
	}
	for id, n := range extra {
		wf[id] = n
	}
	return wf
}

// eventTime is when the fake last logged an event of kind, zero if never.
func (p *pair) eventTime(kind comfyuitest.EventKind) time.Time {
	var at time.Time
	for _, e := range p.comfy.Events() {
		if e.Kind == kind {
			at = e.Time
		}
	}
	return at
}
