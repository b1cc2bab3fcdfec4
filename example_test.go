package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// startSim starts the built-in Ollama simulator with two models. Real
// programs leave Options.Host empty (OLLAMA_HOST or 127.0.0.1:11434).
func startSim() (*vramguardtest.Server, *vramguard.OllamaClient) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "llama3.2", Size: 2 << 30, LoadLatency: 30 * time.Millisecond, Respond: func(p string) []vramguardtest.Chunk {
			return []vramguardtest.Chunk{{Text: "a castle "}, {Text: "at dawn, "}, {Text: "volumetric light"}}
		}},
		{Name: "qwen3:8b", Size: 5 << 30},
	}})
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	return s, c
}

func ExampleNewClient() {
	c, err := vramguard.NewClient(vramguard.Options{
		Host:     "127.0.0.1:11434",
		Timeouts: vramguard.Timeouts{FirstChunk: time.Minute, Idle: 10 * time.Second},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	_, err = vramguard.NewClient(vramguard.Options{Host: "ftp://nowhere"})
	fmt.Println(errors.Is(err, vramguard.KindInvalidInput))
	// Output: true
}

func ExampleOllamaClient_GenerateStreaming() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	var b strings.Builder
	gen, err := c.GenerateStreaming(context.Background(),
		&vramguard.GenerateRequest{Model: "llama3.2", Prompt: "a castle"},
		vramguard.KeepAliveUnload, // unload as soon as the request ends
		func(ch vramguard.Chunk) error {
			fmt.Fprintf(&b, "[%d]", ch.Index)
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(gen.Text)
	fmt.Println(b.String(), gen.DoneReason, "loaded:", gen.Loaded)
	// Output:
	// a castle at dawn, volumetric light
	// [1][2][3][4] stop loaded: true
}

func ExampleOllamaClient_GenerateStreaming_errorKinds() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	_, err := c.GenerateStreaming(context.Background(),
		&vramguard.GenerateRequest{Model: "no-such-model", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	switch {
	case errors.Is(err, vramguard.KindNotFound):
		fmt.Println("pull the model first")
	case vramguard.KindOf(err).Retryable():
		fmt.Println("try again")
	}
	// Output: pull the model first
}

func ExampleOllamaClient_UnloadModel() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	ctx := context.Background()

	// Someone left the model resident for the server's default 5 minutes.
	if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "qwen3:8b", Prompt: "x"},
		vramguard.KeepAliveServerDefault, nil); err != nil {
		log.Fatal(err)
	}
	rep, err := c.UnloadModel(ctx, "qwen3:8b")
	if err != nil {
		log.Fatal(err)
	}
	resident, _ := c.IsResident(ctx, "qwen3:8b")
	fmt.Printf("was loaded: %v, size %d GiB, verified: %v, resident now: %v\n",
		rep.WasLoaded, rep.Size>>30, rep.Verified, resident)
	// Output: was loaded: true, size 5 GiB, verified: true, resident now: false
}

func ExampleOllamaClient_UnloadAll() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	ctx := context.Background()
	for _, m := range []string{"llama3.2", "qwen3:8b"} {
		if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: m, Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
			log.Fatal(err)
		}
	}
	reps, err := c.UnloadAll(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range reps {
		fmt.Println(r.Model, r.Verified)
	}
	// Output:
	// llama3.2:latest true
	// qwen3:8b true
}

func ExampleOllamaClient_ReleaseVRAM() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	// An orchestrator that owns CUDA memory through cgo registers its own
	// cache-emptying function: a tenant on no one device (-1), which
	// ReleaseVRAM and the library's release steps run.
	if _, err := c.RegisterTenant(vramguard.Tenant{Name: "torch caching allocator", Device: -1,
		Release: func(context.Context) error { return nil }}); err != nil {
		log.Fatal(err)
	}
	rep, err := c.ReleaseVRAM(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rep.Ran, rep.Before == nil) // no VRAM reader configured
	// Output: [torch caching allocator] true
}

func ExampleOllamaClient_Cleanup() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "x"},
		vramguard.KeepAliveForever, nil); err != nil {
		log.Fatal(err)
	}

	// Cleanup runs even when the caller's context is already canceled.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := c.Cleanup(ctx, vramguard.CleanupOptions{AllModels: true, Release: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(rep.Unloads), rep.Unloads[0].Verified)
	// Output: 1 true
}

func ExampleOllamaClient_CleanupAsync() {
	s, c := startSim()
	defer s.Close()
	if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "x"},
		vramguard.KeepAliveForever, nil); err != nil {
		log.Fatal(err)
	}
	task := c.CleanupAsync(context.Background(), vramguard.CleanupOptions{Models: []string{"llama3.2"}})
	// ... the orchestrator goes on ...
	if err := c.Close(); err != nil { // joins the cleanup
		log.Fatal(err)
	}
	rep, err := task.Wait()
	fmt.Println(rep.Unloads[0].Verified, err)
	// Output: true <nil>
}

func ExampleOllamaClient_Close() {
	s, c := startSim()
	defer s.Close()
	ctx := context.Background()
	// A bounded keep-alive: the model stays warm for the next call...
	if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "x"},
		vramguard.KeepAliveFor(2*time.Minute), nil); err != nil {
		log.Fatal(err)
	}
	// ...and Close unloads it, verified, before the program exits.
	if err := c.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Listed("llama3.2"))
	// Output: false
}

