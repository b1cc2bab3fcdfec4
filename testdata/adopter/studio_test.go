package adopter_test

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/png"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"

	"example.com/adopter"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// renders records the prompts Studio.Render got, and what the GPU held
// when each came.
type renders struct {
	mu      sync.Mutex
	prompts []string
	used    []uint64
}

func (r *renders) calls() ([]string, []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.prompts...), append([]uint64(nil), r.used...)
}

// newStudio starts a simulated Ollama server with models and a Studio
// on it whose Render records what it got. opts are the client's options;
// Host is set to the server's.
func newStudio(t *testing.T, cfg vramguardtest.Config, opts vramguard.Options) (*vramguardtest.Server, *adopter.Studio, *renders) {
	t.Helper()
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	opts.Host = s.URL().String()
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	r := &renders{}
	st := &adopter.Studio{Client: c, Model: "llama3.2", VisionModel: "llava", Render: func(ctx context.Context, prompt string) error {
		_, used, _ := s.Memory()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.prompts = append(r.prompts, prompt)
		r.used = append(r.used, used)
		return nil
	}}
	return s, st, r
}

// gpuEmpty fails the test if anything holds memory on the simulated GPU
// or the server lists a model.
func gpuEmpty(t *testing.T, s *vramguardtest.Server) {
	t.Helper()
	if h := s.Holders(); len(h) != 0 {
		t.Errorf("the GPU is still held: %+v", h)
	}
	for _, r := range s.Running() {
		if !r.Loading {
			t.Errorf("the server still lists %s: %+v", r.Model, r)
		}
	}
}

// A phase of three prompts loads the model once, and the diffusion stage
// finds it unloaded, verified, and the GPU empty.
func TestBatchUnloadsVerifiedAndLoadsOnce(t *testing.T) {
	s, st, r := newStudio(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "llama3.2", Size: 2 << 30, LoadLatency: 20 * time.Millisecond},
	}}, vramguard.Options{})

	prompts, rep, err := st.Batch(t.Context(), []string{"a castle at dawn", "a fox in snow", "a city at night"})
	if err != nil {
		t.Fatal(err)
	}
	if len(prompts) != 3 {
		t.Fatalf("%d prompts, want 3", len(prompts))
	}
	for i, p := range prompts {
		if p == "" {
			t.Errorf("prompt %d is empty", i)
		}
	}
	if n := len(s.Calls("llama3.2")); n != 3 {
		t.Errorf("the server got %d generations, want 3", n)
	}
	if n := s.Loads("llama3.2"); n != 1 {
		t.Errorf("%d loads, want 1 for the whole phase", n)
	}
	if n := s.Unloads("llama3.2"); n != 1 {
		t.Errorf("%d unloads, want 1, at the end of the phase", n)
	}
	if len(rep.Models) != 1 || rep.Cleanup == nil || len(rep.Cleanup.Unloads) != 1 {
		t.Fatalf("phase report %+v, want one model unloaded", rep)
	}
	if u := rep.Cleanup.Unloads[0]; !u.WasLoaded || !u.Verified || u.Checked&vramguard.CheckPS == 0 {
		t.Errorf("unload report %+v, want loaded and verified", u)
	}
	got, used := r.calls()
	if len(got) != 3 {
		t.Fatalf("Render called %d times, want 3", len(got))
	}
	for i, u := range used {
		if u != 0 {
			t.Errorf("render %d found %d bytes held on the GPU, want 0", i, u)
		}
	}
	gpuEmpty(t, s)
}

