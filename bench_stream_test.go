package vramguard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard"
)

// BenchmarkStreamingVsRaw is the comparison of issue #14: GenerateStreaming
// and the raw api.Client.Generate on the same stream from the same server
// fixture (streamChunks text chunks and a done line), time and bytes per
// generation, as two sub-benchmarks for benchstat
// (`benchstat -col /client`).
func BenchmarkStreamingVsRaw(b *testing.B) {
	benchVsRaw(b, streamRaw, streamVramguard)
}

// BenchmarkChatStreamingVsRaw is BenchmarkStreamingVsRaw for chat:
// ChatStreaming and the raw api.Client.Chat on the same /api/chat stream
// (streamChunks message chunks and a done line), with the same target
// (BENCHMARKS.md §5: no slower, at most half the bytes).
func BenchmarkChatStreamingVsRaw(b *testing.B) {
	benchVsRaw(b, chatRaw, chatVramguard)
}

// benchVsRaw runs the raw and the vramguard side as two sub-benchmarks.
func benchVsRaw(b *testing.B, raw func(*testing.B, *api.Client), vg func(*testing.B, *vramguard.OllamaClient)) {
	for _, side := range []string{"raw", "vramguard"} {
		b.Run(fmt.Sprintf("chunks=%d/client=%s", streamChunks, side), func(b *testing.B) {
			c, client := newStreamClients(b)
			b.ReportAllocs()
			for b.Loop() {
				if side == "raw" {
					raw(b, client)
				} else {
					vg(b, c)
				}
			}
		})
	}
}

var benchMessages = []api.Message{{Role: "system", Content: "You write prompts."}, {Role: "user", Content: "a castle at dawn"}}

// chatVramguard is one chat through ChatStreaming with a callback that
// counts the chunks.
func chatVramguard(b *testing.B, c *vramguard.OllamaClient) {
	n := 0
	gen, err := c.ChatStreaming(context.Background(), &vramguard.ChatRequest{Model: "bench", Messages: benchMessages},
		vramguard.KeepAliveUnload, func(vramguard.Chunk) error {
			n++
			return nil
		})
	if err != nil {
		b.Fatal(err)
	}
	if n != streamChunks+1 || gen.Chunks != n || len(gen.Text) == 0 {
		b.Fatalf("%d callbacks, %d chunks, %d bytes", n, gen.Chunks, len(gen.Text))
	}
}

// chatRaw is what a correct user of api.Client.Chat does: count,
// accumulate the content and check that done arrived.
func chatRaw(b *testing.B, client *api.Client) {
	var (
		text strings.Builder
		n    int
		done bool
	)
	err := client.Chat(context.Background(), &api.ChatRequest{Model: "bench", Messages: benchMessages, KeepAlive: &api.Duration{}},
		func(r api.ChatResponse) error {
			n++
			text.WriteString(r.Message.Content)
			done = done || r.Done
			return nil
		})
	if err != nil {
		b.Fatal(err)
	}
	if !done || n != streamChunks+1 || text.Len() == 0 {
		b.Fatalf("done %v, %d callbacks, %d bytes", done, n, text.Len())
	}
}
