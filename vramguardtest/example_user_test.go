package vramguardtest_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"testing"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// writePrompt is the code under test, the user's own: it asks a model for
// a prompt, then hands the GPU over to a diffusion model.
func writePrompt(ctx context.Context, c *vramguard.OllamaClient, idea string) (string, error) {
	g := vramguard.Guard{Client: c}
	gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "Write an image prompt: " + idea}, nil)
	if err != nil {
		return "", err
	}
	return gen.Text, nil
}

// Testing one's own pipeline without Ollama or a GPU: in a test, the body
// below with t.Fatal for log.Fatal. The fake GPU's memory follows the fake
// server's loads, so the hand-over is checked as on real hardware.
func Example() {
	srv := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{
		Name: "llama3.2", Size: 2 << 30,
		Respond: func(string) []vramguardtest.Chunk { return []vramguardtest.Chunk{{Text: "a lighthouse at dusk"}} },
	}}})
	defer srv.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: srv.URL().String(), VRAM: srv.GPU()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	text, err := writePrompt(context.Background(), c, "a lighthouse")
	if err != nil {
		log.Fatal(err)
	}
	_, used, _ := srv.Memory()
	fmt.Println(text, srv.Loads("llama3.2"), srv.Listed("llama3.2"), used)
	for _, ev := range srv.Events("llama3.2") {
		fmt.Print(ev.Kind, " ")
	}
	fmt.Println(strings.Count(srv.Calls("llama3.2")[0].Prompt, "lighthouse"))
	// Output:
	// a lighthouse at dusk 1 false 0
	// request loaded unload-request unloaded 1
}

// TestWritePrompt is the README's test of a user's code, as it is there.
func TestWritePrompt(t *testing.T) {
	srv := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30}}})
	t.Cleanup(srv.Close)
	c := vramguardtest.NewClient(t, srv, vramguard.Options{VRAM: srv.GPU()}) // closed at cleanup, before srv
	if _, err := writePrompt(t.Context(), c, "a lighthouse"); err != nil {   // your code
		t.Fatal(err)
	}
	if _, used, _ := srv.Memory(); srv.Listed("llama3.2") || used != 0 {
		t.Errorf("left %d bytes on the GPU", used)
	}
}
