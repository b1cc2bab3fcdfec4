package vramguard_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	. "github.com/vramguard/vramguard"

	"github.com/vramguard/vramguard/vramguardtest"
)

func TestEstimateModelFormula(t *testing.T) {
	const size = 3 << 30
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", Size: size, ContextLength: 8192})
	c := newTestClient(t, s, Options{})

	e1, err := c.EstimateModel(t.Context(), "tiny", 2048)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := c.EstimateModel(t.Context(), "tiny:latest", 4096)
	if err != nil {
		t.Fatal(err)
	}
	if e1.Weights != size || e2.Weights != size {
		t.Errorf("weights %d and %d, want the reported file size %d", e1.Weights, e2.Weights, size)
	}
	if e2.KVCache != 2*e1.KVCache {
		t.Errorf("KV cache %d at 4096, want twice %d at 2048", e2.KVCache, e1.KVCache)
	}
	// The simulator's 3 GiB model has the shape of a 3B: 28 blocks, 8
	// key/value heads of 3072/24 = 128, f16.
	sh := vramguardtest.ShapeOf(size)
	kd := int64(sh.Embedding / sh.Heads)
	if want := 2048 * int64(sh.Blocks) * int64(sh.HeadsKV) * 2 * kd * 2; e1.KVCache != want {
		t.Errorf("KV cache at 2048: %d, want %d", e1.KVCache, want)
	}
	for _, e := range []*ModelEstimate{e1, e2} {
		if e.Compute <= 0 || e.Total != e.Weights+e.KVCache+e.Compute {
			t.Errorf("%+v: compute must be positive and the total the sum of the parts", e)
		}
	}
	if e2.Compute <= e1.Compute {
		t.Errorf("compute %d at 4096 not above %d at 2048", e2.Compute, e1.Compute)
	}

	e0, err := c.EstimateModel(t.Context(), "tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	if e0.NumCtx != DefaultEstimateNumCtx || e0.Total != e2.Total {
		t.Errorf("num_ctx 0: %+v, want the estimate at %d: %+v", e0, DefaultEstimateNumCtx, e2)
	}
}

func TestEstimateModelErrors(t *testing.T) {
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "tiny"},
		vramguardtest.ModelConfig{Name: "bare", ModelInfo: map[string]any{
			"general.architecture": "llama",
			"llama.block_count":    4,
		}},
		vramguardtest.ModelConfig{Name: "noarch", ModelInfo: map[string]any{}},
	)
	c := newTestClient(t, s, Options{})
	for _, tt := range []struct {
		name, model string
		numCtx      int
		kind        Kind
		msg         string
	}{
		{"unknown model", "nope", 2048, KindNotFound, ""},
		{"missing keys", "bare", 2048, KindServer, "llama.embedding_length, llama.attention.head_count"},
		{"no architecture", "noarch", 2048, KindServer, "general.architecture"},
		{"negative num_ctx", "tiny", -1, KindInvalidInput, "negative"},
		{"empty name", " ", 2048, KindInvalidInput, "empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, err := c.EstimateModel(t.Context(), tt.model, tt.numCtx)
			if !errors.Is(err, tt.kind) || e != nil {
				t.Fatalf("got %+v, %v (kind %v), want kind %v", e, err, KindOf(err), tt.kind)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("message %q lacks %q", err, tt.msg)
			}
		})
	}

	t.Run("closed client", func(t *testing.T) {
		c := newTestClient(t, s, Options{})
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := c.EstimateModel(t.Context(), "tiny", 2048)
		if !errors.Is(err, ErrClosed) || !errors.Is(err, KindUnavailable) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
	})
}

// A model_info large enough to overflow int64 saturates: the estimate is
// huge, never negative or small (a budget would admit it).
func TestEstimateSaturates(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "huge", Size: 1 << 30, ModelInfo: map[string]any{
		"general.architecture":          "llama",
		"llama.block_count":             1 << 40,
		"llama.embedding_length":        1 << 40,
		"llama.attention.head_count":    1 << 40,
		"llama.attention.head_count_kv": 1 << 40,
	}})
	c := newTestClient(t, s, Options{})
	e, err := c.EstimateModel(t.Context(), "huge", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if e.Total != math.MaxInt64 || e.KVCache <= 0 || e.Compute <= 0 {
		t.Errorf("estimate of a hostile model_info: %+v, want saturated, positive parts", e)
	}
}
