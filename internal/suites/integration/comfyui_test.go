package integration_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// TestAlternatingPipelineWithComfyUI: issue #36 on real servers. A real
// Ollama and the fake ComfyUI share one fake device that follows /api/ps
// (PSGPU: a CPU server's model counts with its size), sized so that the
// LLM and a render do not fit together. Five rounds of prompts (a phase,
// two calls) → verified hand-over → a render → a measured Free: no
// out-of-memory failure, no load spilled, every receipt freed, one load
// per round; each round's hand-over and free times are logged for
// BENCHMARKS.md.
func TestAlternatingPipelineWithComfyUI(t *testing.T) {
	eachVersion(t, func(t *testing.T, s *ollamatest.Server) {
		requireEmpty(t, s, "before the pipeline")
		probe := newClient(t, s, vramguard.Options{})
		if _, err := probe.GenerateStreaming(t.Context(), req(modelA, 1), vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		var size uint64
		ps, err := s.Client().ListRunning(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ps.Models {
			if vramguard.NormalizeModelName(m.Model) == vramguard.NormalizeModelName(modelA) {
				size = uint64(m.Size)
			}
		}
		if _, err := probe.UnloadModel(t.Context(), modelA); err != nil || size < 64<<10 {
			t.Fatalf("sizing %s: %d bytes, unload %v; the test needs more than 64 KiB", modelA, size, err)
		}
		// The budget admits a load on the library's estimate (newer
		// servers list the stand-in smaller than it): the device is sized
		// on the larger of the two.
		est, err := probe.EstimateModel(t.Context(), modelA, 0)
		if err != nil {
			t.Fatal(err)
		}
		size = max(size, uint64(est.Total))
		// ComfyUI (DynamicVRAM, the fake's default): a checkpoint the LLM's
		// size, working memory half of it, a 4 KiB context, and the
		// headroom it keeps free while it allocates. The device holds
		// either side, not both: a render's room is the checkpoint, the
		// working memory and that headroom.
		ckptBytes, work, ctxBytes := size, size/2, uint64(4<<10)
		room := ckptBytes + work + comfyuitest.DynamicVRAMHeadroom
		dev := &vramguardtest.PSGPU{Client: s.Client(), Total: size + ctxBytes + room - 16<<10}
		fake, err := comfyuitest.NewServer(dev, comfyuitest.Config{
			Models: map[string]uint64{"ckpt.safetensors": ckptBytes}, WorkBytes: work, ContextBytes: ctxBytes,
			StepTime: 5 * time.Millisecond, SettleLag: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer fake.Close()
		free := comfyui.FreeRequest{Tolerance: 1 << 10, Interval: 20 * time.Millisecond}
		cc, err := comfyui.New(comfyui.Options{URL: fake.URL().String(), VRAM: dev, PID: fake.PID(), PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		c := newClient(t, s, vramguard.Options{VRAM: cc.Reader(dev), VRAMPollInterval: 20 * time.Millisecond, Budget: &vramguard.Budget{MakeRoom: true}})
		if _, err := c.RegisterTenant(cc.Tenant(comfyui.TenantOptions{Free: free})); err != nil {
			t.Fatal(err)
		}
		wf := comfyui.Workflow{
			"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": "ckpt.safetensors"}},
			"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 512, "height": 512, "batch_size": 1}},
			"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "", "clip": []any{"4", 1}}},
			"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"6", 0},
				"latent_image": []any{"5", 0}, "seed": 1, "steps": 10, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
			"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
			"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "it"}},
		}
		const rounds = 5
		for r := 1; r <= rounds; r++ {
			phase, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: room,
				Reserve: vramguard.ReserveOptions{For: fmt.Sprintf("render %d", r), PID: fake.PID()}})
			if err != nil {
				t.Fatal(err)
			}
			loads := 0
			runners := map[int]bool{}
			prompt := ""
			for i := range 2 {
				g := phase.Guard()
				gen, err := g.Generate(t.Context(), req(modelA, 4), nil)
				if err != nil {
					_, _ = phase.End(t.Context())
					t.Fatalf("round %d call %d: %v (kind %v)", r, i, err, vramguard.KindOf(err))
				}
				// A CPU server lists every model with size_vram 0: wholly on
				// the CPU by construction, not spilled. A split (part on the
				// device, part not) is a spill.
				if o := gen.Offload; o != nil && o.SizeVRAM > 0 {
					t.Errorf("round %d: load spilled to the CPU: %v", r, o)
				}
				// A load is a new runner process. Generation.Loaded rests on
				// load_duration reaching 10 ms, which a reuse can on a busy
				// machine (v0.34.4 reported it once, its runner unchanged).
				if pids, err := s.RunnerPIDs(); err == nil {
					fresh := 0
					for _, p := range pids {
						if !runners[p] {
							runners[p] = true
							fresh++
						}
					}
					loads += fresh
					if gen.Loaded && fresh == 0 {
						t.Logf("round %d call %d: Loaded with load_duration %v on the round's runner %v (a slow reuse)", r, i, gen.Metrics.LoadDuration, pids)
					}
				} else if gen.Loaded {
					loads++
				}
				prompt = gen.Text
			}
			rep, err := phase.End(t.Context())
			if err != nil || rep.Handover == nil || rep.Handover.FreeAfter < room {
				t.Fatalf("round %d: hand-over %+v, %v; want the render's room, verified", r, rep, err)
			}
			if res := rep.Handover.Reservation; res == nil || res.Info().Bytes != room {
				t.Fatalf("round %d: hand-over reserved %v; want the render's room", r, res)
			}
			wf["6"].Inputs["text"] = prompt
			wf["3"].Inputs["seed"] = r // a graph ComfyUI ran already is answered from its cache
			if res, err := cc.Run(t.Context(), wf); err != nil || res.Status != "success" {
				t.Fatalf("round %d: render %+v, %v (kind %v)", r, res, err, vramguard.KindOf(err))
			}
			if err := rep.Handover.Reservation.Release(); err != nil {
				t.Fatalf("round %d: release of the render's reservation: %v", r, err)
			}
			fr := free
			fr.Wait = true
			rc, err := cc.Free(t.Context(), fr)
			if err != nil || rc.Outcome != comfyui.OutcomeFreed || !rc.Process.Known || !rc.Torch.Known || rc.Mode != comfyui.ModeDynamicVRAM {
				t.Fatalf("round %d: free %v, %v; want a measured freed receipt, DynamicVRAM", r, rc, err)
			}
			if fake.Held().Models != 0 {
				t.Errorf("round %d: receipt %s, but the fake still holds %+v", r, rc, fake.Held())
			}
			if loads != 1 {
				t.Errorf("round %d: %d loads; want 1 (the phase keeps the model warm between its calls)", r, loads)
			}
			t.Logf("%s round %d: loads %d, hand-over %v, free %v (%s)", s.Version(), r, loads,
				rep.Handover.Elapsed.Round(time.Millisecond), rc.Elapsed.Round(time.Millisecond), fmt.Sprint(rc))
		}
		requireEmpty(t, s, "after the pipeline")
	})
}
