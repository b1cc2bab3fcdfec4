package vramguard

import (
	"math"
	"testing"
)

func TestReadShapeDefaults(t *testing.T) {
	for _, tt := range []struct {
		name string
		info map[string]any
		want modelShape
	}{
		{"llama.cpp defaults", map[string]any{
			"general.architecture": "llama", "llama.block_count": 2.0,
			"llama.embedding_length": 64.0, "llama.attention.head_count": 4.0,
		}, modelShape{blocks: 2, embedding: 64, heads: 4, headsKV: 4, keyLen: 16, valueLen: 16}},
		{"per-layer key/value heads and shown tokens", map[string]any{
			"general.architecture": "gemma3", "gemma3.block_count": 2.0,
			"gemma3.embedding_length": 64.0, "gemma3.attention.head_count": 4.0,
			"gemma3.attention.head_count_kv": []any{1.0, 2.0}, "gemma3.attention.key_length": 32.0,
			"tokenizer.ggml.tokens": []any{"a", "b", "c"},
		}, modelShape{blocks: 2, embedding: 64, heads: 4, headsKV: 2, keyLen: 32, valueLen: 16, vocab: 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readShape(tt.info)
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestParamNumCtx(t *testing.T) {
	for in, want := range map[string]int{
		"":                                     0,
		"stop \"<|eot|>\"\nnum_ctx 8192\n":     8192,
		"num_ctx                        16384": 16384,
		"num_ctx x":                            0,
	} {
		if got := paramNumCtx(in); got != want {
			t.Errorf("paramNumCtx(%q) = %d, want %d", in, got, want)
		}
	}
}

// The saturating arithmetic of the estimate never wraps.
func TestSaturatingArithmetic(t *testing.T) {
	if satMul(math.MaxInt64, 3) != math.MaxInt64 || satAdd(math.MaxInt64, 1) != math.MaxInt64 || satMul(3, -1) != 0 {
		t.Error("saturation is wrong")
	}
}
