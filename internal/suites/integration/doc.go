// Package integration holds vramguard's tests against real Ollama servers
// (two server generations, built from the Go module proxy by
// internal/testkit/ollamatest, with tiny generated models from
// internal/testkit/gguf).
//
// Run them with `make test-integration`. Outside CI they skip, saying how to
// enable them, when no server can be built; with CI=true that is a failure.
// VRAMGUARD_OLLAMA_HOST points them at a running server (a GPU box, say):
// they then register two tiny models there and skip the cases that kill
// runner processes.
package integration
