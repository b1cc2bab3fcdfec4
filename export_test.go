package vramguard

// This file lends the external tests (package vramguard_test, which use the
// public vramguardtest package and so cannot be in package vramguard) the
// few internals they check.

import (
	"context"

	"github.com/ollama/ollama/api"
)

// Internal constants and functions the external tests compare against.
const (
	UnloadSettle          = unloadSettle
	DefaultUnloadTimeout  = defaultUnloadTimeout
	DefaultEstimateNumCtx = defaultEstimateNumCtx
)

// Internal functions with tests of their own.
var (
	FindRunning       = findRunning
	BlobFromModelfile = blobFromModelfile
)

// SetProcRoot points c's process check at root, a fake /proc.
func SetProcRoot(c *OllamaClient, root string) { c.procRoot = root }

// Users is how many guarded uses of model are running in c.
func Users(c *OllamaClient, model string) int { return c.users(model) }

// InFlight is how many of c's generations on model are in flight.
func InFlight(c *OllamaClient, model string) int {
	n, _ := c.book.inFlight(model, false)
	return n
}

// Host is the base URL c sends to.
func Host(c *OllamaClient) string { return c.host }

// WrapPSList wraps c's /api/ps request; call it before c is used.
func WrapPSList(c *OllamaClient, wrap func(inner func(context.Context) (*api.ProcessResponse, error)) func(context.Context) (*api.ProcessResponse, error)) {
	c.ps.list = wrap(c.ps.list)
}

// InvalidKeepAlive is a KeepAlive no constructor returns.
func InvalidKeepAlive() KeepAlive { return KeepAlive{mode: 9} }