// A budget that must leave 10 GiB free refuses a 5 GiB model while
// another process holds 14 of 24 GiB: the typed error names the holder,
// nothing reaches the server and nothing is rendered.
func TestBudgetRefusalNamesHolder(t *testing.T) {
	cfg := vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 5 << 30}}}
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	if err := s.Reserve("comfyui", 14<<30); err != nil {
		t.Fatal(err)
	}
	c, err := vramguard.NewClient(vramguard.Options{
		Host:   s.URL().String(),
		VRAM:   s.GPU(),
		Budget: &vramguard.Budget{Headroom: 10 << 30},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rendered := false
	st := &adopter.Studio{Client: c, Model: "llama3.2", Render: func(context.Context, string) error { rendered = true; return nil }}

	_, err = st.One(t.Context(), "a castle at dawn")
	var ve *vramguard.Error
	if !errors.As(err, &ve) || ve.Kind != vramguard.KindOutOfMemory {
		t.Fatalf("One = %v, want a *vramguard.Error of KindOutOfMemory", err)
	}
	if !errors.Is(err, vramguard.ErrOverBudget) {
		t.Errorf("%v does not wrap ErrOverBudget", err)
	}
	var be *vramguard.RoomError
	if !errors.As(err, &be) || be.Budget == nil {
		t.Fatalf("%v holds no budget's *vramguard.RoomError", err)
	}
	if len(be.Holders) == 0 || be.Holders[0].Name != "comfyui" || be.Holders[0].Bytes != 14<<30 {
		t.Errorf("holders %+v, want comfyui with 14 GiB first", be.Holders)
	}
	if vramguard.NormalizeModelName(be.Model) != "llama3.2:latest" || be.Free != 10<<30 {
		t.Errorf("budget error for %q with %d free, want llama3.2 with 10 GiB", be.Model, be.Free)
	}
	if n := len(s.Calls("llama3.2")); n != 0 || s.Loads("llama3.2") != 0 {
		t.Errorf("the server got %d generations and %d loads, want none", n, s.Loads("llama3.2"))
	}
	if rendered {
		t.Error("Render ran after the refusal")
	}
}

// tinyPNG returns a 2×2 PNG.
func tinyPNG(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewRGBA(image.Rect(0, 0, 2, 2))); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A chat with an image goes to a vision model, and is refused with
// ErrNoVision, before the model is loaded, for a text-only one.
func TestCaptionNeedsVision(t *testing.T) {
	tests := []struct {
		name   string
		vision bool
	}{
		{"vision model", true},
		{"text-only model", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, st, _ := newStudio(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{{
				Name: "llava", Vision: tt.vision,
				Respond: func(string) []vramguardtest.Chunk { return []vramguardtest.Chunk{{Text: "a black square"}} },
			}}}, vramguard.Options{})

			text, err := st.Caption(t.Context(), tinyPNG(t))
			if tt.vision {
				if err != nil || text != "a black square" {
					t.Fatalf("Caption = %q, %v, want the model's reply", text, err)
				}
				if calls := s.Calls("llava"); len(calls) != 1 || calls[0].ImageCount() != 1 {
					t.Errorf("the server got %+v, want one chat with one image", calls)
				}
				gpuEmpty(t, s)
				return
			}
			var ve *vramguard.Error
			if !errors.As(err, &ve) || ve.Kind != vramguard.KindInvalidInput {
				t.Fatalf("Caption = %q, %v, want a *vramguard.Error of KindInvalidInput", text, err)
			}
			if !errors.Is(err, vramguard.ErrNoVision) {
				t.Errorf("%v does not wrap ErrNoVision", err)
			}
			if n := len(s.Calls("llava")); n != 0 || s.Loads("llava") != 0 {
				t.Errorf("the server got %d chats and %d loads, want none", n, s.Loads("llava"))
			}
			gpuEmpty(t, s)
		})
	}
}

// A runner that crashes, or a stream that breaks off, mid-reply fails
// One with a typed error of the right kind, renders nothing, and leaves
// nothing loaded once the node's guard has cleaned up.
func TestStreamFailureIsTypedAndCleanedUp(t *testing.T) {
	tests := []struct {
		name      string
		fault     vramguardtest.Fault
		kind      vramguard.Kind
		retryable bool
		cause     error // also wrapped, when set
	}{
		{"runner crash mid-stream", vramguardtest.CrashAfter(2), vramguard.KindModelCrash, false, nil},
		{"stream cut mid-reply", vramguardtest.CloseAfter(2), vramguard.KindTransient, true, vramguard.ErrIncompleteStream},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, st, r := newStudio(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
				{Name: "llama3.2", Size: 2 << 30, Chunks: 6},
			}}, vramguard.Options{})
			if err := s.FailNext("llama3.2", tt.fault); err != nil {
				t.Fatal(err)
			}

			_, err := st.One(t.Context(), "a castle at dawn")
			var ve *vramguard.Error
			if !errors.As(err, &ve) || ve.Kind != tt.kind {
				t.Fatalf("One = %v, want a *vramguard.Error of %v", err, tt.kind)
			}
			if got := vramguard.KindOf(err).Retryable(); got != tt.retryable {
				t.Errorf("Retryable() = %v, want %v", got, tt.retryable)
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Errorf("%v does not wrap %v", err, tt.cause)
			}
			if errors.Is(err, vramguard.KindUnverified) {
				t.Errorf("the cleanup after the failure failed: %v", err)
			}
			if got, _ := r.calls(); len(got) != 0 {
				t.Errorf("Render got %q after a failed generation", got)
			}
			if st := s.Stats("llama3.2"); st.Loads != 1 || st.Completed != 0 {
				t.Errorf("stats %+v, want one load and no completed reply", st)
			}
			gpuEmpty(t, s)
		})
	}
}

