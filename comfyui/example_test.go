package comfyui_test

import (
	"context"
	"fmt"
	"log"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Example is the hand-off both ways on the test double: a fake Ollama and
// a fake ComfyUI on one 16 GiB fake GPU, where the LLM (6 GiB) and a
// render (6 GiB checkpoint, 3 GiB working memory) do not fit together.
// On a GPU box, reader is gpu.NewAutoReader's, and the URLs are the
// servers'.
func Example() {
	ctx := context.Background()
	ollama := vramguardtest.New(vramguardtest.Config{TotalVRAM: 16 << 30, StrictVRAM: true,
		Models: []vramguardtest.ModelConfig{{Name: "qwen3:8b", SizeVRAM: 6 << 30}}})
	defer ollama.Close()
	fake, err := comfyuitest.NewServer(ollama, comfyuitest.Config{
		Models: map[string]uint64{"sdxl.safetensors": 6 << 30}, WorkBytes: 3 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer fake.Close()
	reader, ollamaURL, comfyURL, pid := ollama.GPU(), ollama.URL().String(), fake.URL().String(), fake.PID()
	workflow := exampleWorkflow()

	// README: from here
	comfy, err := comfyui.New(comfyui.Options{URL: comfyURL, VRAM: reader, PID: pid})
	if err != nil {
		log.Fatal(err)
	}
	defer comfy.Close()
	llm, err := vramguard.NewClient(vramguard.Options{Host: ollamaURL, VRAM: comfy.Reader(reader),
		Budget: &vramguard.Budget{MakeRoom: true}}) // an LLM load that needs ComfyUI's memory frees it
	if err != nil {
		log.Fatal(err)
	}
	defer llm.Close()
	if _, err := llm.RegisterTenant(comfy.Tenant(comfyui.TenantOptions{})); err != nil {
		log.Fatal(err)
	}
	for round := 1; round <= 2; round++ {
		phase, _ := llm.StartPhase(ctx, "prompts", vramguard.PhaseOptions{NeedBytes: 9 << 30})
		g := phase.Guard()
		gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "qwen3:8b", Prompt: "a lighthouse"}, nil)
		if _, eerr := phase.End(ctx); err != nil || eerr != nil { // End: 9 GiB free, verified
			log.Fatal(err, eerr)
		}
		workflow["6"].Inputs["text"] = fmt.Sprintf("%s, take %d", gen.Text, round)
		if _, err := comfy.Run(ctx, workflow); err != nil {
			log.Fatal(err)
		}
		receipt, err := comfy.Free(ctx, comfyui.FreeRequest{Wait: true}) // measured, never just "sent"
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("round %d: %s; ComfyUI's process holds %d MiB\n", round, receipt.Outcome, receipt.Process.After>>20)
	}
	// README: to here

	// Output:
	// round 1: freed; ComfyUI's process holds 256 MiB
	// round 2: freed; ComfyUI's process holds 256 MiB
}

func exampleWorkflow() comfyui.Workflow {
	return comfyui.Workflow{
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": "sdxl.safetensors"}},
		"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 1024, "height": 1024, "batch_size": 1}},
		"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "", "clip": []any{"4", 1}}},
		"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"6", 0},
			"latent_image": []any{"5", 0}, "seed": 1, "steps": 4, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
		"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "vramguard"}},
	}
}

// ExampleSystemStats_GBFlag reads how ComfyUI was started: its mode and
// the partition its flags make (here the fake, started as "python main.py
// --reserve-vram 10 --vram-headroom 1").
func ExampleSystemStats_GBFlag() {
	ollama := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 << 30})
	defer ollama.Close()
	fake, err := comfyuitest.NewServer(ollama, comfyuitest.Config{ReserveVRAM: 10 << 30, VRAMHeadroom: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer fake.Close()
	comfy, err := comfyui.New(comfyui.Options{URL: fake.URL().String()})
	if err != nil {
		log.Fatal(err)
	}
	defer comfy.Close()

	st, err := comfy.SystemStats(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	reserve, ok := st.GBFlag("--reserve-vram")
	headroom, _ := st.GBFlag("--vram-headroom")
	fmt.Printf("%s; --reserve-vram %d GiB (%v), --vram-headroom %d GiB\n", st.Mode(), reserve>>30, ok, headroom>>30)
	// Output: DynamicVRAM; --reserve-vram 10 GiB (true), --vram-headroom 1 GiB
}
