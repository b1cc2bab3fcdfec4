package comfyuitest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A fake ComfyUI (DynamicVRAM, the default) on the simulator's GPU: a
// render loads its checkpoint, outside torch's pool, and /free answers
// before the memory has left.
func ExampleNewServer() {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 << 30})
	defer s.Close()
	c, err := comfyuitest.NewServer(s, comfyuitest.Config{
		Models:    map[string]uint64{"sd15.safetensors": 4 << 30},
		SettleLag: 50 * time.Millisecond,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	post := func(path, body string) int {
		resp, err := c.Client().Post(c.URL().String()+path, "application/json", strings.NewReader(body))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	ended := func(kind comfyuitest.EventKind) func() bool {
		return func() bool {
			return slices.ContainsFunc(c.Events(), func(e comfyuitest.Event) bool { return e.Kind == kind })
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	fmt.Println("POST /prompt:", post("/prompt", `{"prompt": {
		"4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
		"5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
		"6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["4", 1]}},
		"3": {"class_type": "KSampler", "inputs": {"model": ["4", 0], "positive": ["6", 0], "negative": ["6", 0],
			"latent_image": ["5", 0], "seed": 1, "steps": 4, "cfg": 7, "sampler_name": "euler", "scheduler": "normal", "denoise": 1}},
		"8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
		"9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "ComfyUI"}}}}`))
	_ = c.WaitFor(ctx, ended(comfyuitest.PromptEnd))
	fmt.Println("models held:", c.Held().Models>>30, "GiB")
	resp, err := c.Client().Get(c.URL().String() + "/system_stats")
	if err != nil {
		fmt.Println(err)
		return
	}
	var stats struct {
		Devices []struct {
			TorchVRAMTotal uint64 `json:"torch_vram_total"`
		} `json:"devices"`
	}
	err = json.NewDecoder(resp.Body).Decode(&stats)
	resp.Body.Close()
	if err != nil || len(stats.Devices) == 0 {
		fmt.Println("system_stats:", err)
		return
	}
	fmt.Println("torch pool:", stats.Devices[0].TorchVRAMTotal>>20, "MiB (the weights are outside it)")

	fmt.Println("POST /free:", post("/free", `{"unload_models": true}`))
	_ = c.WaitFor(ctx, ended(comfyuitest.FreeSettled))
	_, used, _ := s.Memory()
	fmt.Println("GPU used after the free settled:", used>>20, "MiB (the CUDA context)")
	// Output:
	// POST /prompt: 200
	// models held: 4 GiB
	// torch pool: 0 MiB (the weights are outside it)
	// POST /free: 200
	// GPU used after the free settled: 256 MiB (the CUDA context)
}
