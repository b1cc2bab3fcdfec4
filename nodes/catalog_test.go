package nodes

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestCatalog(t *testing.T) {
	s := newSim(t,
		vramguardtest.ModelConfig{Name: "qwen3:8b"},
		vramguardtest.ModelConfig{Name: "sd-prompt-writer"},
		vramguardtest.ModelConfig{Name: "Llama3.2"},
		vramguardtest.ModelConfig{Name: "user/flux-style-lora:q4"},
		vramguardtest.ModelConfig{Name: "mistral"},
	)
	c := newClient(t, s, nil)
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cat := &Catalog{Client: c, Now: func() time.Time { return now }}
	want := []string{"sd-prompt-writer:latest", "user/flux-style-lora:q4", "Llama3.2:latest", "mistral:latest", "qwen3:8b"}
	got, err := cat.Models(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Models() = %q, want %q", got, want)
	}
	got[0] = "changed by the caller"

	// Within the TTL the cached list comes back, untouched by the caller.
	if err := s.AddModel(vramguardtest.ModelConfig{Name: "fine-tuned-writer"}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(DefaultCatalogTTL - time.Second)
	if got, err := cat.Models(t.Context()); err != nil || !slices.Equal(got, want) {
		t.Fatalf("cached: %q, %v; want %q", got, err, want)
	}
	// After it, the server is asked again.
	now = now.Add(2 * time.Second)
	got, err = cat.Models(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != "fine-tuned-writer:latest" || len(got) != 6 {
		t.Fatalf("after the TTL: %q", got)
	}
	// A clock going backwards does not keep a stale list forever.
	now = now.Add(-time.Hour)
	if err := s.AddModel(vramguardtest.ModelConfig{Name: "zephyr"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := cat.Models(t.Context()); len(got) != 7 {
		t.Errorf("clock went back: %q", got)
	}
	// Invalidate drops the cache.
	if err := s.AddModel(vramguardtest.ModelConfig{Name: "alpaca"}); err != nil {
		t.Fatal(err)
	}
	cat.Invalidate()
	if got, _ := cat.Models(t.Context()); len(got) != 8 {
		t.Errorf("after Invalidate: %q", got)
	}
}

func TestCatalogConcurrent(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "a"}, vramguardtest.ModelConfig{Name: "b-prompt"})
	c := newClient(t, s, nil)
	cat := &Catalog{Client: c, TTL: time.Nanosecond}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				got, err := cat.Models(t.Context())
				if err != nil || !slices.Equal(got, []string{"b-prompt:latest", "a:latest"}) {
					t.Errorf("Models() = %q, %v", got, err)
				}
			}
		}()
	}
	wg.Wait()
}

func TestCatalogErrors(t *testing.T) {
	s := newSim(t)
	c := newClient(t, s, nil)
	if _, err := (&Catalog{}).Models(t.Context()); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("no client: %v", err)
	}
	if _, err := (&Catalog{Client: c, TTL: -1}).Models(t.Context()); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("negative TTL: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := (&Catalog{Client: c}).Models(ctx); !errors.Is(err, vramguard.KindCanceled) || !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
	s.Close()
	if _, err := (&Catalog{Client: c}).Models(t.Context()); !errors.Is(err, vramguard.KindUnavailable) {
		t.Errorf("server gone: %v", err)
	}
}

func TestSortModels(t *testing.T) {
	got := []string{"b", "Tune-x", "A", "a", "lora-z", "c-FINE"}
	SortModels(got)
	want := []string{"c-FINE", "lora-z", "Tune-x", "A", "a", "b"}
	if !slices.Equal(got, want) {
		t.Errorf("SortModels = %q, want %q", got, want)
	}
}
