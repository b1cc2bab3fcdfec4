package nodes

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
)

// DefaultCatalogTTL is how long Catalog caches the model list when TTL is
// zero.
const DefaultCatalogTTL = time.Minute

// Catalog lists the models installed on the Ollama server, for a model
// picker: prompt-tuned models first (names containing lora, prompt, style,
// fine, tune, enhance or diffusion), then the others, each group sorted by
// name.
//
// The zero value with Client set caches the list for DefaultCatalogTTL. A
// Catalog is safe for concurrent use; it must not be copied after first use.
type Catalog struct {
	// Client is required.
	Client *vramguard.OllamaClient
	// TTL is how long a list is reused; zero means DefaultCatalogTTL,
	// negative is invalid.
	TTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	models  []string
	fetched time.Time
}

// Models returns the installed models, from the cache when it is younger
// than TTL. Failures are not cached; concurrent calls that miss the cache
// each ask the server. When ctx ends the call returns a KindCanceled error.
func (c *Catalog) Models(ctx context.Context) ([]string, error) {
	const op = "list models"
	if c.Client == nil {
		return nil, invalid(op, "", "catalog has no client")
	}
	if c.TTL < 0 {
		return nil, invalid(op, "", "negative TTL %v", c.TTL)
	}
	ttl := cmp.Or(c.TTL, DefaultCatalogTTL)
	now := c.now()
	c.mu.Lock()
	if c.models != nil && now.Sub(c.fetched) < ttl && !now.Before(c.fetched) {
		models := slices.Clone(c.models)
		c.mu.Unlock()
		return models, nil
	}
	c.mu.Unlock()

	list, err := c.Client.ListModels(ctx)
	if err != nil {
		return nil, err
	}
	models := make([]string, 0, len(list))
	for _, m := range list {
		models = append(models, cmp.Or(m.Name, m.Model))
	}
	SortModels(models)
	c.mu.Lock()
	c.models, c.fetched = models, now
	c.mu.Unlock()
	return slices.Clone(models), nil
}

// Invalidate drops the cached list, so that the next Models call asks the
// server.
func (c *Catalog) Invalidate() {
	c.mu.Lock()
	c.models = nil
	c.mu.Unlock()
}

func (c *Catalog) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// SortModels sorts model names in place as Catalog lists them:
// prompt-tuned first, then by name without regard to case.
func SortModels(models []string) {
	slices.SortStableFunc(models, func(a, b string) int {
		if ta, tb := isPromptTuned(a), isPromptTuned(b); ta != tb {
			if ta {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(strings.ToLower(a), strings.ToLower(b)), cmp.Compare(a, b))
	})
}

// isPromptTuned reports whether a name marks a model tuned for writing
// prompts.
func isPromptTuned(name string) bool {
	n := strings.ToLower(name)
	for _, p := range [...]string{"lora", "prompt", "style", "fine", "tune", "enhance", "diffusion"} {
		if strings.Contains(n, p) {
			return true
		}
	}
	return false
}
