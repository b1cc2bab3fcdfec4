package vramguard_test

import (
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/readmecheck"
)

// TestExclusiveHandOffInREADME: the README's "An exclusive hand-off"
// shows ExampleOllamaClient_Reserve's body as it is.
func TestExclusiveHandOffInREADME(t *testing.T) {
	readmecheck.Part(t, "README.md", "example_reserve_test.go")
}