func ExampleGuard_Run() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	g := vramguard.Guard{Client: c} // unload after use, verified
	err := g.Run(context.Background(), "llama3.2", func(ctx context.Context, sess *vramguard.Session) error {
		gen, err := sess.Generate(ctx, &vramguard.GenerateRequest{Prompt: "a castle"}, nil)
		if err != nil {
			return err
		}
		fmt.Println(gen.Text)
		return nil
	})
	fmt.Println(err, s.Listed("llama3.2"))
	// Output:
	// a castle at dawn, volumetric light
	// <nil> false
}

func ExampleOllamaClient_StartPhase() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	ctx := context.Background()

	// The prompt stage: three steps on one model load it once.
	phase, err := c.StartPhase(ctx, "prompts", vramguard.PhaseOptions{KeepAlive: vramguard.KeepAliveFor(2 * time.Minute)})
	if err != nil {
		log.Fatal(err)
	}
	g := phase.Guard()
	for range 3 {
		if _, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "refine"}, nil); err != nil {
			log.Fatal(err)
		}
	}
	rep, err := phase.End(ctx) // verified unload of every model the phase used
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("loads:", s.Loads("llama3.2"), "models:", rep.Models, "resident:", s.Listed("llama3.2"))
	// Output: loads: 1 models: [llama3.2] resident: false
}

func ExampleParseKeepAlive() {
	for _, s := range []string{"0", "90s", "300", "forever", ""} {
		ka, err := vramguard.ParseKeepAlive(s)
		fmt.Println(ka, err)
	}
	_, err := vramguard.ParseKeepAlive("five minutes")
	fmt.Println(errors.Is(err, vramguard.KindInvalidInput))
	// Output:
	// 0s <nil>
	// 1m30s <nil>
	// 5m0s <nil>
	// -1 <nil>
	// default <nil>
	// true
}

func ExampleNormalizeModelName() {
	fmt.Println(vramguard.NormalizeModelName("Llama3.2"))
	fmt.Println(vramguard.NormalizeModelName("library/qwen3:8b"))
	fmt.Println(vramguard.NormalizeModelName("user/style-lora:q4"))
	// Output:
	// llama3.2:latest
	// qwen3:8b
	// user/style-lora:q4
}

func ExampleGuard_Generate() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	// Async cleanup: Generate returns as soon as the text is there; the
	// verified unload runs in the background and Close (or Wait) joins it.
	g := vramguard.Guard{Client: c, Async: true}
	gen, err := g.Generate(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "a castle"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(gen.Text)
	fmt.Println(c.Wait(), s.Listed("llama3.2"))
	// Output:
	// a castle at dawn, volumetric light
	// <nil> false
}

func ExampleSession_Generate() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	g := vramguard.Guard{Client: c}
	_ = g.Run(context.Background(), "llama3.2", func(ctx context.Context, sess *vramguard.Session) error {
		// Two generations in one guarded use; the model is unloaded once,
		// after the function returns.
		for i := range 2 {
			gen, err := sess.Generate(ctx, &vramguard.GenerateRequest{Prompt: fmt.Sprint("pass ", i)}, nil)
			if err != nil {
				return err
			}
			fmt.Println(i, gen.Chunks, sess.KeepAlive())
		}
		return nil
	})
	// Output:
	// 0 4 0s
	// 1 4 0s
}

func ExamplePhase_End() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	ctx := context.Background()
	phase, err := c.StartPhase(ctx, "prompts", vramguard.PhaseOptions{})
	if err != nil {
		log.Fatal(err)
	}
	g := phase.Guard()
	for _, m := range []string{"qwen3:8b", "llama3.2"} {
		if _, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: m, Prompt: "x"}, nil); err != nil {
			log.Fatal(err)
		}
	}
	rep, err := phase.End(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, u := range rep.Cleanup.Unloads {
		fmt.Println(u.Model, u.WasLoaded, u.Verified)
	}
	// Output:
	// llama3.2 true true
	// qwen3:8b true true
}

func ExampleOllamaClient_Running() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	ctx := context.Background()
	if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "qwen3:8b", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil); err != nil {
		log.Fatal(err)
	}
	ms, err := c.Running(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range ms {
		fmt.Println(m.Model, m.Size>>30, "GiB")
	}
	resident, _ := c.IsResident(ctx, "QWEN3:8b")
	fmt.Println(resident)
	// Output:
	// qwen3:8b 5 GiB
	// true
}

func ExampleOllamaClient_ListModels() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	ms, err := c.ListModels(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	fmt.Println(names)
	// Output: [llama3.2:latest qwen3:8b]
}

func ExampleOllamaClient_Wait() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()
	ctx := context.Background()
	if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
		log.Fatal(err)
	}
	c.CleanupAsync(ctx, vramguard.CleanupOptions{AllModels: true})
	fmt.Println(c.Wait(), s.Listed("llama3.2"))
	// Output: <nil> false
}

func ExampleKeepAliveFor() {
	fmt.Println(vramguard.KeepAliveFor(2 * time.Minute))
	fmt.Println(vramguard.KeepAliveFor(0) == vramguard.KeepAliveUnload)
	fmt.Println(vramguard.KeepAliveForever, vramguard.KeepAliveServerDefault)
	// Output:
	// 2m0s
	// true
	// -1 default
}

func ExampleKindOf() {
	err := fmt.Errorf("step 2: %w", &vramguard.Error{Op: "generate", Model: "m", Kind: vramguard.KindTimeout, Err: vramguard.ErrIdleTimeout})
	fmt.Println(vramguard.KindOf(err), vramguard.KindOf(err).Retryable(), errors.Is(err, vramguard.ErrIdleTimeout))
	fmt.Println(err)
	// Output:
	// timeout true true
	// step 2: vramguard: generate "m": timeout: stream idle longer than the idle timeout
}
