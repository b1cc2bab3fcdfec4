package vramguard_test

import (
	"fmt"
	"testing"
)

// BenchmarkStreamingVsRaw is the comparison of issue #14: GenerateStreaming
// and the raw api.Client.Generate on the same stream from the same server
// fixture (streamChunks text chunks and a done line), time and bytes per
// generation, as two sub-benchmarks for benchstat
// (`benchstat -col /client`).
func BenchmarkStreamingVsRaw(b *testing.B) {
	for _, side := range []string{"raw", "vramguard"} {
		b.Run(fmt.Sprintf("chunks=%d/client=%s", streamChunks, side), func(b *testing.B) {
			c, client := newStreamClients(b)
			b.ReportAllocs()
			for b.Loop() {
				if side == "raw" {
					streamRaw(b, client)
				} else {
					streamVramguard(b, c)
				}
			}
		})
	}
}
