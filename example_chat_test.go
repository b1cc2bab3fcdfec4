package vramguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"log"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

func ExampleOllamaClient_ChatStreaming() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	msgs := []api.Message{
		{Role: "system", Content: "You write text-to-image prompts."},
		{Role: "user", Content: "a castle"},
	}
	gen, err := c.ChatStreaming(context.Background(), &vramguard.ChatRequest{Model: "llama3.2", Messages: msgs},
		vramguard.KeepAliveFor(time.Minute), nil) // warm for the next turn
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(gen.Text)

	// The next turn carries the reply.
	msgs = append(msgs, gen.Message(), api.Message{Role: "user", Content: "shorter"})
	gen, err = c.ChatStreaming(context.Background(), &vramguard.ChatRequest{Model: "llama3.2", Messages: msgs},
		vramguard.KeepAliveUnload, nil) // last turn: unload when it ends
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reused:", !gen.Loaded)
	// Output:
	// a castle at dawn, volumetric light
	// reused: true
}

func ExampleOllamaClient_ChatStreaming_format() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	_, err := c.ChatStreaming(context.Background(), &vramguard.ChatRequest{
		Model:    "llama3.2",
		Messages: []api.Message{{Role: "user", Content: "a castle"}},
		Format:   json.RawMessage(`"yaml"`), // "json" or a JSON schema object
	}, vramguard.KeepAliveUnload, nil)
	fmt.Println(errors.Is(err, vramguard.KindInvalidInput))
	// Output: true
}

func ExampleGuard_Chat() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	g := vramguard.Guard{Client: c} // unload after use, verified
	gen, err := g.Chat(context.Background(), &vramguard.ChatRequest{
		Model:    "llama3.2",
		Messages: []api.Message{{Role: "user", Content: "a castle"}},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	resident, _ := c.IsResident(context.Background(), "llama3.2")
	fmt.Println(gen.Text)
	fmt.Println("resident:", resident)
	// Output:
	// a castle at dawn, volumetric light
	// resident: false
}

func ExampleSession_Chat() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	g := vramguard.Guard{Client: c}
	err := g.Run(context.Background(), "llama3.2", func(ctx context.Context, s *vramguard.Session) error {
		msgs := []api.Message{{Role: "user", Content: "a castle"}}
		for turn := 1; turn <= 2; turn++ {
			gen, err := s.Chat(ctx, &vramguard.ChatRequest{Messages: msgs}, nil)
			if err != nil {
				return err
			}
			fmt.Printf("turn %d: %s\n", turn, gen.Text)
			msgs = append(msgs, gen.Message(), api.Message{Role: "user", Content: "again"})
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// turn 1: a castle at dawn, volumetric light
	// turn 2: a castle at dawn, volumetric light
}

func ExampleGeneration_Message() {
	gen := &vramguard.Generation{Text: "a castle at dawn"}
	m := gen.Message()
	fmt.Println(m.Role, m.Content)
	// Output: assistant a castle at dawn
}

// tinyPNG is an 8×8 grey picture; a program reads its images from files.
func tinyPNG() []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, 8, 8))); err != nil {
		log.Fatal(err)
	}
	return b.Bytes()
}

func ExampleImageType() {
	img := tinyPNG() // or os.ReadFile("fox.png")
	fmt.Println(vramguard.ImageType(img))
	fmt.Println(vramguard.ImageType([]byte("GIF89a")) == "")
	// Output:
	// png
	// true
}

func ExampleErrNoVision() {
	s, c := startSim()
	defer s.Close()
	defer c.Close()

	img := tinyPNG()
	// llama3.2 is a text model: the server's /api/show says so, and the
	// request is never sent.
	_, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{
		Model: "llama3.2", Prompt: "describe this", Images: []api.ImageData{img},
	}, vramguard.KeepAliveUnload, nil)
	fmt.Println(errors.Is(err, vramguard.ErrNoVision), errors.Is(err, vramguard.KindInvalidInput))
	// Output: true true
}

func ExampleChatRequest() {
	// A model that calls a tool, then answers with its result.
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "qwen3", Tools: true,
		RespondTo: func(r vramguardtest.Call) []vramguardtest.Chunk {
			last := r.Messages[len(r.Messages)-1]
			if last.Role == "tool" {
				return []vramguardtest.Chunk{{Text: "a castle under a " + last.Content + " sky"}}
			}
			args := api.NewToolCallFunctionArguments()
			args.Set("city", "Carcassonne")
			return []vramguardtest.Chunk{{ToolCalls: []api.ToolCall{{Function: api.ToolCallFunction{Name: "weather", Arguments: args}}}}}
		}}}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var weather api.Tool
	weather.Type = "function"
	weather.Function.Name = "weather"
	weather.Function.Description = "the weather in a city"
	req := &vramguard.ChatRequest{
		Model:    "qwen3",
		Messages: []api.Message{{Role: "user", Content: "a castle in today's weather"}},
		Tools:    api.Tools{weather},
	}
	g := vramguard.Guard{Client: c}
	err = g.Run(context.Background(), "qwen3", func(ctx context.Context, s *vramguard.Session) error {
		for {
			gen, err := s.Chat(ctx, req, nil)
			if err != nil {
				return err
			}
			if len(gen.ToolCalls) == 0 {
				fmt.Println(gen.Text)
				return nil
			}
			req.Messages = append(req.Messages, gen.Message())
			for _, tc := range gen.ToolCalls {
				city, _ := tc.Function.Arguments.Get("city")
				fmt.Println("call:", tc.Function.Name, city)
				req.Messages = append(req.Messages, api.Message{Role: "tool", ToolName: tc.Function.Name, ToolCallID: tc.ID, Content: "stormy"})
			}
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// call: weather Carcassonne
	// a castle under a stormy sky
}

func ExampleCheckImage() {
	err := vramguard.CheckImage([]byte("GIF89a..."))
	fmt.Println(errors.Is(err, vramguard.ErrImageFormat))
	fmt.Println(errors.Is(vramguard.CheckImage(make([]byte, vramguard.MaxImageBytes+1)), vramguard.ErrImageTooLarge))
	// Output:
	// true
	// true
}
