package comfyui_test

import (
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/readmecheck"
)

// TestHandOffInREADME: the README's ComfyUI section shows Example's hand-off
// as it is.
func TestHandOffInREADME(t *testing.T) { readmecheck.Part(t, "../README.md", "example_test.go") }
