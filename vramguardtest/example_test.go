package vramguardtest_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// The fake speaks Ollama's HTTP API to any client, here Ollama's own.
func ExampleServer() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", Chunks: 3}}})
	defer s.Close()
	c := s.APIClient()
	ctx := context.Background()

	var reply string
	var loaded bool
	err := c.Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: "hi", KeepAlive: &api.Duration{Duration: 0}},
		func(r api.GenerateResponse) error {
			reply += r.Response
			loaded = loaded || r.LoadDuration > 0
			return nil
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%q loaded=%v\n", reply, loaded)

	// keep_alive 0: the model leaves /api/ps shortly after the request.
	wait, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = s.WaitFor(wait, func() bool { return !s.Listed("tiny") })
	fmt.Println("loads:", s.Loads("tiny"), "unloads:", s.Unloads("tiny"))
	// Output:
	// "kilo lima mike" loaded=true
	// loads: 1 unloads: 1
}

func ExampleServer_Reserve() {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 << 30})
	defer s.Close()

	fmt.Println(s.Reserve("text-encoder", 11<<30))
	fmt.Println(s.Reserve("vae", 14<<30))
	total, used, free := s.Memory()
	fmt.Println(total>>30, used>>30, free>>30)
	// Output:
	// <nil>
	// VRAM grow failed: 15032385536 bytes
	// 24 11 13
}

func ExampleServer_FailNext() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny"}}})
	defer s.Close()
	c := s.APIClient()

	_ = s.FailNext("tiny", vramguardtest.LoadCrash())
	err := c.Generate(context.Background(), &api.GenerateRequest{Model: "tiny", Prompt: "hi"},
		func(api.GenerateResponse) error { return nil })
	fmt.Println(err)
	// Output:
	// 500 Internal Server Error: llama runner process has terminated: exit status 2
}

func ExampleServer_Calls() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{
		Name:  "tiny",
		Tools: true,
		// Call a tool once, then answer with what it returned.
		RespondTo: func(r vramguardtest.Call) []vramguardtest.Chunk {
			last := r.Messages[len(r.Messages)-1]
			if last.Role == "tool" {
				return []vramguardtest.Chunk{{Text: "It is " + last.Content + "."}}
			}
			return []vramguardtest.Chunk{{ToolCalls: []api.ToolCall{{Function: api.ToolCallFunction{Name: "get_weather"}}}}}
		},
	}}})
	defer s.Close()
	c := s.APIClient()
	ctx := context.Background()
	tools := api.Tools{{Type: "function", Function: api.ToolFunction{Name: "get_weather"}}}

	msgs := []api.Message{{Role: "user", Content: "Weather?"}}
	for range 2 {
		var reply api.Message
		err := c.Chat(ctx, &api.ChatRequest{Model: "tiny", Messages: msgs, Tools: tools}, func(r api.ChatResponse) error {
			reply.Role = r.Message.Role
			reply.Content += r.Message.Content
			reply.ToolCalls = append(reply.ToolCalls, r.Message.ToolCalls...)
			return nil
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		msgs = append(msgs, reply)
		for _, tc := range reply.ToolCalls {
			fmt.Println("call", tc.ID, tc.Function.Name)
			msgs = append(msgs, api.Message{Role: "tool", ToolName: tc.Function.Name, ToolCallID: tc.ID, Content: "sunny"})
		}
		if reply.Content != "" {
			fmt.Println(reply.Role+":", reply.Content)
		}
	}
	for _, call := range s.Calls("tiny") {
		fmt.Println(call.Endpoint, len(call.Messages), "messages")
	}
	// Output:
	// call call_00000001 get_weather
	// assistant: It is sunny.
	// chat 1 messages
	// chat 3 messages
}

// A PSGPU gives any Ollama server a fake device whose memory follows its
// /api/ps: on a machine without a GPU, a real server gets a budget, a
// refusal that names holders, or a member's device in a test of several
// servers. Here it follows the fake server.
func ExamplePSGPU() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", SizeVRAM: 2 << 30}}})
	defer s.Close()
	ctx := context.Background()
	gpu := &vramguardtest.PSGPU{Client: s.APIClient(), Total: 8 << 30}
	_ = gpu.Reserve(ctx, "comfyui", 4<<30)
	_ = s.APIClient().Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: "hi", KeepAlive: &api.Duration{Duration: time.Hour}},
		func(api.GenerateResponse) error { return nil })

	snap, err := gpu.Snapshot(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	d := snap.Devices[0]
	for _, p := range d.Processes {
		fmt.Printf("%s: %d GiB\n", p.Command, p.UsedBytes>>30)
	}
	fmt.Printf("free: %d GiB\n", d.Free>>30)
	// Output:
	// ollama runner (tiny:latest): 2 GiB
	// comfyui: 4 GiB
	// free: 2 GiB
}

// MultiGPU plays one server that spans two GPUs: room asked for on
// device 1 costs the model there, not the one on device 0.
func ExampleMultiGPU() {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 48 << 30, Models: []vramguardtest.ModelConfig{
		{Name: "big", SizeVRAM: 6 << 30}, {Name: "small", SizeVRAM: 4 << 30}}})
	defer s.Close()
	gpus := &vramguardtest.MultiGPU{Server: s, Totals: []uint64{24 << 30, 24 << 30}, On: map[string]int{"small": 1, "comfyui": 1}}
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: gpus})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, m := range []string{"big", "small"} {
		if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: m, Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.Reserve("comfyui", 18<<30); err != nil { // device 1: 2 GiB free
		log.Fatal(err)
	}
	rep, err := c.EnsureFree(context.Background(), vramguard.EnsureRequest{Device: 1, Bytes: 5 << 30})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rep.Evicted[0].Model, rep.FreeAfter>>30, s.Listed("big"))
	// Output: small:latest 6 true
}
