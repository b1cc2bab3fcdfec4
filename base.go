package vramguard

// The package's shared helpers: names, the closed check, call errors,
// hooks and sleeps.

import (
	"context"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/sleep"
)

// NormalizeModelName returns the name as Ollama lists it in /api/ps:
// lower case, without the default registry ("registry.ollama.ai/") and
// namespace ("library/"), and with ":latest" when no tag is given. So "tiny",
// "library/tiny" and "TINY:latest" all become "tiny:latest", while
// "user/tiny:q4" and "hf.co/org/repo:Q4_K_M" keep their namespace and tag.
func NormalizeModelName(name string) string {
	n := strings.ToLower(strings.TrimSpace(name))
	// Strip the defaults until nothing changes, so that the result is a
	// fixed point: normalizing it again gives it back.
	for prev := ""; n != prev; {
		prev = n
		for _, p := range [...]string{"https://", "http://", "registry.ollama.ai/", "library/"} {
			n = strings.TrimPrefix(n, p)
		}
		if at := strings.IndexByte(n, '@'); at >= 0 { // name@sha256:digest
			n = n[:at]
		}
		n = strings.TrimSpace(n)
	}
	slash := strings.LastIndexByte(n, '/')
	if !strings.Contains(n[slash+1:], ":") && n != "" {
		n += ":latest"
	}
	return n
}

// findRunning returns the /api/ps entry for model, or nil.
func findRunning(ms []api.ProcessModelResponse, model string) *api.ProcessModelResponse {
	want := NormalizeModelName(model)
	for i := range ms {
		if NormalizeModelName(ms[i].Model) == want || NormalizeModelName(ms[i].Name) == want {
			return &ms[i]
		}
	}
	return nil
}

// checkOpen fails with ErrClosed once Close has begun, so that a closed
// client sends nothing.
func (c *OllamaClient) checkOpen(op, model string) error {
	if c.book.isClosed() {
		return newError(op, model, KindUnavailable, ErrClosed)
	}
	return nil
}

// callError wraps the failure of an API call: KindCanceled with the cause
// when ctx is done, else the error's own kind.
func (c *OllamaClient) callError(ctx context.Context, op, model string, err error) error {
	if ctx.Err() != nil {
		return newError(op, model, KindCanceled, context.Cause(ctx))
	}
	return newError(op, model, classify(err), err)
}

// sleepCtx sleeps for d or until ctx is done, returning context.Cause(ctx).
func sleepCtx(ctx context.Context, d time.Duration) error { return sleep.Ctx(ctx, d) }

// numCtxOf is the num_ctx a request's options ask for; 0 for the
// server's default.
func numCtxOf(options map[string]any) int {
	if n, ok := optionInt(options["num_ctx"]); ok && n > 0 {
		return n
	}
	return 0
}