// Ollama 0.17+ (and the simulator by default) loses an unload that
// arrives while the model is loading. The library's UnloadModel still
// ends with the model gone, verified.
func TestLostUnloadIsVerified(t *testing.T) {
	const load = 300 * time.Millisecond
	cfg := vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30, LoadLatency: load}}}
	loading := func(s *vramguardtest.Server) func() bool {
		return func() bool { r := s.Running(); return len(r) == 1 && r[0].Loading }
	}

	// Another program loads the model and unloads it during the load: the
	// unload is answered and lost, so the model stays for 5 minutes. The
	// studio's hand-over unloads it, verified.
	t.Run("another program's unload", func(t *testing.T) {
		s, st, _ := newStudio(t, cfg, vramguard.Options{})
		raw := s.APIClient()
		done := make(chan error, 1)
		go func() {
			done <- raw.Generate(context.Background(), &api.GenerateRequest{Model: "llama3.2", Prompt: "x"}, func(api.GenerateResponse) error { return nil })
		}()
		if err := s.WaitFor(t.Context(), loading(s)); err != nil {
			t.Fatal(err)
		}
		unload := &api.GenerateRequest{Model: "llama3.2", KeepAlive: &api.Duration{Duration: 0}}
		if err := raw.Generate(t.Context(), unload, func(api.GenerateResponse) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !s.Listed("llama3.2") {
			t.Fatal("the unload sent during the load was not lost: the test shows nothing")
		}

		rep, err := st.HandOver(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !rep.WasLoaded || !rep.Verified || rep.Attempts < 1 {
			t.Errorf("report %+v, want a loaded model unloaded, verified", rep)
		}
		gpuEmpty(t, s)
	})

	// The studio's own generation is loading the model when the hand-over
	// comes: its unload would be lost, so the library cuts the load
	// instead, and the model does not come back once the load would have
	// ended.
	t.Run("the studio's own load", func(t *testing.T) {
		s, st, _ := newStudio(t, cfg, vramguard.Options{})
		done := make(chan error, 1)
		go func() {
			_, err := st.Client.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
			done <- err
		}()
		if err := s.WaitFor(t.Context(), loading(s)); err != nil {
			t.Fatal(err)
		}
		rep, err := st.HandOver(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if gerr := <-done; !errors.Is(gerr, vramguard.KindCanceled) || !errors.Is(gerr, vramguard.ErrUnloadedWhileLoading) {
			t.Errorf("the loading generation returned %v, want KindCanceled wrapping ErrUnloadedWhileLoading", gerr)
		}
		if !rep.Verified || rep.CanceledLoads != 1 {
			t.Errorf("report %+v, want verified with one canceled load", rep)
		}
		// Past the end of the load the model must still be gone.
		ctx, cancel := context.WithTimeout(t.Context(), load+200*time.Millisecond)
		defer cancel()
		if err := s.WaitFor(ctx, func() bool { return s.Listed("llama3.2") }); err == nil {
			t.Error("the model came back after a verified unload")
		}
		gpuEmpty(t, s)
	})
}

// TestAlternateWithComfyUI: the studio's render loop against the test
// double's fake Ollama and fake ComfyUI on one 16 GiB fake GPU, where the
// LLM (7 GiB) and a render (6 GiB checkpoint, 3 GiB working memory) do
// not fit together: every round's hand-over makes the room, every render
// succeeds, every receipt says freed, and nothing failed to load.
func TestAlternateWithComfyUI(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 16 << 30, StrictVRAM: true,
		Models: []vramguardtest.ModelConfig{{Name: "llama3.2", SizeVRAM: 7 << 30}}})
	defer s.Close()
	fake, err := comfyuitest.NewServer(s, comfyuitest.Config{Models: map[string]uint64{"sd.safetensors": 6 << 30},
		WorkBytes: 3 << 30, StepTime: 5 * time.Millisecond, SettleLag: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	comfy, err := comfyui.New(comfyui.Options{URL: fake.URL().String(), VRAM: s.GPU(), PID: fake.PID()})
	if err != nil {
		t.Fatal(err)
	}
	defer comfy.Close()
	wf := comfyui.Workflow{
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": "sd.safetensors"}},
		"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 512, "height": 512, "batch_size": 1}},
		"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "", "clip": []any{"4", 1}}},
		"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"6", 0},
			"latent_image": []any{"5", 0}, "seed": 1, "steps": 4, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
		"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "studio"}},
	}
	st := &adopter.Studio{Client: c, Model: "llama3.2"}
	receipts, err := st.Alternate(t.Context(), comfy, wf, "6", 9<<30, []string{"a castle", "a lighthouse", "a forest"})
	if err != nil || len(receipts) != 3 {
		t.Fatalf("Alternate = %d receipts, %v; want 3", len(receipts), err)
	}
	for i, rc := range receipts {
		// The checkpoint at least (torch's cache is emptied after a first
		// prompt, as ComfyUI's worker does), down to the CUDA context.
		if rc.Outcome != comfyui.OutcomeFreed || rc.Released() < 6<<30-rc.Tolerance || rc.Process.After > 256<<20+rc.Tolerance {
			t.Errorf("round %d: %s; want the render's memory freed, measured", i+1, rc)
		}
	}
	loads := 0
	for _, e := range s.Events("") {
		switch e.Kind {
		case vramguardtest.EventLoaded:
			loads++
		case vramguardtest.EventLoadFailed:
			t.Errorf("a load failed: %+v", e)
		}
	}
	if loads != 3 {
		t.Errorf("%d loads of llama3.2; want 3, one per round", loads)
	}
}
