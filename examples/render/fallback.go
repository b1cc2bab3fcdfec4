package main

// This file is the example's fallback when neither server answers:
// vramguard's test double (package vramguardtest), a fake Ollama and a
// fake ComfyUI sharing one fake 16 GiB GPU. Like the rest of the example
// it uses only public packages, so you can copy it whole.

import (
	"time"

	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Sizes of the simulated setup: the LLM (6.5 GiB) and ComfyUI with its
// checkpoint and working memory loaded (9.75 GiB) do not fit together.
const (
	simGPU        = 16 << 30
	simModel      = "qwen3:8b"
	simLLM        = 6656 << 20 // 6.5 GiB
	simCheckpoint = "sdxl_base_1.0.safetensors"
	simCkptBytes  = 6656 << 20 // 6.5 GiB
	simWork       = 3 << 30
	simNeed       = simCkptBytes + simWork // what a render needs free beside ComfyUI's CUDA context
)

// double is the running test double.
type double struct {
	ollama *vramguardtest.Server
	comfy  *comfyuitest.Server
}

func startDouble() (*double, error) {
	srv := vramguardtest.New(vramguardtest.Config{
		TotalVRAM:  simGPU,
		StrictVRAM: true,
		Models: []vramguardtest.ModelConfig{{Name: simModel, SizeVRAM: simLLM, LoadLatency: 300 * time.Millisecond, TokenLatency: 2 * time.Millisecond,
			Respond: func(string) []vramguardtest.Chunk {
				var cs []vramguardtest.Chunk
				for _, w := range []string{"A lone ", "lighthouse ", "on a rugged ", "cliff at dusk, ", "warm beam ", "through sea mist, ", "cinematic"} {
					cs = append(cs, vramguardtest.Chunk{Text: w})
				}
				return cs
			}}},
	})
	comfy, err := comfyuitest.NewServer(srv, comfyuitest.Config{
		Models:    map[string]uint64{simCheckpoint: simCkptBytes},
		WorkBytes: simWork,
		StepTime:  10 * time.Millisecond,
		SettleLag: 150 * time.Millisecond,
	})
	if err != nil {
		srv.Close()
		return nil, err
	}
	return &double{ollama: srv, comfy: comfy}, nil
}

// setup builds the clients on the double.
func (d *double) setup(cfg *config) (*setup, error) {
	cfg.comfy = d.comfy.URL().String()
	st, err := build(cfg, d.ollama.URL().String(), d.ollama.GPU(), d.comfy.PID(), simWorkflow())
	if err != nil {
		return nil, err
	}
	inner := st.close
	st.close = func() { inner(); d.close() }
	return st, nil
}

func (d *double) close() {
	d.comfy.Close()
	d.ollama.Close()
}

// simWorkflow is ComfyUI's default text-to-image graph in API format.
func simWorkflow() comfyui.Workflow {
	return comfyui.Workflow{
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": simCheckpoint}},
		"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 1024, "height": 1024, "batch_size": 1}},
		"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "", "clip": []any{"4", 1}}},
		"7": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "blurry, watermark", "clip": []any{"4", 1}}},
		"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"7", 0},
			"latent_image": []any{"5", 0}, "seed": 42, "steps": 20, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
		"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "vramguard"}},
	}
}
